"""/filters: the prompt filters, for moderators only (upstream's Filters, FilterRegex and
FilterSingle). The rules: horde_lite/filters (store.py for the records, screen.py for what a
filter does to a request)."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, delete, get, patch, post, put
from litestar.params import FromPath, JSONBody, Parameter

from horde_lite.api.deps import HordeDep
from horde_lite.api.guards import OPERATOR_ACTIONS, moderator_guard, viewer_of
from horde_lite.api.horde.schemas import (
    FilterCheckInput,
    FilterDetails,
    FilterInput,
    FilterMatch,
    FilterPatch,
    FilterPromptSuspicion,
    FilterRegex,
    SimpleResponse,
)
from horde_lite.filters import screen, store

# A moderator's own key, whatever `[http] open_operator_pages` says: filters hold the horde's patterns.
MODERATORS: dict[str, Any] = {"guards": [moderator_guard], "opt": {"door": OPERATOR_ACTIONS}}
QueryType = Annotated[int | None, Parameter(ge=-(2**63), le=2**63 - 1)]
Contains = Annotated[str | None, Parameter(max_length=1000)]


def details(found: store.FilterRecord) -> FilterDetails:
    return FilterDetails(
        id=str(found.id), regex=found.regex, filter_type=found.filter_type, description=found.description,
        replacement=found.replacement, user=found.user, action=found.action.value,
    )  # fmt: skip


def _moderator(request: Request[Any, Any, Any]) -> int:
    found = viewer_of(request).user_id
    assert found is not None  # the door is shut on open pages: a moderator's key opened it
    return found


@get("/filters", **MODERATORS)
async def list_filters(
    horde: HordeDep, filter_type: QueryType = None, contains: Contains = None
) -> list[FilterDetails]:
    """Every filter, or those of one type and holding `contains` in their regex or description."""
    return [details(f) for f in await store.listing(horde, filter_type, contains)]


@put("/filters", status_code=200, **MODERATORS)
async def create_filter(
    request: Request[Any, Any, Any], data: JSONBody[FilterInput], horde: HordeDep
) -> FilterDetails:
    """A new filter; the one that already has this regex and type when there is one (as upstream)."""
    return details(await store.create(horde, _moderator(request), data))


@post("/filters", status_code=200, **MODERATORS)
async def check_prompt(data: JSONBody[FilterCheckInput], horde: HordeDep) -> FilterPromptSuspicion:
    """How the filters in force judge a prompt (nothing is stored)."""
    found = await screen.inspect_prompt(horde, data.prompt, data.filter_type)
    return FilterPromptSuspicion(
        suspicion=str(found.suspicion),
        matches=[h.match for h in found.hits if h.match is not None],
        filters=[
            FilterMatch(id=str(h.filter.id), filter_type=h.filter.filter_type, action=h.filter.action.value,
                        match=h.match, timed_out=h.timed_out)
            for h in found.hits
        ],
    )  # fmt: skip


@get("/filters/regex", **MODERATORS)
async def combined_regex(horde: HordeDep, filter_type: QueryType = None) -> list[FilterRegex]:
    return [FilterRegex(filter_type=t, regex=r) for t, r in await store.combined(horde, filter_type)]


@get("/filters/{filter_id:str}", **MODERATORS)
async def show_filter(horde: HordeDep, filter_id: FromPath[str]) -> FilterDetails:
    return details(await store.show(horde, filter_id))


@patch("/filters/{filter_id:str}", **MODERATORS)
async def change_filter(
    request: Request[Any, Any, Any], data: JSONBody[FilterPatch], horde: HordeDep, filter_id: FromPath[str]
) -> FilterDetails:
    return details(await store.change(horde, _moderator(request), filter_id, data))


@delete("/filters/{filter_id:str}", status_code=200, **MODERATORS)
async def delete_filter(horde: HordeDep, filter_id: FromPath[str]) -> SimpleResponse:
    await store.remove(horde, filter_id)
    return SimpleResponse(message="OK")


HANDLERS = [
    list_filters, create_filter, check_prompt, combined_regex, show_filter, change_filter, delete_filter,
]  # fmt: skip
