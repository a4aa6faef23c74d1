"""The pop: check the worker in, claim a job in one short transaction with every rule in the
WHERE clause, hand it out with a lease, and write the shadow record of the speed gate."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, cast

import msgspec
from sqlalchemy import ColumnElement, Select, Table, and_, bindparam, case, func, insert, not_, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import aliased

from horde_lite.accounts import flagged, worker_messages
from horde_lite.accounts.worker_messages import MessageRecord
from horde_lite.accounts.workers import (
    authenticate_worker,
    check_in,
    check_in_due_at,
    check_in_need,
    declared_models,
    effective_speed,
    look_up,
    owner_and_named_with,
    stamp_check_in,
)
from horde_lite.core.context import Caller, Horde, InForce
from horde_lite.db.models import AssignmentRecord, CandidateRecord, Generation, TextRequest, User, Worker
from horde_lite.db.rows import Write, committed, write_rows
from horde_lite.db.sqltypes import OneOf, TextList
from horde_lite.inputs import PopInput
from horde_lite.jobs import idle_answers
from horde_lite.jobs.pop_rule import PopPath, Seen, Take, counts_pop, path, take
from horde_lite.metrics import wait_attributes
from horde_lite.operators.ip_rule import stored_address
from horde_lite.policies.kinds import PolicyKind
from horde_lite.policies.protocols import Assignment, GateInputs, PopCheck
from horde_lite.policies.registry import Policies
from horde_lite.queue import queue_index
from horde_lite.queue.eligibility import (
    NOW,
    Rules,
    built_once,
    capable_worker_online,
    eligibility_clauses,
    request_offered,
)
from horde_lite.settings import Settings


@dataclass(frozen=True)
class Job:
    request: TextRequest
    generation_ids: list[str]  # one per job taken
    model: str
    ttl: int
    lease: float  # seconds (`ttl`, as the worker is told it)
    speed: float  # the worker's effective speed, recorded with each job


# Candidates judged per round trip: a page of the worker's part of the queue. Small, since the
# head of that part is usually takeable; a page wholly refused (by rules the index cannot see:
# deny-lists, long allow-lists, failed workers, chat features, the speed gate) moves the walk on
# to the next, twice as long up to POP_PAGE_MOST: a worker behind n refused requests pays
# log2(n / 32) pages, not n / 32.
POP_PAGE = 32
POP_PAGE_MOST = 512


_W = aliased(Worker, name="w")  # built once: an alias adapts its columns on first use
# The tables a claim writes (`pop`): its request's jobs left and renewed expiry, its generations
# and their assignment records.
_REQUESTS = cast(Table, TextRequest.__table__)
_GENERATIONS = cast(Table, Generation.__table__)
_ASSIGNMENTS = cast(Table, AssignmentRecord.__table__)


def _judged(rules: Rules, *, fake: bool, by: str) -> Select[Any]:
    """The pop's judging statement (built once; see `built_once`): the first request that worker
    `worker_id` may take, in queue order, of those by the users `users` (by "user"), of the
    requests `ids` (by "id"), or of both, the users' first (by "both": a page of the queue and the
    preferred users' requests in one statement, both bounded sets read through an index). Its rows
    are (request, capable): whether a capable worker for it is online, None unless its length
    is over `capacity` (a fake job's, always None)."""

    def build(symbolic: Rules) -> Select[Any]:
        r = TextRequest
        of_users = r.user_id.in_(bindparam("users", expanding=True))
        # The first page's few ids (with the users) as an IN list, which both databases answer
        # with index lookups under the OR; a later page's, up to POP_PAGE_MOST, as one list
        # parameter (`OneOf`): under an OR it would be tested against every waiting row, alone it
        # is one statement text for every length and, on PostgreSQL, index lookups even in a
        # generic plan (where an IN list of 512 was rebuilt and searched for every row read).
        among = {
            "user": of_users,
            "id": OneOf(r.id, bindparam("ids", type_=TextList)),
            "both": or_(of_users, r.id.in_(bindparam("ids", expanding=True))),
        }[by]
        order = [r.effective_start, r.created_at, r.id]
        if by == "both":
            order.insert(0, case((of_users, 0), else_=1))
        query = (
            select(r)
            .join(_W, _W.id == bindparam("worker_id"))
            .where(
                among,
                *request_offered(r, symbolic.now),
                *eligibility_clauses(_W, r, symbolic, ignore_paused=fake),
            )
            .order_by(*order)
            .limit(1)
        )
        if fake:
            # A paused worker's job is a copy from other users' requests; nothing is claimed.
            return query.where(r.user_id != bindparam("owner_id"))
        # The claimed row with the speed gate's question for its shadow record, asked of that row
        # alone (outside the sort and the lock) and only when it is over the worker's capacity.
        claimed = aliased(TextRequest, query.with_for_update(of=r, skip_locked=True).subquery("claimed"))
        over = claimed.max_length > bindparam("capacity")
        return select(claimed, case((over, capable_worker_online(claimed, symbolic)), else_=None))

    return built_once(rules, ("pop", fake, by), build)


async def _candidate(
    session: AsyncSession,
    in_force: InForce,
    worker: Worker,
    now: float,
    *,
    fake: bool,
    page: queue_index.Page | None = None,
) -> tuple[TextRequest, bool | None] | None:
    """The first request this worker may take, in queue order: its owner's and priority users'
    requests first, then everyone's by effective start (priority ageing without rewrites).
    `page`: the first page of the walk, when the pop read it before its transaction.

    Both are index-driven: the preferred users' requests through the user index, everyone's by
    walking the queue's index over the worker's models a page at a time (queue/queue_index.py);
    each candidate page is judged by the one eligibility check and claimed with SKIP LOCKED, the
    first page together with the preferred users' requests (one statement, not two)."""
    rules = in_force.rules(now)
    params: dict[str, Any] = {
        "now": now, "worker_id": worker.id, "owner_id": worker.owner_id, "capacity": worker.capacity
    }  # fmt: skip

    async def first(by: str, **among: list[Any]) -> tuple[TextRequest, bool | None] | None:
        query = _judged(rules, fake=fake, by=by)
        row = (await session.execute(query, {**params, **among})).first()
        if row is None:
            return None
        return (row[0], None) if fake else (row[0], row[1])

    preferred = [worker.owner_id, *worker.priority_user_ids]
    if worker.maintenance:
        return await first("user", users=preferred)  # a worker in maintenance takes only its owner's
    paged = False
    limits = queue_index.Limits.of(worker, rules)
    async for rows in queue_index.walk(
        session, [*worker.models], size=POP_PAGE, limits=limits, first=page, most=POP_PAGE_MOST
    ):
        ids = [row[0] for row in rows]
        # The first page is judged with the preferred users' requests, which go first.
        found = await (first("id", ids=ids) if paged else first("both", ids=ids, users=preferred))
        if found is not None:
            return found
        paged = True
    # An empty walk leaves nothing to ask: a request this worker may take has an entry the walk
    # reads (the index holds every waiting request under each of its models), its owner's too.
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


def _assignment_rows(
    in_force: InForce, assignments: list[Assignment], capable: bool | None, now: float
) -> list[Write]:
    """The history of real assignments (kept after the request expires, read by `horde-lite
    whatif`). `capable`: is a capable worker for the request online, asked by the claim of an
    over-capacity job (only such a job raises the question; every built-in gate passes the
    others), else None."""
    gate = in_force.policies.names[PolicyKind.SPEED_GATE]
    shadow = {"at": now, "capable_online": capable, "speed_gate": gate}
    return [Write(_ASSIGNMENTS, {**dataclasses.asdict(a), **shadow}) for a in assignments]


async def _record_candidate(
    session: AsyncSession,
    in_force: InForce,
    worker: Worker,
    request: TextRequest,
    assignments: list[Assignment],
    capable: bool | None,
    now: float,
) -> None:
    """With a candidate speed gate, the jobs it would have refused (`capable` as for
    `_assignment_rows`)."""
    policies = in_force.policies
    candidate = policies.candidate_speed_gate
    if candidate is not None:
        rules = in_force.rules(now)

        def allows(online: bool) -> bool:
            return candidate.admits(GateInputs(request.is_chat, request.max_length, worker.capacity, online))

        asked = capable
        if asked is None and allows(False) != allows(True):  # the candidate reads it here too
            asked = await _capable_online(session, rules, request)
        if not allows(bool(asked)):
            refused = {
                "at": now,
                "kind": PolicyKind.SPEED_GATE,
                "candidate": policies.names["candidate_speed_gate"],
                "in_force": policies.names[PolicyKind.SPEED_GATE],
                "request_id": request.id,
                "worker_id": worker.id,
                "worker_trusted": worker.trusted,
                "is_chat": request.is_chat,
                "max_length": request.max_length,
                "capacity": worker.capacity,
                "capable_online": asked,
                "decision": "assigned",
                "candidate_decision": "refused",
            }
            conn = await session.connection()
            # One per job, as the assignment records.
            await conn.execute(insert(CandidateRecord), [refused for _ in assignments])


def _job_model(request: TextRequest, worker: Worker) -> str:
    if request.any_model:
        return worker.models[0] if worker.models else ""
    served = set(worker.models)
    return next((m for m in request.models if m in served), request.models[0] if request.models else "")


@dataclass(frozen=True, slots=True)
class Looked:
    """What a pop read before its transaction (`look`): its owner and worker, whose check-in
    needs at most its time written, and the first page of the worker's part of the queue."""

    owner: User
    worker: Worker
    stamp: bool  # the check-in time is due, or the address moved
    page: queue_index.Page
    address: str | None  # the pop's, as the worker's row keeps it (None: no IP address)
    has_messages: bool  # the worker has an unexpired message to be handed
    skipped: dict[str, int]  # the answer's `skipped` if nothing is offered, counted with the owner


async def pop(
    session: AsyncSession,
    horde: Horde,
    owner: User,
    body: PopInput,
    *,
    in_force: InForce | None = None,
    worker: Worker | None = None,
    looked: Looked | None = None,
    address: str | None = None,
) -> tuple[Worker, Job | None]:
    """`worker`: the named worker's row when the caller read it locked with its owner. `looked`:
    what the pop read before its transaction; its worker is not checked in again (nothing but the
    time and address would change) and not locked (its row's rules are judged by the claim's own
    statement). `in_force`: the pop's snapshot of the policies (taken here when not given), the only
    one read. `address`: the pop's (`ip_rule.stored_address`), written with the check-in."""
    in_force = in_force or horde.in_force()
    now = horde.clock.now()
    if looked is None:
        worker = await check_in(
            session, owner, body, in_force.settings, now, worker=worker, modes=in_force.modes,
            address=address,
        )  # fmt: skip
    else:
        worker = looked.worker
        if looked.stamp:
            await stamp_check_in(session, worker, now, looked.address)
    fake = worker.paused
    _count_pop(horde, in_force.policies, _pop_check(worker))
    page = None if looked is None else looked.page
    found = await _candidate(session, in_force, worker, now, fake=fake, page=page)
    if found is None:
        return worker, None
    request, capable = found
    # A request that disables batching gives a pop one of its jobs, whatever `amount` it asks.
    amount = 1 if request.disable_batching else body.amount
    taken = take(
        fake=fake, amount=amount, n_remaining=request.n_remaining, max_length=request.max_length,
        capacity=worker.capacity,
    )  # fmt: skip
    job = _job(in_force.settings, request, worker, taken)
    # Core writes, one statement on PostgreSQL: the ORM's unit of work cost more than the statements.
    writes = [Write(_GENERATIONS, generation) for generation in _generations(job, worker, taken, now)]
    if taken.left is not None:
        # The row is locked (FOR UPDATE on PostgreSQL, the one writer on SQLite): set it in place,
        # and tell the loaded object, which must not write it again.
        expires = now + in_force.settings.request.expiry_seconds
        taken_values = {"n_remaining": taken.left, "expires_at": expires}
        writes.insert(0, Write(_REQUESTS, taken_values, request.id))
    assignments = _claimed(horde, in_force, worker, job, taken, now) if taken.records else []
    await write_rows(session, [*writes, *_assignment_rows(in_force, assignments, capable, now)])
    if taken.left is not None:
        committed(request, taken_values)
    if assignments:
        await _record_candidate(session, in_force, worker, request, assignments, capable, now)
        horde.notifier.on_commit(session, request.id, remote=request.waited)
    return worker, job


def _job(settings: Settings, request: TextRequest, worker: Worker, taken: Take) -> Job:
    """The job as handed out: a generation id per job taken, the model it runs and its lease."""
    generation_ids = [str(uuid.uuid4()) for _ in range(taken.count)]
    speed = effective_speed(worker.lease_speed, settings)
    lease = settings.lease.base_seconds
    return Job(request, generation_ids, _job_model(request, worker), int(lease), lease, speed)


def _generations(job: Job, worker: Worker, taken: Take, now: float) -> list[dict[str, Any]]:
    generation = {
        "request_id": job.request.id,
        "worker_id": worker.id,
        "model": job.model,
        "state": "processing",
        "fake": taken.fake,
        "popped_at": now,
        "lease_expires_at": now + job.lease,
        "over_capacity_at_assignment": taken.over_capacity_at_assignment,
        "capacity_at_assignment": worker.capacity,
        "speed_at_assignment": job.speed,
        "progress_tool_calls": [],
    }
    return [{"id": gid, **generation} for gid in job.generation_ids]


def _claimed(
    horde: Horde, in_force: InForce, worker: Worker, job: Job, taken: Take, now: float
) -> list[Assignment]:
    """A real pop's metrics, and the shadow record of each job (for the metrics and the stored
    history alike)."""
    request = job.request
    horde.metrics.job_event("popped", request.is_chat, taken.count)
    assignments = [
        Assignment(
            generation_id=generation_id,
            request_id=request.id,
            worker_id=worker.id,
            worker_trusted=worker.trusted,
            is_chat=request.is_chat,
            max_length=request.max_length,
            capacity=worker.capacity,
            speed=job.speed,
            over_capacity=taken.over_capacity,
        )
        for generation_id in job.generation_ids
    ]
    for assignment in assignments:
        in_force.policies.shadow_metrics.on_assignment(horde.metrics, assignment)
        horde.metrics.queue_wait_seconds.record(
            max(0.0, now - request.created_at),
            wait_attributes(request.requester_kind, request.is_chat),  # type: ignore[arg-type]
        )
    return assignments


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
    messages: list[MessageRecord] = field(default_factory=list)  # the worker's unexpired messages


def _pop_check(worker: Worker) -> PopCheck | None:
    """What the shadow metrics count of a pop of `worker` (None: nothing)."""
    if not counts_pop(worker.paused):
        return None
    return PopCheck(
        worker_id=worker.id,
        worker_trusted=worker.trusted,
        capacity=worker.capacity,
        chat_max_completion_tokens=worker.chat_max_completion_tokens,
    )


def _count_pop(horde: Horde, policies: Policies, check: PopCheck | None) -> None:
    """The shadow metrics' count of pops, once per pop whichever way it is answered."""
    if check is not None:
        policies.shadow_metrics.on_pop(horde.metrics, check)


async def look(
    horde: Horde, caller: Caller, body: PopInput, in_force: InForce | None = None
) -> Popped | Looked | None:
    """A pop's reads before its transaction, outside any: the owner and worker, whether its
    check-in would write, and the first page of the worker's part of the queue. Most pops of a
    horde are idle workers' polls: when nothing is to be written and the page is empty, the pop is
    answered here (`Popped`), and takes neither SQLite's write lock and a writer turn nor
    PostgreSQL's BEGIN and row lock. So is one whose only write is its due check-in time, on
    PostgreSQL: that one statement commits alone on this autocommit connection. A page with
    requests (`Looked`) is judged and claimed in the transaction, which walks on from it, as is
    SQLite's check-in. None: the pop goes the whole way in the transaction (`pop_rule.path` says
    when)."""
    in_force = in_force or horde.in_force()
    now = horde.clock.now()
    address = stored_address(caller.address)
    models = declared_models(body)
    answers = horde.idle_answers
    mark = answers.mark(models)  # before the statement: a wake-up during it counts
    key: idle_answers.Key | None = None
    if mark is not None:
        key = idle_answers.key_of(caller.apikey, address, msgspec.json.encode(body))
        remembered = answers.recall(key, now, in_force.policies, in_force.modes)
        if remembered is not None:
            _count_pop(horde, in_force.policies, remembered.check)
            horde.metrics.pops_remembered.add(1)
            return remembered.answer

    async def read(conn: AsyncConnection) -> Popped | Looked | None:
        rules = in_force.rules(now)
        # The declared models and chat limits: when they are not the worker's row's, the probe's
        # answer means nothing, and the pop goes the whole way (`check_in_need` says "all").
        probe = queue_index.Probe.of(models, chat=body.chat is not None, now=now)
        statement = look_statement(rules, probe)
        named = await look_up(conn, caller.apikey, body.name, now, statement, probe.values)
        if named is None or named.worker is None:
            return None
        owner, worker = named.owner, named.worker
        flagged.refuse_worker(owner)
        need = await check_in_need(conn, worker, owner, body, in_force.settings, now, address)
        seen = Seen(known=True, need=need, paused=worker.paused, maintenance=worker.maintenance)
        if path(seen) is PopPath.WHOLE:
            return None
        counts, has_page = named.extra
        skipped = _skipped_answer(*divmod(int(counts), SKIPPED_SPLIT))
        route = path(replace(seen, page_rows=None if has_page else 0))  # None: the page decides
        messages: list[MessageRecord] = []
        if route is not PopPath.IDLE or named.has_messages:  # most pops are idle: no session for them
            async with horde.sessionmaker(bind=conn) as session:
                page = queue_index.Page([], None)
                if route is None:  # the probe found a row
                    limits = queue_index.Limits.of(worker, rules)
                    page = await queue_index.page(session, [*worker.models], size=POP_PAGE, limits=limits)
                    route = path(replace(seen, page_rows=len(page.rows)))
                if route is PopPath.CLAIM or (route is PopPath.CHECK_IN and not horde.autocommit_reads):
                    return Looked(
                        owner, worker, stamp=need == "time", page=page, address=address,
                        has_messages=named.has_messages, skipped=skipped,
                    )  # fmt: skip
                if route is PopPath.CHECK_IN:
                    # One statement that commits alone; run twice, it writes the same.
                    await stamp_check_in(session, worker, now, address)
                messages = await _messages(session, named.has_messages, worker, now)
        check = _pop_check(worker)
        _count_pop(horde, in_force.policies, check)  # after the last statement: a read run twice counts once
        popped = Popped(offer=None, skipped=skipped, messages=messages)
        if key is not None and mark is not None and not messages:
            until = answers.until(now, check_in_due_at(worker.last_check_in))
            policies, modes = in_force.policies, in_force.modes
            answers.remember(key, idle_answers.Remembered(popped, check, mark, policies, modes, now, until))
        return popped

    # Pure reads: on a connection the server has closed they run again on a checked one.
    return await horde.read_retried(read)


async def pop_job(horde: Horde, caller: Caller, body: PopInput) -> Popped:
    """POST /generate/text/pop: authenticate the worker's owner, check the worker in, claim a job;
    an idle poll is answered before any transaction (`look`)."""
    in_force = horde.in_force()  # one snapshot: a live switch must not mix two gates in one pop
    looked = await look(horde, caller, body, in_force)
    if isinstance(looked, Popped):
        return looked
    async with horde.transaction() as session:
        if looked is None:
            named = await authenticate_worker(session, caller.apikey, body, horde.clock.now())
            has_messages = named.has_messages
            address = stored_address(caller.address)
            worker, job = await pop(
                session, horde, named.owner, body, in_force=in_force, worker=named.worker, address=address
            )
        else:
            has_messages = looked.has_messages
            worker, job = await pop(session, horde, looked.owner, body, in_force=in_force, looked=looked)
        messages = await _messages(session, has_messages, worker, horde.clock.now())
        if job is None:
            # The look counted `skipped` with its owner and worker; a pop without one counts here.
            skipped = looked.skipped if looked is not None else await skipped_reasons(session, horde, worker)
            return Popped(offer=None, skipped=skipped, messages=messages)
        request = job.request
        offer = Offer(
            ids=job.generation_ids,
            model=job.model,
            ttl=job.ttl,
            is_chat=request.is_chat,
            stream=request.stream,
            prompt=request.prompt,
            params=dict(request.params or {}),
            max_length=request.max_length,
            chat=dict(request.chat) if request.chat is not None else None,
        )
        return Popped(offer=offer, skipped={}, messages=messages)


async def _messages(
    session: AsyncSession, has_messages: bool, worker: Worker, now: float
) -> list[MessageRecord]:
    """The worker's unexpired messages, read only when the pop's first statement found one."""
    return await worker_messages.live_for(session, worker.id, now) if has_messages else []


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
    return _skipped_answer(too_long, too_wide)


def _skipped_answer(too_long: int | None, too_wide: int | None) -> dict[str, int]:
    counts = {"max_length": int(too_long or 0), "max_context_length": int(too_wide or 0)}
    return {key: n for key, n in counts.items() if n}


SKIPPED_HEAD = 200  # the requests at the head of the queue that `skipped` counts over


def _skipped(max_length: Any, max_context_length: Any) -> tuple[ColumnElement[Any], ColumnElement[Any]]:
    """Of the first SKIPPED_HEAD offered requests in queue order (through the queue's index), the
    legacy ones longer than `max_length`, and of the rest those wider than `max_context_length`.
    Chat requests are not counted: upstream's `skipped` has no key for them (its fields are
    Kobold's)."""
    r = TextRequest
    head = (
        select(r.max_length, r.max_context_length, r.is_chat)
        .where(*request_offered(r, NOW))  # type: ignore[arg-type]
        .order_by(r.effective_start, r.created_at, r.id)
        .limit(SKIPPED_HEAD)
        .subquery("head")
    )
    longer = head.c.max_length > max_length
    wider = and_(head.c.max_length <= max_length, head.c.max_context_length > max_context_length)
    legacy = not_(head.c.is_chat)
    too_long = func.sum(case((and_(legacy, longer), 1), else_=0))
    return too_long, func.sum(case((and_(legacy, wider), 1), else_=0))


# Built once (see `built_once` in eligibility.py for why). `_SKIPPED` counts for a worker's stored
# lengths given as parameters; `_SKIPPED_IN_LOOK` for the worker's row that an idle pop's first
# statement reads (`look_statement`), as one number: too long x SKIPPED_SPLIT + too wide (each at most
# SKIPPED_HEAD).
_SKIPPED = select(*_skipped(bindparam("max_length"), bindparam("max_context_length")))
SKIPPED_SPLIT = SKIPPED_HEAD + 1
_too_long, _too_wide = _skipped(Worker.max_length, Worker.max_context_length)
_SKIPPED_IN_LOOK = select(
    func.coalesce(_too_long, 0) * SKIPPED_SPLIT + func.coalesce(_too_wide, 0)
).scalar_subquery()


def look_statement(rules: Rules, probe: queue_index.Probe) -> Select[Any]:
    """A pop's first statement: its owner and worker, whether the worker has a message, the
    `skipped` counts for the worker's row, and whether its first page holds a row (`probe`), so
    an idle pop answers without another statement. Built once per page shape and gate."""
    return built_once(
        rules,
        ("look", probe.shape),
        lambda symbolic: owner_and_named_with(_SKIPPED_IN_LOOK, probe.column(Worker, symbolic)),
    )
