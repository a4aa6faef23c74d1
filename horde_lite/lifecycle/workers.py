"""Workers: check-in (every pop), measured lease speed and capacity, maintenance and pause."""

from __future__ import annotations

import math
import uuid

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.db.models import User, Worker, WorkerModel
from horde_lite.lifecycle.errors import HordeError
from horde_lite.lifecycle.inputs import PopInput, WorkerUpdate
from horde_lite.settings import Settings


def effective_speed(lease_speed: float | None, settings: Settings) -> float:
    """The measured lease speed, or the assumed one while the worker is unmeasured."""
    return settings.speed.assumed_tokens_per_second if lease_speed is None else lease_speed


def capacity_for(lease_speed: float | None, settings: Settings) -> int:
    """floor(speed x (base lease - preparation allowance))."""
    return math.floor(effective_speed(lease_speed, settings) * settings.lease.generation_window_seconds)


def record_speed_sample(worker: Worker, tokens: int, seconds: float, settings: Settings) -> float:
    """Add one tokens-per-second-of-lease sample; the stored speed is the mean of the newest ones."""
    sample = tokens / max(seconds, 1e-3)
    samples = [*list(worker.speed_samples or []), round(sample, 4)][-settings.speed.samples :]
    worker.speed_samples = samples
    worker.lease_speed = sum(samples) / len(samples)
    worker.capacity = capacity_for(worker.lease_speed, settings)
    return sample


async def _priority_user_ids(session: AsyncSession, names: list[str]) -> list[int]:
    """Resolve `priority_usernames` in one query (this runs on every pop). "name#id" must name the
    user with that id, as the CLI's lookup does; a bare name matches by name."""
    wanted: list[tuple[str, int | None]] = []
    for name in names[:50]:
        base, _, uid = name.partition("#")
        if uid.isdigit() and int(uid) >= 2**31:
            continue  # no such user (and beyond the id column's range)
        wanted.append((base, int(uid) if uid.isdigit() else None))
    if not wanted:
        return []
    rows = await session.execute(
        select(User.id, User.username).where(User.username.in_({base for base, _ in wanted}))
    )
    by_name = {username: user_id for user_id, username in rows}
    ids: list[int] = []
    for base, uid in wanted:
        found = by_name.get(base)
        if found is not None and uid in (None, found) and found not in ids:
            ids.append(found)
    return ids


async def check_in(
    session: AsyncSession, owner: User, body: PopInput, settings: Settings, now: float
) -> Worker:
    """Create the worker on its first pop, else store its new declarations. Raises for a name
    owned by someone else, and for the anonymous user."""
    if owner.anonymous:
        raise HordeError("AnonForbiddenWorker", "Anonymous users cannot run workers; register a key.")
    # The row lock serializes concurrent check-ins of one worker (a worker's threads pop at once),
    # so their model lists never race.
    by_name = select(Worker).where(Worker.name == body.name).with_for_update()
    worker = (await session.execute(by_name)).scalar_one_or_none()
    if worker is None:
        try:
            async with session.begin_nested():
                worker = Worker(
                    id=str(uuid.uuid4()), name=body.name, owner_id=owner.id, created_at=now,
                    last_check_in=now, speed_samples=[],
                )  # fmt: skip
                session.add(worker)
                await session.flush()
        except IntegrityError:  # another pop created this worker first (PostgreSQL)
            worker = (await session.execute(by_name)).scalar_one()
    if worker.owner_id != owner.id:
        raise HordeError("WrongCredentials", f"The worker name {body.name!r} belongs to another user.")
    models = list(dict.fromkeys(m.strip() for m in body.models if m.strip()))[:100]
    worker.trusted = owner.trusted
    worker.max_length = body.max_length
    worker.max_context_length = body.max_context_length
    worker.threads = body.threads
    worker.bridge_agent = body.bridge_agent[:255]
    worker.nsfw = body.nsfw
    worker.priority_user_ids = await _priority_user_ids(session, body.priority_usernames)
    chat = body.chat
    worker.chat_max_completion_tokens = chat.max_completion_tokens if chat else None
    worker.chat_max_context_tokens = chat.max_context_tokens if chat else None
    worker.chat_features = sorted(set(chat.features)) if chat else []
    worker.chat_image_transports = sorted(set(chat.image_transports)) if chat else []
    worker.last_check_in = now
    worker.capacity = capacity_for(worker.lease_speed, settings)
    if worker.models != models:
        worker.models = models
        await session.flush()
        await session.execute(delete(WorkerModel).where(WorkerModel.worker_id == worker.id))
        session.add_all(WorkerModel(worker_id=worker.id, model=m) for m in models)
    await session.flush()
    return worker


async def get_worker(session: AsyncSession, worker_id: str) -> Worker:
    worker = await session.get(Worker, worker_id)
    if worker is None:
        raise HordeError("WorkerNotFound", f"No worker with id {worker_id}.")
    return worker


async def update_worker(session: AsyncSession, actor: User, worker_id: str, body: WorkerUpdate) -> Worker:
    """Maintenance: the owner or a moderator. Paused: moderators only."""
    worker = await get_worker(session, worker_id)
    is_owner = worker.owner_id == actor.id
    if body.maintenance is not None or body.maintenance_msg is not None:
        if not (is_owner or actor.moderator):
            raise HordeError(
                "WrongCredentials", "Only the worker's owner or a moderator can set maintenance."
            )
        if body.maintenance is not None:
            worker.maintenance = body.maintenance
        if body.maintenance_msg is not None:
            worker.maintenance_msg = body.maintenance_msg[:255]
    if body.paused is not None:
        if not actor.moderator:
            raise HordeError("NotModerator", "Only a moderator can pause a worker.")
        worker.paused = body.paused
    await session.flush()
    return worker


def worker_view(worker: Worker, settings: Settings, now: float) -> dict[str, object]:
    """The public record of a worker (GET /api/v2/workers)."""
    online = worker.last_check_in >= now - settings.worker.online_seconds
    chat = None
    if worker.chat_max_completion_tokens is not None:
        chat = {
            "max_completion_tokens": worker.chat_max_completion_tokens,
            "max_context_tokens": worker.chat_max_context_tokens,
            "features": worker.chat_features,
            "image_transports": worker.chat_image_transports,
        }
    speed = worker.lease_speed
    shown = effective_speed(speed, settings)
    return {
        "type": "text",
        "name": worker.name,
        "id": worker.id,
        "online": online,
        "models": worker.models,
        "max_length": worker.max_length,
        "max_context_length": worker.max_context_length,
        "threads": worker.threads,
        "bridge_agent": worker.bridge_agent,
        "nsfw": worker.nsfw,
        "trusted": worker.trusted,
        "maintenance_mode": worker.maintenance,
        "paused": worker.paused,
        "chat": chat,
        # Lease speed in tokens per second of lease; unmeasured workers show the assumed speed.
        "performance": f"{shown:.1f} tokens per second",
        "lease_speed": speed,
        "speed_measured": speed is not None,
        "assumed_speed": settings.speed.assumed_tokens_per_second,
        "capacity": worker.capacity,
        "requests_fulfilled": worker.completed_jobs,
        "kudos_rewards": round(worker.kudos_earned, 2),
        "tokens_generated": worker.tokens_generated,
        "uncompleted_jobs": worker.aborted_jobs + worker.faulted_jobs,
        "aborted_jobs": worker.aborted_jobs,
        "faulted_jobs": worker.faulted_jobs,
        "uptime": int(max(0.0, worker.last_check_in - worker.created_at)),
    }
