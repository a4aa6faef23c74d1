"""The status of a request (what the horde-sdk polls) and its cancellation."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.db.models import Generation, TextRequest, Worker
from horde_lite.lifecycle.context import Horde
from horde_lite.lifecycle.errors import HordeError
from horde_lite.lifecycle.estimate import estimate
from horde_lite.lifecycle.lease import lapse_expired
from horde_lite.lifecycle.settlement import maybe_finish

FINISHED = ("ok", "censored")


async def get_request(session: AsyncSession, request_id: str, *, lock: bool = False) -> TextRequest:
    query = select(TextRequest).where(TextRequest.id == request_id)
    if lock:
        query = query.with_for_update()
    request = (await session.execute(query)).scalar_one_or_none()
    if request is None:
        raise HordeError("RequestNotFound", f"No request with id {request_id} (it may have expired).")
    return request


async def status(session: AsyncSession, horde: Horde, request_id: str) -> dict[str, Any]:
    now = horde.clock.now()
    request = await get_request(session, request_id)
    # Lapses are honoured by this read even between two sweeps.
    if await lapse_expired(session, horde, now, request_id):
        await session.refresh(request)
    rows = (
        await session.execute(
            select(Generation, Worker.name)
            .join(Worker, Worker.id == Generation.worker_id)
            .where(Generation.request_id == request_id, Generation.fake.is_(False))
            .order_by(Generation.submitted_at)
        )
    ).all()
    finished = [(g, name) for g, name in rows if g.state in FINISHED]
    processing = sum(1 for g, _ in rows if g.state == "processing")
    waiting = request.n_remaining if request.state == "waiting" else 0
    est = await estimate(session, request_id, horde.rules(now)) if waiting else None
    faulted = request.state == "faulted"
    done = processing == 0 and waiting == 0 and request.state in ("done", "cancelled")
    return {
        "finished": len(finished),
        "processing": processing,
        "restarted": request.restarts,
        "waiting": waiting,
        "done": done,
        "faulted": faulted,
        "wait_time": est.wait_time if est else 0,
        "queue_position": (1 + est.competing_requests) if est else 0,
        "kudos": round(request.kudos_spent, 2),
        "is_possible": processing > 0 or waiting == 0 or (est is not None and est.eligible_workers > 0),
        "generations": [_generation_view(g, name) for g, name in finished],
    }


def _generation_view(g: Generation, worker_name: str) -> dict[str, Any]:
    view: dict[str, Any] = {
        "text": g.text or "",
        "model": g.model,
        "state": g.state,
        "worker_id": g.worker_id,
        "worker_name": worker_name,
    }
    if g.seed is not None:
        view["seed"] = int(g.seed) if g.seed.lstrip("-").isdigit() else g.seed
    if g.gen_metadata:
        view["gen_metadata"] = g.gen_metadata
    if g.chat_result:  # a chat job: the submitted message (tool calls included), finish_reason, usage
        view["chat"] = g.chat_result
    return view


async def cancel(session: AsyncSession, horde: Horde, request_id: str) -> None:
    """Hand out nothing more; running jobs finish (and are paid); the hold's rest is released then."""
    request = await get_request(session, request_id, lock=True)
    if request.state == "waiting":
        request.state = "cancelled"
        request.n_remaining = 0
        await session.execute(
            Generation.__table__.update()
            .where(Generation.request_id == request_id, Generation.state == "processing")
            .values(cancel_requested=True)
        )
    await maybe_finish(session, request)
    await session.flush()
    horde.notifier.on_commit(session, request_id)
