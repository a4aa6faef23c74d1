"""The wait estimate (record 0040, behaviour.md §6), read by admission and the status route.

Eligible workers of R: online workers passing the eligibility check for R. Competing work: the
queued output of requests ahead of R that at least one of them could take. Estimated wait:
competing work / the eligible workers' combined lease speed.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, exists, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from horde_lite.db.models import TextRequest, Worker
from horde_lite.lifecycle.eligibility import Rules, eligibility_clauses, request_offered, worker_speed


@dataclass(frozen=True, slots=True)
class Estimate:
    eligible_workers: int
    eligible_threads: int
    eligible_speed: float  # tokens per second, unmeasured workers at the assumed speed
    competing_work: int  # tokens
    competing_jobs: int
    competing_requests: int
    own_remaining: int  # R's own queued output (max_length x n_remaining)

    @property
    def estimated_wait(self) -> float | None:
        """Seconds until R starts; None when no worker is eligible (unknown)."""
        if self.eligible_workers == 0 or self.eligible_speed <= 0:
            return None
        return self.competing_work / self.eligible_speed

    @property
    def wait_time(self) -> int:
        """The status route's figure: R's own output included, 0 when unknown."""
        if self.eligible_workers == 0 or self.eligible_speed <= 0:
            return 0
        return int((self.competing_work + self.own_remaining) / self.eligible_speed)


async def estimate(session: AsyncSession, request_id: str, rules: Rules) -> Estimate:
    r = aliased(TextRequest, name="r")
    w = aliased(Worker, name="w")
    eligible = (
        select(
            func.count(w.id),
            func.coalesce(func.sum(w.threads), 0),
            func.coalesce(func.sum(worker_speed(w, rules)), 0.0),
        )
        .select_from(r)
        .join(w, and_(*eligibility_clauses(w, r, rules)))
        .where(r.id == request_id)
    )
    count, threads, speed = (await session.execute(eligible)).one()
    own = (
        await session.execute(
            select(TextRequest.max_length * TextRequest.n_remaining).where(TextRequest.id == request_id)
        )
    ).scalar_one_or_none() or 0
    if count == 0:
        return Estimate(0, 0, 0.0, 0, 0, 0, int(own))
    q = aliased(TextRequest, name="q")
    ew = aliased(Worker, name="ew")
    # Requests ahead of R in queue order that one of R's eligible workers could take.
    shared_worker = exists(
        select(1)
        .select_from(ew)
        .where(*eligibility_clauses(ew, r, rules), *eligibility_clauses(ew, q, rules))
        .correlate_except(ew)
    )
    competing = (
        select(
            func.coalesce(func.sum(q.max_length * q.n_remaining), 0),
            func.coalesce(func.sum(q.n_remaining), 0),
            func.count(q.id),
        )
        .select_from(r)
        .join(
            q,
            and_(
                *request_offered(q, rules.now),
                q.id != r.id,
                or_(
                    q.effective_start < r.effective_start,
                    and_(q.effective_start == r.effective_start, q.created_at < r.created_at),
                ),
            ),
        )
        .where(r.id == request_id, shared_worker)
    )
    work, jobs, requests = (await session.execute(competing)).one()
    return Estimate(int(count), int(threads), float(speed), int(work), int(jobs), int(requests), int(own))


async def horde_totals(session: AsyncSession, rules: Rules) -> tuple[int, int]:
    """(online text threads, queued text requests) horde-wide, for the horde_queue curve."""
    threads = (
        await session.execute(
            select(func.coalesce(func.sum(Worker.threads), 0)).where(
                Worker.last_check_in >= rules.online_since, Worker.paused.is_(False)
            )
        )
    ).scalar_one()
    queued = (
        await session.execute(
            select(func.count(TextRequest.id)).where(*request_offered(TextRequest, rules.now))
        )
    ).scalar_one()
    return int(threads), int(queued)
