"""The pop: check the worker in, claim a job in one short transaction with every rule in the
WHERE clause, hand it out with a lease, and write the shadow record of the speed gate."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, and_, bindparam, case, func, not_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from horde_lite.db.models import AssignmentRecord, CandidateRecord, Generation, TextRequest, User, Worker
from horde_lite.lifecycle import queue_index
from horde_lite.lifecycle.context import Caller, Horde
from horde_lite.lifecycle.eligibility import (
    NOW,
    Rules,
    built_once,
    capable_worker_online,
    eligibility_clauses,
    request_offered,
)
from horde_lite.lifecycle.inputs import PopInput
from horde_lite.lifecycle.users import authenticate_user
from horde_lite.lifecycle.workers import check_in, effective_speed
from horde_lite.metrics import wait_attributes
from horde_lite.policies.protocols import Assignment, GateInputs, PopCheck
from horde_lite.policies.registry import Policies


@dataclass(frozen=True)
class Job:
    request: TextRequest
    generations: list[Generation]
    model: str
    ttl: int


# Candidates judged per round trip: a page of the worker's part of the queue. Small, since the
# head of that part is usually takeable; a page wholly refused (by rules the index cannot see:
# targeting, the speed gate, trust, nsfw) moves the walk on to the next.
POP_PAGE = 32

_W = aliased(Worker, name="w")  # built once: an alias adapts its columns on first use


def _judged(rules: Rules, *, fake: bool, by: str) -> Select[Any]:
    """The pop's judging statement (built once; see `built_once`): the first of the requests
    `among` (user ids or request ids) that worker `worker_id` may take, in queue order."""

    def build(symbolic: Rules) -> Select[Any]:
        r = TextRequest
        among = (r.user_id if by == "user" else r.id).in_(bindparam("among", expanding=True))
        query = (
            select(r)
            .join(_W, _W.id == bindparam("worker_id"))
            .where(
                among,
                *request_offered(r, symbolic.now),
                *eligibility_clauses(_W, r, symbolic, ignore_paused=fake),
            )
            .order_by(r.effective_start, r.created_at, r.id)
            .limit(1)
        )
        if fake:
            # A paused worker's job is a copy from other users' requests; nothing is claimed.
            return query.where(r.user_id != bindparam("owner_id"))
        return query.with_for_update(of=r, skip_locked=True)

    return built_once(rules, ("pop", fake, by), build)


async def _candidate(
    session: AsyncSession, horde: Horde, policies: Policies, worker: Worker, now: float, *, fake: bool
) -> TextRequest | None:
    """The first request this worker may take, in queue order: its owner's and priority users'
    requests first, then everyone's by effective start (priority ageing without rewrites).

    Both are index-driven: the preferred users' requests through the user index, everyone's by
    walking the queue's index over the worker's models a page at a time (lifecycle/queue_index.py);
    each candidate page is judged by the one eligibility check and claimed with SKIP LOCKED."""
    rules = Rules.from_settings(horde.settings, policies.speed_gate, now)
    params: dict[str, Any] = {"now": now, "worker_id": worker.id, "owner_id": worker.owner_id}

    async def first(by: str, among: list[Any]) -> TextRequest | None:
        query = _judged(rules, fake=fake, by=by)
        return (await session.execute(query, {**params, "among": among})).scalars().first()

    found = await first("user", [worker.owner_id, *worker.priority_user_ids])
    if found is not None or worker.maintenance:
        return found  # a worker in maintenance takes only its owner's requests
    async for rows in queue_index.walk(
        session, [*worker.models], size=POP_PAGE, limits=queue_index.Limits.of(worker)
    ):
        found = await first("id", [row[0] for row in rows])
        if found is not None:
            return found
    return None


def _capable(rules: Rules) -> Select[Any]:
    r = TextRequest
    return select(capable_worker_online(r, rules)).where(r.id == bindparam("request_id"))


async def _capable_online(session: AsyncSession, rules: Rules, request: TextRequest) -> bool:
    """Is a capable worker for `request` online: the speed gate's own SQL, in one small query,
    built once (a statement built per call cost its cache key on every found over-capacity pop)."""
    query = built_once(rules, ("pop capable",), _capable)
    conn = await session.connection()  # Core: it reads workers, nothing the ORM holds dirty
    return bool((await conn.execute(query, {"now": rules.now, "request_id": request.id})).scalar_one())


async def _record_assignments(
    session: AsyncSession,
    horde: Horde,
    policies: Policies,
    worker: Worker,
    request: TextRequest,
    assignments: list[Assignment],
    over: bool,
    now: float,
) -> None:
    """The history of real assignments (kept after the request expires, read by `horde-lite
    whatif`) and, with a candidate speed gate, the jobs it would have refused (decision 0027)."""
    rules = Rules.from_settings(horde.settings, policies.speed_gate, now)
    # Only an over-capacity job raises the question (every built-in gate passes the others).
    capable = await _capable_online(session, rules, request) if over else None
    records: list[AssignmentRecord | CandidateRecord] = [
        AssignmentRecord(
            **dataclasses.asdict(a), at=now, capable_online=capable, speed_gate=policies.names["speed_gate"]
        )
        for a in assignments
    ]
    candidate = policies.candidate_speed_gate
    if candidate is not None:

        def allows(online: bool) -> bool:
            return candidate.can_generate_with_eligibility_inputs(
                GateInputs(request.is_chat, request.max_length, worker.capacity, online)
            )

        asked = capable
        if asked is None and allows(False) != allows(True):  # the candidate reads it here too
            asked = await _capable_online(session, rules, request)
        if not allows(bool(asked)):
            records.extend(
                CandidateRecord(
                    at=now,
                    kind="speed_gate",
                    candidate=policies.names["candidate_speed_gate"],
                    in_force=policies.names["speed_gate"],
                    request_id=request.id,
                    worker_id=worker.id,
                    worker_trusted=worker.trusted,
                    is_chat=request.is_chat,
                    max_length=request.max_length,
                    capacity=worker.capacity,
                    capable_online=asked,
                    decision="assigned",
                    candidate_decision="refused",
                )
                for _ in assignments  # one per job, as the assignment records
            )
    session.add_all(records)


def _job_model(request: TextRequest, worker: Worker) -> str:
    if request.any_model:
        return worker.models[0] if worker.models else ""
    served = set(worker.models)
    return next((m for m in request.models if m in served), request.models[0] if request.models else "")


async def pop(session: AsyncSession, horde: Horde, owner: User, body: PopInput) -> tuple[Worker, Job | None]:
    now = horde.clock.now()
    settings = horde.settings
    policies = horde.policies  # one snapshot: a live switch must not mix two gates in one pop
    worker = await check_in(session, owner, body, settings, now)
    fake = worker.paused
    if not fake:  # a paused worker's pops serve fake jobs, which no metric records
        policies.shadow_metrics.on_pop(
            horde.metrics,
            PopCheck(
                worker_id=worker.id,
                worker_trusted=worker.trusted,
                capacity=worker.capacity,
                chat_max_completion_tokens=worker.chat_max_completion_tokens,
            ),
        )
    request = await _candidate(session, horde, policies, worker, now, fake=fake)
    if request is None:
        return worker, None
    count = 1 if fake else min(body.amount, request.n_remaining)
    if not fake:
        # The row is locked (FOR UPDATE on PostgreSQL, the one writer on SQLite): set it in place.
        request.n_remaining -= count
        request.expires_at = now + settings.request.expiry_seconds
    lease = settings.lease.base_seconds
    model = _job_model(request, worker)
    speed = effective_speed(worker.lease_speed, settings)
    over = request.max_length > worker.capacity
    generations = [
        Generation(
            id=str(uuid.uuid4()),
            request_id=request.id,
            worker_id=worker.id,
            model=model,
            state="processing",
            fake=fake,
            popped_at=now,
            lease_expires_at=now + lease,
            over_capacity_at_assignment=over and not fake,
            capacity_at_assignment=worker.capacity,
            speed_at_assignment=speed,
            progress_tool_calls=[],
        )
        for _ in range(count)
    ]
    session.add_all(generations)
    await session.flush()
    if not fake:
        horde.metrics.job_event("popped", request.is_chat, len(generations))
        # The shadow record of each job, for the metrics and the stored history alike.
        assignments = [
            Assignment(
                generation_id=generation.id,
                request_id=request.id,
                worker_id=worker.id,
                worker_trusted=worker.trusted,
                is_chat=request.is_chat,
                max_length=request.max_length,
                capacity=worker.capacity,
                speed=speed,
                over_capacity=over,
            )
            for generation in generations
        ]
        for assignment in assignments:
            policies.shadow_metrics.on_assignment(horde.metrics, assignment)
            horde.metrics.queue_wait_seconds.record(
                max(0.0, now - request.created_at),
                wait_attributes(request.requester_kind, request.is_chat),  # type: ignore[arg-type]
            )
        await _record_assignments(session, horde, policies, worker, request, assignments, over, now)
        horde.notifier.on_commit(session, request.id, remote=request.waited)
    return worker, Job(request=request, generations=generations, model=model, ttl=int(lease))


@dataclass(frozen=True, slots=True)
class Offer:
    """A job as handed to a worker: its generations, lease and what to generate."""

    ids: list[str]  # one generation per job taken
    model: str
    ttl: int  # the lease, seconds
    is_chat: bool
    stream: bool
    prompt: str
    params: dict[str, Any]  # the request's Kobold params (n, max_length, ... as admitted)
    max_length: int
    chat: dict[str, Any] | None  # a chat job's worker payload


@dataclass(frozen=True, slots=True)
class Popped:
    offer: Offer | None  # None: nothing to do now
    skipped: dict[str, int]  # with no offer: waiting requests this worker is too small for, by reason


async def pop_job(horde: Horde, caller: Caller, body: PopInput) -> Popped:
    """POST /generate/text/pop: authenticate the worker's owner, check the worker in, claim a job."""
    async with horde.transaction() as session:
        owner = await authenticate_user(session, caller.apikey, horde.clock.now())
        worker, job = await pop(session, horde, owner, body)
        if job is None:
            return Popped(offer=None, skipped=await skipped_reasons(session, horde, worker))
        request = job.request
        offer = Offer(
            ids=[g.id for g in job.generations],
            model=job.model,
            ttl=job.ttl,
            is_chat=request.is_chat,
            stream=request.stream,
            prompt=request.prompt,
            params=dict(request.params or {}),
            max_length=request.max_length,
            chat=dict(request.chat) if request.chat is not None else None,
        )
        return Popped(offer=offer, skipped={})


