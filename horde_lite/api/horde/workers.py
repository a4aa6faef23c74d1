"""/workers: the public worker records; PUT for maintenance (owner, moderator) and pause (moderator)."""

from __future__ import annotations

from typing import Any

from litestar import Request, get, put
from litestar.params import FromPath
from sqlalchemy import select

from horde_lite.api.common import apikey_of, decode, horde_of, transaction
from horde_lite.db.models import Worker
from horde_lite.lifecycle.eligibility import worker_online
from horde_lite.lifecycle.inputs import WorkerUpdate
from horde_lite.lifecycle.users import authenticate_user
from horde_lite.lifecycle.workers import get_worker, update_worker, worker_view

Req = Request[Any, Any, Any]


@get("/workers")
async def list_workers(request: Req) -> list[dict[str, Any]]:
    horde = horde_of(request)
    now = horde.clock.now()
    async with transaction(horde) as session:
        rows = await session.execute(
            select(Worker).where(worker_online(Worker, horde.rules(now))).order_by(Worker.name)
        )
        return [worker_view(w, horde.settings, now) for w in rows.scalars()]


@get("/workers/{worker_id:str}")
async def show_worker(request: Req, worker_id: FromPath[str]) -> dict[str, Any]:
    horde = horde_of(request)
    async with transaction(horde) as session:
        return worker_view(await get_worker(session, worker_id), horde.settings, horde.clock.now())


@put("/workers/{worker_id:str}")
async def change_worker(request: Req, worker_id: FromPath[str]) -> dict[str, Any]:
    horde = horde_of(request)
    body = await decode(request, WorkerUpdate)
    async with transaction(horde) as session:
        actor = await authenticate_user(session, apikey_of(request), horde.clock.now())
        worker = await update_worker(session, actor, worker_id, body)
        return {
            "maintenance": worker.maintenance,
            "paused": worker.paused,
            "maintenance_msg": worker.maintenance_msg,
        }


HANDLERS = [list_workers, show_worker, change_worker]
