"""The wait estimate (docs/explanation/dispatch.md), read by admission and the status route.

Eligible workers of R: online workers passing the eligibility check for R. Competing work: the
queued output of requests ahead of R that at least one of them could take. Estimated wait:
competing work / the eligible workers' combined lease speed.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from sqlalchemy import and_, bindparam, case, exists, false, func, not_, or_, select, true
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased
from sqlalchemy.sql.elements import ColumnElement

from horde_lite.db.models import RequestModel, TextRequest, Worker
from horde_lite.lifecycle.eligibility import (
    Rules,
    capable_worker_online,
    eligibility_clauses,
    request_offered,
    worker_speed,
)


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
    """Three short queries, each bounded by the fleet or by the requests that share a worker with
    R, so creation stays cheap with a long queue (bench/admission.py measures it):

    1. R's own output, its queue key, and whether a capable worker for R is online (asked once).
    2. R's eligible workers: the eligibility check for every online worker against R.
    3. The competing work: offered requests ahead of R that one of those workers could take, by
       the same check. A request for none of their models is skipped through the model index
       before any pair is judged, and "is a capable worker for q online" is asked only for a q
       whose answer depends on it, at most once per q (see `_takeable`).
    """
    r = _R
    head = (
        await session.execute(
            select(
                r.max_length * r.n_remaining, r.effective_start, r.created_at, capable_worker_online(r, rules)
            ).where(r.id == request_id)
        )
    ).one_or_none()
    if head is None:
        return Estimate(0, 0, 0.0, 0, 0, 0, 0)
    own, start, created, capable = head
    w = _W
    workers = (
        await session.execute(
            select(w.id, w.threads, worker_speed(w, rules), w.models)
            .select_from(r)
            .join(w, and_(*eligibility_clauses(w, r, rules, capable=true() if capable else false())))
            .where(r.id == request_id)
        )
    ).all()
    if not workers:
        return Estimate(0, 0, 0.0, 0, 0, 0, int(own or 0))
    ids = [row[0] for row in workers]
    threads = sum(int(row[1]) for row in workers)
    speed = sum(float(row[2]) for row in workers)
    models = sorted({m for row in workers for m in (row[3] or [])})
    q = _Q
    competing = select(
        func.coalesce(func.sum(q.max_length * q.n_remaining), 0),
        func.coalesce(func.sum(q.n_remaining), 0),
        func.count(q.id),
    ).where(
        *request_offered(q, rules.now),
        q.id != request_id,
        or_(q.effective_start < start, and_(q.effective_start == start, q.created_at < created)),
        # Implied by the check below (a shared worker serves one of q's models); lets the planner
        # start from the model index instead of the whole queue.
        or_(q.any_model, q.id.in_(select(RequestModel.request_id).where(RequestModel.model.in_(models)))),
        _takeable(q, rules),
    )
    work, jobs, requests = (await session.execute(competing, {"eligible_ids": ids})).one()
    return Estimate(len(ids), threads, speed, int(work), int(jobs), int(requests), int(own or 0))


def _row(selectable: Any) -> Any:
    """A selectable's columns as attributes, the way the eligibility clauses read a row. Cheaper
    to build on than an ORM alias of a CTE, which adapts every column it is asked for."""
    return SimpleNamespace(**{c.key: c for c in selectable.c})


# Aliases are built once (building one and its column collection costs about a millisecond, and
# an estimate used eight); each appears once per statement, so reusing them is safe.
_R = aliased(TextRequest, name="r")
_W = aliased(Worker, name="w")
_Q = aliased(TextRequest, name="q")


# R's eligible workers, copied once per estimate into a small CTE that each request's pair test
# scans instead of the whole workers table; the ids are bound at execution (`eligible_ids`).
_WORKER_COLUMNS = (
    "id", "owner_id", "last_check_in", "paused", "maintenance", "models", "max_length",
    "max_context_length", "chat_max_completion_tokens", "chat_max_context_tokens", "chat_features",
    "chat_image_transports", "trusted", "lease_speed", "nsfw", "capacity",
)  # fmt: skip
_ELIGIBLE = (
    select(*(Worker.__table__.c[name] for name in _WORKER_COLUMNS))
    .where(Worker.__table__.c.id.in_(bindparam("eligible_ids", expanding=True)))
    .cte("eligible_workers")
)
_EW_CAPABLE = _ELIGIBLE.alias("ew_capable_online")
_EW_NONE_CAPABLE = _ELIGIBLE.alias("ew_none_capable")


def _some_worker(alias: Any, q: Any, rules: Rules, capable: ColumnElement[bool]) -> ColumnElement[bool]:
    """Some worker of R's eligible ones (the CTE) passes `eligibility_clauses` for q."""
    return exists(
        select(1)
        .select_from(alias)
        .where(*eligibility_clauses(_row(alias), q, rules, capable=capable))
        .correlate_except(alias)
    )


def _takeable(q: Any, rules: Rules) -> ColumnElement[bool]:
    """Could one of R's eligible workers take q: `eligibility_clauses(ew, q)` for some ew of them.

    The speed gate reads "is a capable worker for q online" (c), a subquery over the fleet. Asked
    inside the pair test it would run once per pair; instead the pair test runs twice with c given,
    A = some worker passes with c true, B = some worker passes with c false, and
    takeable = c ? A : B = CASE WHEN A THEN (B OR c) ELSE (B AND NOT c) END,
    which asks c only when A and B differ, and then once. Any gate policy gives the same answer.
    """
    a = _some_worker(_EW_CAPABLE, q, rules, true())
    b = _some_worker(_EW_NONE_CAPABLE, q, rules, false())
    c = capable_worker_online(q, rules)
    return case((a, or_(b, c)), else_=and_(b, not_(c)))


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
