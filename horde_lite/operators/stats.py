"""The horde's figures: GET /status/performance, /stats/text/totals, /stats/text/models.

Upstream keeps a statistics table; horde_lite reads its usage history (operators/usage.py), kept by
clock hour after requests expire. A window of an hour or more counts the whole clock hours (UTC)
that began within it: the current hour so far and the ones before it, so a day is between 23 and
24 hours back. The past minute, shorter than an hour, is counted from the finished jobs the horde
still holds (every job stays at least five minutes after its submit); the all-time `total` of
/stats/text/totals comes from the workers' own counters, which are never removed and include what
was settled before the history began (docs/reference/usage.md). A finished job is a generation in
state ok or censored (fake jobs of paused workers never count).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.core.context import Horde
from horde_lite.db.models import Generation, TextRequest, Worker
from horde_lite.operators import usage
from horde_lite.queue.eligibility import worker_online

# Upstream's periods, in seconds (a month is 30 days).
PERIODS = {"minute": 60.0, "hour": 3600.0, "day": 86400.0, "month": 30 * 86400.0}


@dataclass(frozen=True, slots=True)
class Performance:
    """The text half of upstream's HordePerformance (the face fills the image fields with zeros)."""

    queued_text_requests: int  # waiting or running
    queued_tokens: int  # max_length of every job not yet finished
    text_worker_count: int  # online workers
    text_thread_count: int
    past_minute_tokens: int


@dataclass(frozen=True, slots=True)
class PeriodTotal:
    requests: int  # finished jobs
    tokens: int


def _finished(since: float | None = None) -> list[ColumnElement[bool]]:
    where = [Generation.state.in_(("ok", "censored")), Generation.fake.is_(False)]
    if since is not None:
        where.append(Generation.submitted_at >= since)
    return where


def _online(horde: Horde, now: float) -> list[ColumnElement[bool]]:
    return [worker_online(Worker, horde.rules(now)), Worker.deleted_at.is_(None)]


async def performance(horde: Horde) -> Performance:
    now = horde.clock.now()
    queued = (TextRequest.state == "waiting", TextRequest.expires_at > now)
    async with horde.reading() as session:
        requests, waiting_tokens = (
            await session.execute(
                select(
                    func.count(TextRequest.id),
                    func.coalesce(func.sum(TextRequest.max_length * TextRequest.n_remaining), 0),
                ).where(*queued)
            )
        ).one()
        running_tokens = (
            await session.execute(
                select(func.coalesce(func.sum(TextRequest.max_length), 0))
                .select_from(Generation)
                .join(TextRequest, TextRequest.id == Generation.request_id)
                .where(Generation.state == "processing", Generation.fake.is_(False), *queued)
            )
        ).scalar_one()
        workers, threads = (
            await session.execute(
                select(func.count(Worker.id), func.coalesce(func.sum(Worker.threads), 0)).where(
                    *_online(horde, now)
                )
            )
        ).one()
        past_minute = await _tokens_since(session, now - PERIODS["minute"])
    return Performance(
        queued_text_requests=int(requests),
        queued_tokens=int(waiting_tokens) + int(running_tokens),
        text_worker_count=int(workers),
        text_thread_count=int(threads),
        past_minute_tokens=past_minute,
    )


async def _tokens_since(session: AsyncSession, since: float) -> int:
    query = select(func.coalesce(func.sum(Generation.tokens), 0)).where(*_finished(since))
    return int((await session.execute(query)).scalar_one())


async def text_totals(horde: Horde) -> dict[str, PeriodTotal]:
    """Finished jobs and their tokens in the past minute, hour, day and month, and in all time."""
    now = horde.clock.now()
    out: dict[str, PeriodTotal] = {}
    async with horde.reading() as session:
        requests, tokens = (
            await session.execute(
                select(func.count(Generation.id), func.coalesce(func.sum(Generation.tokens), 0)).where(
                    *_finished(now - PERIODS["minute"])
                )
            )
        ).one()
        out["minute"] = PeriodTotal(requests=int(requests), tokens=int(tokens))
        for period in ("hour", "day", "month"):
            kept = await usage.window_totals(session, now - PERIODS[period])
            out[period] = PeriodTotal(requests=kept.jobs, tokens=kept.tokens)
        jobs, tokens = (
            await session.execute(
                select(
                    func.coalesce(func.sum(Worker.completed_jobs), 0),
                    func.coalesce(func.sum(Worker.tokens_generated), 0),
                )
            )
        ).one()
    out["total"] = PeriodTotal(requests=int(jobs), tokens=int(tokens))
    return out


async def text_model_totals(horde: Horde) -> dict[str, dict[str, int]]:
    """Finished jobs per model in the past day, the past month, and all the history kept."""
    now = horde.clock.now()
    async with horde.reading() as session:
        return {
            "day": await usage.model_jobs(session, now - PERIODS["day"]),
            "month": await usage.model_jobs(session, now - PERIODS["month"]),
            "total": await usage.model_jobs(session, None),
        }