async def skipped_reasons(session: AsyncSession, horde: Horde, worker: Worker) -> dict[str, int]:
    """Why nothing was offered, counted over the head of the queue (upstream's `skipped`), cheaply:
    one row of counts, not the rows themselves."""
    values = {
        "now": horde.clock.now(),
        "max_length": worker.max_length,
        "max_context_length": worker.max_context_length,
    }
    conn = await session.connection()  # a Core statement: the ORM has nothing to load
    too_long, too_wide = (await conn.execute(_SKIPPED, values)).one()
    counts = {"max_length": int(too_long or 0), "max_context_length": int(too_wide or 0)}
    return {key: n for key, n in counts.items() if n}


def _skipped() -> Select[Any]:
    """Of the first 200 offered requests in queue order (through the queue's index), the legacy
    ones longer than the worker accepts, and of the rest those wider than its context. Chat
    requests are not counted: upstream's `skipped` has no key for them (its fields are Kobold's)."""
    r = TextRequest
    head = (
        select(r.max_length, r.max_context_length, r.is_chat)
        .where(*request_offered(r, NOW))  # type: ignore[arg-type]
        .order_by(r.effective_start, r.created_at, r.id)
        .limit(200)
        .subquery("head")
    )
    longer = head.c.max_length > bindparam("max_length")
    wider = and_(
        head.c.max_length <= bindparam("max_length"),
        head.c.max_context_length > bindparam("max_context_length"),
    )
    legacy = not_(head.c.is_chat)
    return select(
        func.sum(case((and_(legacy, longer), 1), else_=0)), func.sum(case((and_(legacy, wider), 1), else_=0))
    )


_SKIPPED = _skipped()  # built once (see `built_once` in eligibility.py for why)
