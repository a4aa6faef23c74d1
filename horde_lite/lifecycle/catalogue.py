"""What the horde serves: per-model worker counts, speed and queue (GET /status/models, /v1/models)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.db.models import RequestModel, TextRequest, Worker, WorkerModel
from horde_lite.lifecycle.context import Horde
from horde_lite.lifecycle.eligibility import request_offered, worker_online, worker_speed


async def text_models(session: AsyncSession, horde: Horde) -> list[dict[str, Any]]:
    now = horde.clock.now()
    rules = horde.rules(now)
    served = (
        await session.execute(
            select(WorkerModel.model, func.count(Worker.id), func.sum(worker_speed(Worker, rules)))
            .join(Worker, Worker.id == WorkerModel.worker_id)
            .where(worker_online(Worker, rules), Worker.paused.is_(False), Worker.maintenance.is_(False))
            .group_by(WorkerModel.model)
        )
    ).all()
    queued = {
        model: (int(tokens or 0), int(jobs or 0))
        for model, tokens, jobs in (
            await session.execute(
                select(
                    RequestModel.model,
                    func.sum(TextRequest.max_length * TextRequest.n_remaining),
                    func.sum(TextRequest.n_remaining),
                )
                .join(TextRequest, TextRequest.id == RequestModel.request_id)
                .where(*request_offered(TextRequest, now))
                .group_by(RequestModel.model)
            )
        ).all()
    }
    out = []
    for model, count, speed in served:
        tokens, jobs = queued.get(model, (0, 0))
        speed = float(speed or 0.0)
        out.append(
            {
                "name": model,
                "count": int(count),
                "performance": round(speed / max(int(count), 1), 2),
                "queued": tokens,
                "jobs": jobs,
                "eta": int(tokens / speed) if speed > 0 else 0,
                "type": "text",
            }
        )
    return sorted(out, key=lambda m: m["name"])


async def chat_models(session: AsyncSession, horde: Horde) -> list[tuple[str, float]]:
    """Models served by at least one online chat worker, with the first check-in that served them."""
    rules = horde.rules(horde.clock.now())
    rows = (
        await session.execute(
            select(WorkerModel.model, func.min(Worker.created_at))
            .join(Worker, Worker.id == WorkerModel.worker_id)
            .where(
                worker_online(Worker, rules),
                Worker.paused.is_(False),
                Worker.maintenance.is_(False),
                Worker.chat_max_completion_tokens.is_not(None),
            )
            .group_by(WorkerModel.model)
            .order_by(WorkerModel.model)
        )
    ).all()
    return [(model, float(created)) for model, created in rows]
