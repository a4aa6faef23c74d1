"""The filters panel's actions: add a filter, delete one (docs/reference/dashboard.md). Each is a
form post from the dashboard's own page (`same_origin`), behind the actions' door (shut on open
pages), calling the entry points the horde API's /filters routes call (filters/store.py) as the
signed-in moderator, and answered with a page saying what was done or refused."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Router, post
from litestar.params import FromPath
from litestar.response import Template

from horde_lite.api.deps import HordeDep
from horde_lite.api.guards import viewer_of
from horde_lite.core.errors import HordeError
from horde_lite.dashboard.routes import ACTED, PATH, action_page, same_origin
from horde_lite.filters import store
from horde_lite.inputs import FilterInput

FIELDS = ("regex", "filter_type", "description", "replacement")


def _done(message: str, status: int = 200) -> Template:
    return action_page(message, status=status, panel="filters")


@post("/", **ACTED)
async def add_filter(request: Request[Any, Any, Any], horde: HordeDep) -> Template:
    if not same_origin(request):
        return _done("A new filter must come from this site's own dashboard.", 403)
    form = await request.form()
    # As typed: spaces at either end of a pattern or a replacement are part of it. An empty box is
    # a field not sent.
    sent = {k: str(form[k]) for k in FIELDS if str(form.get(k) or "")}
    try:
        body = msgspec.convert(sent, FilterInput, strict=False)
        made = await store.create(horde, viewer_of(request).user_id or 0, body)
    except msgspec.ValidationError as exc:
        return _done(f"Nothing was added: {exc}.", 400)
    except HordeError as exc:
        return _done(exc.message, exc.rc.status)
    return _done(f"Filter {made.id} ({made.action}, type {made.filter_type}) is in force.")


@post("/{filter_id:str}/delete", **ACTED)
async def delete_filter(
    request: Request[Any, Any, Any], horde: HordeDep, filter_id: FromPath[str]
) -> Template:
    if not same_origin(request):
        return _done("A deletion must come from this site's own dashboard.", 403)
    try:
        await store.remove(horde, filter_id)
    except HordeError as exc:
        return _done(exc.message, exc.rc.status)
    return _done(f"Filter {filter_id} is deleted.")


router = Router(path=f"{PATH}/filters", route_handlers=[add_filter, delete_filter], include_in_schema=False)
