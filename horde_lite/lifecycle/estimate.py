"""The wait estimate (docs/explanation/dispatch.md), read by admission and the status route.

Eligible workers of R: online workers passing the eligibility check for R. Competing work: the
queued output of requests ahead of R that at least one of them could take. Estimated wait:
competing work / the eligible workers' combined lease speed.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from math import ceil
from operator import itemgetter
from typing import Any

from sqlalchemy import Text, and_, bindparam, cast, false, func, select, true
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from horde_lite.db.models import TextRequest, Worker
from horde_lite.db.sqltypes import OneOf, TextListParam
from horde_lite.lifecycle import queue_index
from horde_lite.lifecycle.eligibility import (
    NOW,
    REQUEST_FACT_COLUMNS,
    REQUEST_FACT_JSON,
    WORKER_FACT_COLUMNS,
    WORKER_FACT_JSON,
    RequestFacts,
    Rules,
    WorkerFacts,
    admits,
    built_once,
    capable_worker_online,
    eligibility_clauses,
    gate_passes,
    request_facts_of,
    request_offered,
    worker_facts_of,
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


# Queued requests judged per round trip while walking the queue ahead of R: the first page, and
# the least and most of a later one, sized by what the horizon still needs (`next_page`). A round
# trip costs 2-3 ms; a row read past the horizon about 25 us.
ESTIMATE_PAGE = 200
_PAGE_MOST = 1000
_PAGE_MARGIN = 1.2
# Undecided requests asked about in one query at most (the list is one bound parameter).
_PENDING_MOST = 1000


def head_columns(r: Any, rules: Rules) -> tuple[Any, ...]:
    """What the estimate reads of R first: its own remaining output, its queue key, and whether a
    capable worker for R is online (a reader of R's row may select them with it, see `estimate`)."""
    return (r.max_length * r.n_remaining, r.effective_start, r.created_at, capable_worker_online(r, rules))


async def estimate(
    session: AsyncSession,
    request_id: str,
    rules: Rules,
    *,
    page: int = ESTIMATE_PAGE,
    head: tuple[Any, ...] | None = None,
) -> Estimate:
    """Short queries, each bounded by the fleet or by what the horizon holds, so creation and
    status reads stay cheap with a long queue (bench/perf.py measures them):

    1. R's own output, its queue key, and whether a capable worker for R is online (asked once).
    2. R's eligible workers: the eligibility check for every online worker against R.
    3. The competing work: walking the queue ahead of R in order, through the queue's index over
       the eligible workers' models (lifecycle/queue_index.py), a page at a time, each page's
       rows judged in Python by the check's twin (one of those workers could take q; see
       `_Judge`). The walk stops at R, or once the work counted would keep those workers busy for
       the horizon (`[allowance] estimate_horizon_seconds`): a longer wait changes no allowance.

    `head`: the values of `head_columns` for R when the caller read them with R's row (the status
    read), which saves step 1's statement.
    """
    values = {"now": rules.now, "request_id": request_id}
    conn = await session.connection()  # Core statements: the ORM's result machinery only costs
    if head is None:
        head = (await conn.execute(built_once(rules, ("estimate head",), _head), values)).one_or_none()
        if head is None:
            return Estimate(0, 0, 0.0, 0, 0, 0, 0)
    own, start, created, capable = head
    eligible_workers = built_once(rules, ("estimate workers", bool(capable)), _workers(bool(capable)))
    workers = (await conn.execute(eligible_workers, values)).all()
    if not workers:
        return Estimate(0, 0, 0.0, 0, 0, 0, int(own or 0))
    threads = sum(int(row[0]) for row in workers)
    speed = sum(float(row[1]) for row in workers)
    eligible = [worker_facts_of(row[2:]) for row in workers]  # after threads and speed
    judge = _Judge(rules, eligible)
    horizon = speed * rules.horizon_seconds
    work = jobs = requests = 0
    walked = 0  # rows read so far
    # Requests whose verdict waits for "is a capable worker for q online" (see `_Judge`): asked
    # in one query only when their work could carry the count past the horizon, or at the end, so
    # a long walk asks once or twice instead of once a page, and stops where it would have.
    pending: list[tuple[str, bool, int, int]] = []  # (id, taken if one is online, work, jobs)
    pending_work = 0

    def next_page() -> int:
        """The rows the horizon still needs at the work per row read so far, with a margin, within
        [page, _PAGE_MOST]: a walk to a far horizon takes a few large pages, not many small ones."""
        counted = work + pending_work
        if counted <= 0:
            return _PAGE_MOST
        return min(_PAGE_MOST, max(page, ceil((horizon - counted) * walked / counted * _PAGE_MARGIN)))

    walk = queue_index.walk(
        session,
        sorted(judge.by_model),
        size=page,
        limits=_widest(eligible),
        before=queue_index.Position(start, created, request_id),
        columns=_WALK_COLUMNS,
        reads="estimate",
        values={"now": rules.now},
        resize=next_page,
    )

    async def resolve(work: int, jobs: int, requests: int) -> tuple[int, int, int]:
        """The totals with the pending requests that the answer takes added; none left pending."""
        capable = built_once(rules, ("estimate capable",), _capable)
        values = {"now": rules.now, "ids": [rid for rid, *_ in pending]}
        capable_for = set((await conn.execute(capable, values)).scalars())
        for rid, if_capable, amount, n in pending:
            if if_capable == (rid in capable_for):
                work, jobs, requests = work + amount, jobs + n, requests + 1
        pending.clear()
        return work, jobs, requests

    async for rows in walk:
        walked += len(rows)
        for row in rows:
            if not row[_OFFERED]:
                continue
            verdict = judge.verdict(row)
            if verdict is False:
                continue
            n = row[_N_REMAINING]
            amount = row[_MAX_LENGTH] * n
            if verdict is True:
                work += amount
                jobs += n
                requests += 1
            else:  # undecided: taken when a capable worker is online (a) or when none is (b)
                pending.append((row[0], verdict[0], amount, n))
                pending_work += amount
        if pending and (work + pending_work >= horizon or len(pending) >= _PENDING_MOST):
            work, jobs, requests = await resolve(work, jobs, requests)
            pending_work = 0
        if work >= horizon:
            break
    if pending:
        work, jobs, requests = await resolve(work, jobs, requests)
    return Estimate(len(eligible), threads, speed, work, jobs, requests, int(own or 0))


def _head(rules: Rules) -> Any:
    r = _R
    return select(*head_columns(r, rules)).where(r.id == bindparam("request_id"))


def _capable(rules: Rules) -> Any:
    """Which of the requests `ids` a capable worker online could take (the speed gate's input)."""
    q = TextRequest
    ids = bindparam("ids", type_=TextListParam)
    return select(q.id).where(OneOf(q.id, ids), capable_worker_online(q, rules))


def _workers(capable: bool) -> Callable[[Rules], Any]:
    """R's eligible workers as facts, given whether a capable worker for R is online."""

    def build(rules: Rules) -> Any:
        r, w = _R, _W
        return (
            select(w.threads, worker_speed(w, rules), *_WORKER_FACTS)
            .select_from(r)
            .join(w, and_(*eligibility_clauses(w, r, rules, capable=true() if capable else false())))
            .where(r.id == bindparam("request_id"))
        )

    return build


class _Judge:
    """Could one of R's eligible workers take q: the Python twin of `eligibility_clauses(ew, q)`
    for some ew of them (property-tested to agree with the SQL clauses), over the workers that
    serve one of q's models.

    The speed gate reads "is a capable worker for q online" (c), a question over the whole fleet.
    Each q is judged twice with c given, A = some worker passes with c true, B = with c false;
    only when they differ is c needed: the verdict is then the pair (A, B), and the caller asks
    c for the page's undecided requests in one query."""

    def __init__(self, rules: Rules, eligible: list[WorkerFacts]) -> None:
        self.rules = rules
        # The roomiest workers first: a queued request is usually taken by the first one tried.
        eligible = sorted(eligible, key=_roominess, reverse=True)
        self.eligible = eligible
        self.by_model: dict[str, list[WorkerFacts]] = {}
        for w in eligible:
            for m in w.models:
                self.by_model.setdefault(m, []).append(w)
        # Verdicts by class: queued requests repeat a few shapes (a model, a length, the same
        # flags), and judging one against dozens of workers is the walk's main cost. Two rows are
        # in one class when they hold the same facts but for the context they need and the
        # requester, and their context falls between the same two context limits of these workers
        # (the check only compares it with those limits, so the verdicts are the same). The
        # requester counts only for a worker in maintenance (it takes its owner's requests).
        self._by_user = any(w.maintenance for w in eligible)
        self._contexts = sorted({w.max_context_length for w in eligible})
        self._chat_contexts = sorted({w.chat_max_context_tokens or 0 for w in eligible})
        self._verdicts: dict[tuple[Any, ...], bool | tuple[bool, bool]] = {}

    def verdict(self, row: Any) -> bool | tuple[bool, bool]:
        """`takeable` for a row read with `_WALK_COLUMNS`, judged once per class (see above)."""
        if row[_IS_CHAT]:
            context = bisect_left(self._chat_contexts, row[_PROMPT_TOKENS] + row[_MAX_LENGTH])
        else:
            context = bisect_left(self._contexts, row[_MAX_CONTEXT_LENGTH])
        key = (_CLASS_FACTS(row), context, row[_USER_ID] if self._by_user else None)
        found = self._verdicts.get(key)
        if found is None:
            found = self._verdicts[key] = self.takeable(request_facts_of(_FACTS(row)))
        return found

    def _serving(self, q: RequestFacts) -> list[WorkerFacts]:
        if not q.models:
            return self.eligible
        if len(q.models) == 1:
            return self.by_model.get(next(iter(q.models)), [])
        seen: dict[str, WorkerFacts] = {}
        for m in q.models:
            for w in self.by_model.get(m, []):
                seen.setdefault(w.id, w)
        return list(seen.values())

    def takeable(self, q: RequestFacts) -> bool | tuple[bool, bool]:
        rules = self.rules
        a = b = False
        for w in self._serving(q):
            if not admits(w, q, rules):
                continue
            a = a or gate_passes(w, q, rules, True)
            b = b or gate_passes(w, q, rules, False)
            if a and b:
                return True
        return a if a == b else (a, b)


def _widest(workers: list[WorkerFacts]) -> queue_index.Limits:
    """The largest lengths any of R's eligible workers accepts: a queued request beyond all of
    them is no competition, and the walk skips it inside the index."""
    chat = [
        w
        for w in workers
        if w.chat_max_completion_tokens is not None and w.chat_max_context_tokens is not None
    ]
    return queue_index.Limits(
        max_length=max(w.max_length for w in workers),
        max_context_length=max(w.max_context_length for w in workers),
        chat_max_completion_tokens=max((w.chat_max_completion_tokens or 0 for w in chat), default=None),
        chat_max_context_tokens=max((w.chat_max_context_tokens or 0 for w in chat), default=None),
    )


# Aliases are built once (building one and its column collection costs about a millisecond).
_R = aliased(TextRequest, name="r")
_W = aliased(Worker, name="w")


def _columns(entity: Any, names: tuple[str, ...], json: frozenset[str]) -> tuple[Any, ...]:
    """The columns the judge reads, its JSON lists as text (parsed only when not empty)."""
    return tuple(cast(getattr(entity, c), Text).label(c) if c in json else getattr(entity, c) for c in names)


_WORKER_FACTS = _columns(_W, WORKER_FACT_COLUMNS, WORKER_FACT_JSON)
_FACT_COLUMNS = _columns(TextRequest, REQUEST_FACT_COLUMNS, REQUEST_FACT_JSON)
# What the walk reads of each queued request (built once: the walk's statements are cached).
_WALK_COLUMNS = (
    and_(*request_offered(TextRequest, NOW)).label("offered"),  # type: ignore[arg-type]
    TextRequest.n_remaining,
    *_FACT_COLUMNS,
)
# The walk's rows: (request_id, effective_start, created_at, offered, n_remaining, *facts).
_AT = {c: 5 + i for i, c in enumerate(REQUEST_FACT_COLUMNS)}
_FACTS = itemgetter(*_AT.values())
_CLASS_FACTS = itemgetter(
    *(i for c, i in _AT.items() if c not in ("user_id", "max_context_length", "prompt_tokens"))
)
_OFFERED, _N_REMAINING = 3, 4
_IS_CHAT, _MAX_LENGTH, _USER_ID = _AT["is_chat"], _AT["max_length"], _AT["user_id"]
_MAX_CONTEXT_LENGTH, _PROMPT_TOKENS = _AT["max_context_length"], _AT["prompt_tokens"]


def _roominess(w: WorkerFacts) -> tuple[Any, ...]:
    return (
        w.max_length,
        w.max_context_length,
        w.chat_max_completion_tokens or 0,
        w.chat_max_context_tokens or 0,
        len(w.chat_features),
        w.trusted,
        w.nsfw,
        w.capacity,
    )


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
