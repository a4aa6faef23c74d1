"""What the horde serves: per-model worker counts, speed and queue (GET /status/models, /v1/models)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.accounts.users import authenticate
from horde_lite.core.context import Caller, Horde
from horde_lite.db.models import RequestModel, TextRequest, Worker, WorkerModel
from horde_lite.queue.eligibility import request_offered, worker_online, worker_speed


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """One served model (upstream's ActiveModel): online workers, their mean speed (tokens/s), the
    tokens and jobs waiting for it and the seconds those would take at the model's total speed."""

    name: str
    count: int
    performance: float
    queued: int
    jobs: int
    eta: int


async def model_status(horde: Horde, *, kind: str = "text", name: str | None = None) -> list[ModelStatus]:
    """GET /status/models (`kind` text or all; horde_lite serves no other) and, with `name`, GET
    /status/models/{name}: that model's record in a list, empty when no worker serves it."""
    if kind not in ("text", "all") or (name is not None and (len(name) > 255 or "\x00" in name)):
        return []  # no such model (and nothing a column could hold)
    async with horde.reading() as session:
        return await text_models(session, horde, name=name)


async def text_models(session: AsyncSession, horde: Horde, *, name: str | None = None) -> list[ModelStatus]:
    now = horde.clock.now()
    rules = horde.rules(now)
    query = (
        select(WorkerModel.model, func.count(Worker.id), func.sum(worker_speed(Worker, rules)))
        .join(Worker, Worker.id == WorkerModel.worker_id)
        .where(worker_online(Worker, rules), Worker.paused.is_(False), Worker.maintenance.is_(False))
        .where(Worker.deleted_at.is_(None))
        .group_by(WorkerModel.model)
    )
    if name is not None:
        query = query.where(WorkerModel.model == name)
    served = (await session.execute(query)).all()
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
            ModelStatus(
                name=model,
                count=int(count),
                performance=round(speed / max(int(count), 1), 2),
                queued=tokens,
                jobs=jobs,
                eta=int(tokens / speed) if speed > 0 else 0,
            )
        )
    return sorted(out, key=lambda m: m.name)


async def list_chat_models(horde: Horde, caller: Caller) -> list[tuple[str, float]]:
    """GET /v1/models. A key is optional, but a wrong one is a 401 here too, so a client's "check
    connection" tells the truth."""
    async with horde.transaction() as session:
        if caller.apikey:
            await authenticate(session, caller.apikey, horde.clock.now())
        return await chat_models(session, horde)


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
