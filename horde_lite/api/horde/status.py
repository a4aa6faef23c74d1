"""/status/*: heartbeat, models, performance, modes and news."""

from __future__ import annotations

from litestar import get, put
from litestar.params import FromPath, FromQuery, JSONBody
from msgspec import UNSET

import horde_lite
from horde_lite.api.deps import CallerDep, HordeDep
from horde_lite.api.horde.schemas import (
    ActiveModel,
    Heartbeat,
    HordeModes,
    HordeModesInput,
    HordeModesSet,
    HordePerformance,
    Newspiece,
)
from horde_lite.operators import catalogue, mode_rights, stats
from horde_lite.operators.horde_modes import Mode


def active_models(found: list[catalogue.ModelStatus]) -> list[ActiveModel]:
    return [
        ActiveModel(
            name=m.name, count=m.count, performance=m.performance, queued=m.queued, jobs=m.jobs, eta=m.eta
        )
        for m in found
    ]


@get("/status/models")
async def status_models(horde: HordeDep, type: FromQuery[str] = "text") -> list[ActiveModel]:
    """The models online workers serve (`type` text or all; any other type is an empty list)."""
    return active_models(await catalogue.model_status(horde, kind=type))


@get("/status/models/{model_name:path}")
async def status_model(horde: HordeDep, model_name: FromPath[str]) -> list[ActiveModel]:
    """One model's record in a list (empty when no online worker serves it), as upstream."""
    return active_models(await catalogue.model_status(horde, name=model_name.lstrip("/")))


@get("/status/heartbeat")
async def heartbeat() -> Heartbeat:
    return Heartbeat(message="OK", version=horde_lite.__version__)


@get("/status/performance")
async def performance(horde: HordeDep) -> HordePerformance:
    found = await stats.performance(horde)
    return HordePerformance(
        queued_text_requests=found.queued_text_requests,
        queued_tokens=found.queued_tokens,
        text_worker_count=found.text_worker_count,
        text_thread_count=found.text_thread_count,
        past_minute_tokens=found.past_minute_tokens,
    )


@get("/status/modes")
async def modes(horde: HordeDep, caller: CallerDep) -> HordeModes:
    """Maintenance and invite-only mode; with a moderator's key raid mode too (any other key is
    refused, as upstream)."""
    found = await mode_rights.shown(horde, caller)
    return HordeModes(
        maintenance_mode=found.maintenance_mode,
        invite_only_mode=found.invite_only_mode,
        raid_mode=UNSET if found.raid_mode is None else found.raid_mode,
    )


@put("/status/modes")
async def change_modes(data: JSONBody[HordeModesInput], horde: HordeDep, caller: CallerDep) -> HordeModesSet:
    """Switch the modes sent, for every server process: maintenance by an admin (`[moderation]
    admins`), invite-only and raid by a moderator."""
    sent: dict[Mode, bool | None] = {
        "maintenance": data.maintenance_mode,
        "invite_only": data.invite_only_mode,
        "raid": data.raid_mode,
    }
    changes = {mode: on for mode, on in sent.items() if on is not None}
    now = await mode_rights.change(horde, caller, changes, "api")
    return HordeModesSet(**{f"{mode}_mode": getattr(now, mode) for mode in changes})


@get("/status/news")
async def news() -> list[Newspiece]:
    """horde_lite publishes no news: always an empty list."""
    return []


HANDLERS = [status_models, status_model, heartbeat, performance, modes, change_modes, news]
