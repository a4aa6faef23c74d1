"""/workers: the public worker records; PUT (maintenance, info, rename, team: owner or moderator;
pause: moderator) and DELETE (owner or moderator)."""

from __future__ import annotations

from litestar import delete, get, put
from litestar.params import FromPath, FromQuery, JSONBody

from horde_lite.accounts import workers
from horde_lite.api.deps import CallerDep, HordeDep
from horde_lite.api.horde.schemas import (
    DeletedWorker,
    ModifyWorker,
    TeamDetailsLite,
    WorkerChat,
    WorkerDetails,
    WorkerKudosDetails,
    WorkerUpdate,
)


def worker_details(found: workers.WorkerRecord) -> WorkerDetails:
    w = found.worker
    chat = None
    if w.chat_max_completion_tokens is not None:
        chat = WorkerChat(
            max_completion_tokens=w.chat_max_completion_tokens,
            max_context_tokens=w.chat_max_context_tokens,
            features=list(w.chat_features),
            image_transports=list(w.chat_image_transports),
        )
    return WorkerDetails(
        type="text", name=w.name, id=w.id, online=found.online, models=list(w.models),
        max_length=w.max_length, max_context_length=w.max_context_length, threads=w.threads,
        bridge_agent=w.bridge_agent, nsfw=w.nsfw, trusted=w.trusted, flagged=found.owner_flagged,
        maintenance_mode=w.maintenance, paused=w.paused, info=w.info or None,
        performance=f"{found.speed:.1f} tokens per second", requests_fulfilled=w.completed_jobs,
        kudos_rewards=round(w.kudos_earned, 2),
        kudos_details=WorkerKudosDetails(generated=round(w.kudos_earned, 2)),
        tokens_generated=w.tokens_generated, uncompleted_jobs=w.aborted_jobs + w.faulted_jobs,
        uptime=int(max(0.0, w.last_check_in - w.created_at)),
        team=TeamDetailsLite(name=found.team_name, id=w.team_id if found.team_name is not None else None),
        chat=chat, lease_speed=w.lease_speed,
        speed_measured=w.lease_speed is not None, assumed_speed=found.assumed_speed, capacity=w.capacity,
        aborted_jobs=w.aborted_jobs, faulted_jobs=w.faulted_jobs,
    )  # fmt: skip


@get("/workers")
async def list_workers(
    horde: HordeDep, name: FromQuery[str | None] = None, type: FromQuery[str | None] = None
) -> list[WorkerDetails]:
    """The online workers; `name` picks one by name (case and Unicode form aside), `type` text/all."""
    return [worker_details(w) for w in await workers.list_workers(horde, name=name, kind=type)]


@get("/workers/{worker_id:str}")
async def show_worker(horde: HordeDep, worker_id: FromPath[str]) -> WorkerDetails:
    return worker_details(await workers.worker_by_id(horde, worker_id))


@get("/workers/name/{worker_name:str}")
async def show_worker_by_name(horde: HordeDep, worker_name: FromPath[str]) -> WorkerDetails:
    return worker_details(await workers.worker_by_name(horde, worker_name))


@put("/workers/{worker_id:str}")
async def change_worker(
    data: JSONBody[WorkerUpdate],
    horde: HordeDep,
    caller: CallerDep,
    worker_id: FromPath[str],
) -> ModifyWorker:
    found = await workers.modify_worker(horde, caller, worker_id, data)
    changed = {k: getattr(found, k) for k in ("maintenance", "paused", "info", "name", "team")}
    return ModifyWorker(**{k: v for k, v in changed.items() if v is not None})


@delete("/workers/{worker_id:str}", status_code=200)
async def delete_worker(horde: HordeDep, caller: CallerDep, worker_id: FromPath[str]) -> DeletedWorker:
    found = await workers.delete_worker(horde, caller, worker_id)
    return DeletedWorker(deleted_id=found.id, deleted_name=found.name)


HANDLERS = [list_workers, show_worker, show_worker_by_name, change_worker, delete_worker]
