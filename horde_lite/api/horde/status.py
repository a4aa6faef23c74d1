"""/status/*: heartbeat, models, performance, modes and news."""

from __future__ import annotations

from litestar import get
from litestar.params import FromPath, FromQuery

import horde_lite
from horde_lite.api.deps import CallerDep, HordeDep
from horde_lite.api.horde.schemas import ActiveModel, Heartbeat, HordeModes, HordePerformance, Newspiece
from horde_lite.operators import catalogue, stats


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
    found = await stats.modes(horde, caller)
    if found.raid_mode is None:
        return HordeModes(maintenance_mode=found.maintenance_mode, invite_only_mode=found.invite_only_mode)
    return HordeModes(
        maintenance_mode=found.maintenance_mode,
        invite_only_mode=found.invite_only_mode,
        raid_mode=found.raid_mode,
    )


@get("/status/news")
async def news() -> list[Newspiece]:
    """horde_lite publishes no news: always an empty list."""
    return []


HANDLERS = [status_models, status_model, heartbeat, performance, modes, news]
