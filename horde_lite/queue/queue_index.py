"""The queue's index: the part of the queue a worker could serve, in queue order, a page at a time.

`queue_entries` holds one row per request with a job to hand out and model it asks for
(`ANY_MODEL` for a request any model serves), keyed by the queue order (effective_start,
created_at, request id) and carrying the length limits and choices a worker must meet; a request
targeted at a few workers has one row per model and worker, so the others' walks skip it inside
the index; `queue_refusals` holds the workers each request refuses by name (its deny-list, the
workers that failed it) and `queue_owner_refusals` the owners it refuses (those whose workers
failed it), which walks skip too. The pop walks it per model through its index
instead of judging the whole queue: its cost follows what the worker can take, not the queue's
length (docs/explanation/dispatch.md). The wait estimate walks its own copy of the queue in memory
(queue/mirror.py).

The entries are a hint beside the truth. Every reader still judges the request rows themselves
with the one eligibility check, so an entry left behind would cost a skipped candidate, never a
wrong answer. None is left behind: the database's triggers on `text_requests` (migration
0020_queue_kept_by_triggers) keep all three tables, in the transaction that writes the request, as
the change log's triggers keep the wait estimate's copy, so no code path can forget them. A request
has entries while it waits with a job to hand out (`state` waiting, `n_remaining` > 0): they enter
when it is admitted, leave when its last job is handed out or it stops waiting, and come back, at
the same place, when a job is given back to a request with none left. Its refusals are written
when its lists are, and go with the request. Jobs being generated are thus not in the index: on a
busy horde the head of the queue is mostly requests whose jobs are all out, and a walk that read
them would page past hundreds of requests no worker may take.

`tests/support/queue_oracle.py` states in Python what the triggers write, and
`tests/integration/test_queue_triggers.py` checks that they agree on both databases.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Select,
    and_,
    bindparam,
    case,
    exists,
    not_,
    or_,
    select,
    true,
    tuple_,
    union_all,
)
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased
from sqlalchemy.sql.elements import ColumnElement

from horde_lite.db.models import QueueEntry, TextRequest, Worker
from horde_lite.db.sqltypes import JsonList
from horde_lite.policies.protocols import GateSql
from horde_lite.queue.eligibility import (
    Rules,
    allow_list_admits,
    built_once,
    capable_worker_online_for_entry,
    chat_lengths_admit,
    choices_admit,
    fast_enough,
    legacy_lengths_admit,
    refuses_by_name,
    refuses_owner,
    serves_models,
    speed_gate_admits_sql,
    worker_speed,
)

ANY_MODEL = ""  # the entry of a request that names no model: every worker serves it

# Past this many models, one walk of the whole queue in order (its own index) is cheaper than a
# merge of per-model walks, each of which may read a page that the merge then drops.
MANY_MODELS = 8

# The request columns the triggers make a request's entries of, and the lists whose names they
# write as its refusals: a change of any of them rewrites what the index holds for the request
# (tests/integration/test_queue_triggers.py compares them with the installed triggers).
ENTRY_SOURCE_COLUMNS = (
    "effective_start", "created_at", "is_chat", "max_length", "max_context_length", "prompt_tokens",
    "nsfw", "trusted_workers", "slow_workers", "any_model", "models", "targeted", "worker_allow",
    "required_features", "required_transports",
)  # fmt: skip
REFUSAL_SOURCE_COLUMNS = ("worker_deny", "failed_workers", "failed_owners")

ANY_WORKER = ""  # the target of an entry any worker may read
# A targeted request has an entry per model and worker it names while they number at most this
# many; a longer allow-list (rare: targeting is "my worker", or a handful) is entered as targeting
# none, so a request costs a bounded number of entries, and the claim judges its allow-list.
TARGET_ENTRIES = 16
TARGET_LENGTH = 36  # a worker id's length: a longer name in an allow-list can name no worker


@dataclass(frozen=True, slots=True)
class Position:
    """A request's place in the queue order."""

    effective_start: float
    created_at: float
    request_id: str


@dataclass(frozen=True, slots=True)
class Limits:
    """What a worker accepts (its pop declaration: lengths, NSFW) and is (trusted, fast enough for
    a request that refuses slow workers); implied by the eligibility check, read here only to skip,
    inside the index, entries the worker could never take."""

    worker_id: str
    owner_id: int
    max_length: int
    max_context_length: int
    chat_max_completion_tokens: int | None
    chat_max_context_tokens: int | None
    nsfw: bool
    trusted: bool
    fast: bool
    capacity: int
    rules: Rules  # the time and settings, and the speed gate in force

    @property
    def chat(self) -> bool:
        """The worker declared both chat limits (without them it takes no chat request)."""
        return self.chat_max_completion_tokens is not None and self.chat_max_context_tokens is not None

    @classmethod
    def of(cls, worker: Worker, rules: Rules) -> Limits:
        return cls(
            worker.id,
            worker.owner_id,
            worker.max_length,
            worker.max_context_length,
            worker.chat_max_completion_tokens,
            worker.chat_max_context_tokens,
            worker.nsfw,
            worker.trusted,
            fast_enough(worker.lease_speed, rules),
            worker.capacity,
            rules,
        )


# The worker's side of a walk's rules, by name: a page binds them (`_values`), the look's probe
# reads them from the worker's row (`_row_side`), so one set of clauses serves both.
Side = dict[str, Any]
_SIDE_NAMES = (
    "worker_id", "owner_id", "max_length", "max_context_length", "chat_length", "chat_context",
    "worker_nsfw", "worker_trusted", "worker_fast", "capacity", "longest",
)  # fmt: skip
_BOUND: Side = {name: bindparam(name) for name in _SIDE_NAMES}


def _row_side(w: Any, rules: Rules) -> Side:
    """The side `Limits.of(w)` binds, as the columns of worker row `w` (the same values: the
    Python form is `Limits.of` with `_values`)."""
    completion, context = w.chat_max_completion_tokens, w.chat_max_context_tokens
    chat_longer = and_(completion.is_not(None), context.is_not(None), completion > w.max_length)
    return {
        "worker_id": w.id,
        "owner_id": w.owner_id,
        "max_length": w.max_length,
        "max_context_length": w.max_context_length,
        "chat_length": completion,
        "chat_context": context,
        "worker_nsfw": w.nsfw,
        "worker_trusted": w.trusted,
        "worker_fast": worker_speed(w, rules) >= rules.slow_speed,
        "capacity": w.capacity,
        "longest": case((chat_longer, completion), else_=w.max_length),
    }


def _not_refused(request_id: Any, side: Side) -> ColumnElement[bool]:
    return and_(
        not_(refuses_by_name(request_id, side["worker_id"])),
        not_(refuses_owner(request_id, side["owner_id"])),
    )


def _fits(is_chat: Any, need_length: Any, need_context: Any, chat: bool, side: Side) -> ColumnElement[bool]:
    """The lengths a worker accepts (the eligibility check's rules), its side from `side`;
    `chat`: the worker declared chat limits."""
    worker = {"max_length": side["max_length"], "max_context_length": side["max_context_length"]}
    legacy = and_(not_(is_chat), legacy_lengths_admit(need_length, need_context, **worker))
    if not chat:
        return legacy
    limits = {"completion": side["chat_length"], "context": side["chat_context"]}
    return or_(legacy, and_(is_chat, chat_lengths_admit(need_length, need_context, **limits)))


def _chooses(r: Any, side: Side) -> list[ColumnElement[bool]]:
    """The request's choices (`r`: a request or its entry) the worker meets (the eligibility
    check's rule), its side from `side`."""
    worker = {"nsfw": side["worker_nsfw"], "trusted": side["worker_trusted"]}
    return choices_admit(r, **worker, fast=side["worker_fast"])


def _targets_worker(target: Any, side: Side) -> ColumnElement[bool]:
    """An entry the worker may read: one that targets no worker, or this one."""
    return or_(target == ANY_WORKER, target == side["worker_id"])


def _after(key: Any, after: bool) -> list[ColumnElement[bool]]:
    """After the previous page's last row (the full key)."""
    if not after:
        return []
    start, created, rid = bindparam("after_start"), bindparam("after_created"), bindparam("after_id")
    return [tuple_(*key) > tuple_(start, created, rid)]


@dataclass(frozen=True, slots=True)
class _Shape:
    """What a page's statement is built from; its values are bound parameters (see `_values`)."""

    # Distinct models walked, the any-model entry included; None: the whole queue's order,
    # filtered by the worker's models.
    models: int | None
    chat: bool | None  # None: no length limits; else whether the worker declared chat limits
    after: bool


_STATEMENTS: dict[_Shape, Select[Any]] = {}


def _gated(shape: _Shape, rules: Rules | None) -> bool:
    """Whether the page's walk applies the speed gate: every walk with the worker's limits, over
    the whole queue (it reads the request rows: the claim's own rule) or by model (asked of the
    entries, see `_gate_on_entries`)."""
    return rules is not None and shape.chat is not None


def _statement(shape: _Shape, rules: Rules | None) -> Select[Any]:
    """The page's statement, built once per shape (building and caching a statement of a dozen
    subqueries cost more than running it), and per speed gate when it applies the gate. Rows:
    (request_id, effective_start, created_at) in queue order; a request asking for two of the
    models may appear twice, side by side."""
    if rules is not None and _gated(shape, rules):
        return built_once(rules, ("walk", shape), lambda symbolic: _build(shape, symbolic))
    built = _STATEMENTS.get(shape)
    if built is None:
        built = _STATEMENTS[shape] = _build(shape, None)
    return built


def _gate_on_entries(e: Any, rules: Rules, capacity: Any) -> ColumnElement[bool]:
    """The speed gate asked of an entry. The entry answers the capable-worker question exactly for
    a plain chat entry only (`capable_worker_online_for_entry`); for the rest the walk admits what
    the gate admits under either answer, leaving the full question to the claim. So the walk never
    skips an entry the claim would take, whatever the gate, and a gate is written once per form."""

    def asked(capable: Any) -> ColumnElement[bool]:
        gate = GateSql(
            is_chat=e.is_chat, max_length=e.need_length, capacity=capacity,
            capable_worker_online=lambda: capable,
        )  # fmt: skip
        return rules.gate.admits_sql(gate)

    # Where the entry cannot tell, its question answers "no": with "yes" too, both answers count.
    known = and_(e.plain, e.is_chat)
    return or_(asked(capable_worker_online_for_entry(e, rules)), and_(not_(known), asked(true())))


def _requests_where(shape: _Shape, gated: Rules | None, side: Side) -> list[ColumnElement[bool]]:
    """A walk of the whole queue's order (`shape.models` None): the requests it reads."""
    r = TextRequest
    where = [r.state == "waiting", r.n_remaining > 0]
    if shape.chat is not None:
        need_context = case((r.is_chat, r.prompt_tokens + r.max_length), else_=r.max_context_length)
        where.append(_fits(r.is_chat, r.max_length, need_context, shape.chat, side))
        where += _chooses(r, side)
        where += [allow_list_admits(r, side["worker_id"]), _not_refused(r.id, side)]
        if gated is not None:
            where.append(speed_gate_admits_sql(r, side["capacity"], gated))
    # The models, read from the row: else a worker serving none of the head's models would page
    # through all of it, each row judged by the claim.
    where.append(serves_models(bindparam("worker_models", type_=JsonList), r))
    return where


def _entries_where(shape: _Shape, gated: Rules | None, side: Side, e: Any) -> list[ColumnElement[bool]]:
    """A walk by model: the entries of one model (`e.model`, the caller's) it reads."""
    fits: list[ColumnElement[bool]] = []
    if shape.chat is not None:
        fits = [_fits(e.is_chat, e.need_length, e.need_context, shape.chat, side)]
        fits += [*_chooses(e, side), _targets_worker(e.target, side)]
        fits.append(_not_refused(e.request_id, side))
    if gated is not None:
        fits.append(_gate_on_entries(e, gated, side["capacity"]))
    return fits


def _build(shape: _Shape, gated: Rules | None) -> Select[Any]:
    """`gated`: the rules (with the time as a bound parameter) whose speed gate the walk applies."""
    size = bindparam("size")
    if shape.models is None:  # the whole queue through its own index
        r = TextRequest
        key = (r.effective_start, r.created_at, r.id)
        where = [*_requests_where(shape, gated, _BOUND), *_after(key, shape.after)]
        built = select(r.id.label("request_id"), r.effective_start, r.created_at).where(*where)
        return built.order_by(*key).limit(size)
    e = QueueEntry
    key = (e.effective_start, e.created_at, e.request_id)
    fits = _entries_where(shape, gated, _BOUND, e)

    def branch(i: int) -> Any:
        model = bindparam(f"walk_model_{i}")
        query = select(e.request_id, e.effective_start, e.created_at).where(
            e.model == model, *fits, *_after(key, shape.after)
        )
        limit: Any = size
        if shape.chat is not None:
            # A one-time probe through ix_queue_entries_need: when no entry of the model asks for
            # as little as the worker's longest length, the branch's LIMIT is 0 and neither
            # database starts the range scan in queue order (which would read every entry of the
            # model to find none fit). As a WHERE term, SQLite still ran the scan.
            probe = aliased(QueueEntry)
            fitting = select(probe.request_id).where(
                probe.model == model, probe.need_length <= bindparam("longest")
            )
            limit = case((fitting.exists(), size), else_=0)
        return query.order_by(*key).limit(limit).subquery()

    branches = [branch(i) for i in range(shape.models)]
    # SQLite takes ORDER BY/LIMIT only on a whole compound select: each branch is a subquery.
    merged = union_all(*(select(b.c.request_id, b.c.effective_start, b.c.created_at) for b in branches))
    m = merged.subquery("walk")
    return (
        select(m.c.request_id, m.c.effective_start, m.c.created_at)
        .order_by(m.c.effective_start, m.c.created_at, m.c.request_id)
        .limit(size)
    )


def _probe(shape: _Shape, gated: Rules, row: Any) -> ColumnElement[bool]:
    """Whether the first page of `shape` (not after another) holds a row, for the worker whose
    row `row` the enclosing statement reads: the rows a page's clauses admit exist, asked with no
    order. By model, as a page's branch does: first whether any entry of the model asks for no
    more than the worker's longest length (ix_queue_entries_need), then the clauses; without that
    test PostgreSQL may read every entry of the model through the walk's covering index to find
    that none fits."""
    side = _row_side(row, gated)
    if shape.models is None:
        return exists(select(1).where(*_requests_where(shape, gated, side)).correlate(row))
    e, fitting = QueueEntry, aliased(QueueEntry)
    fits = _entries_where(shape, gated, side, e)

    def of_model(i: int) -> ColumnElement[bool]:
        model = bindparam(f"walk_model_{i}")
        short = select(1).where(fitting.model == model, fitting.need_length <= side["longest"])
        admitted = select(1).where(e.model == model, *fits)
        return and_(exists(short.correlate(row)), exists(admitted.correlate(row)))

    return or_(*(of_model(i) for i in range(shape.models)))


def _values(
    models: Sequence[str],
    walked: list[str] | None,
    size: int,
    limits: Limits | None,
    after: Position | None,
) -> dict[str, Any]:
    values: dict[str, Any] = {"size": size}
    if walked is None:
        values["worker_models"] = sorted(set(models))
    for i, model in enumerate(walked or ()):
        values[f"walk_model_{i}"] = model
    if limits is not None:
        values.update(worker_id=limits.worker_id, capacity=limits.capacity, now=limits.rules.now)
        values["owner_id"] = limits.owner_id
        values["longest"] = limits.max_length
        values["max_length"] = limits.max_length
        values["max_context_length"] = limits.max_context_length
        values.update(worker_nsfw=limits.nsfw, worker_trusted=limits.trusted, worker_fast=limits.fast)
        if limits.chat:
            values["longest"] = max(limits.max_length, limits.chat_max_completion_tokens or 0)
            values["chat_length"] = limits.chat_max_completion_tokens
            values["chat_context"] = limits.chat_max_context_tokens
    if after is not None:
        values.update(
            after_start=after.effective_start, after_created=after.created_at, after_id=after.request_id
        )
    return values


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a walk: its rows, one per request (first appearance), `(request_id,
    effective_start, created_at)`, and where the next page starts (None: the walk ran out)."""

    rows: list[Any]
    after: Position | None


async def page(
    session: AsyncSession,
    models: Sequence[str],
    *,
    size: int,
    limits: Limits | None = None,
    after: Position | None = None,
) -> Page:
    """The page of the walk (see `walk`) that starts after `after` (None: at the head)."""
    walked = _walked(models)
    chat = None if limits is None else limits.chat
    conn = await session.connection()  # a Core statement: the ORM's result machinery only costs
    shape = _Shape(None if walked is None else len(walked), chat, after is not None)
    values = _values(models, walked, size, limits, after)
    rows = (await conn.execute(_statement(shape, None if limits is None else limits.rules), values)).all()
    seen: dict[str, Any] = {}
    for row in rows:
        seen.setdefault(row[0], row)
    last = rows[-1] if len(rows) == size else None
    return Page(list(seen.values()), None if last is None else Position(last[1], last[2], last[0]))


def _walked(models: Sequence[str]) -> list[str] | None:
    """The models a walk merges, the any-model entry's included; None: the whole queue's order."""
    return None if len(set(models)) >= MANY_MODELS else sorted({*models, ANY_MODEL})


@dataclass(frozen=True, slots=True)
class Probe:
    """Whether a worker's first page holds a row, asked inside a statement that reads the
    worker's row: a page's own clauses, their worker side read from that row (`_row_side`), asked
    whether any row meets them. `models` and `chat` (whether it declared chat limits) must be the
    row's; a row that holds others gets an answer that means nothing."""

    shape: _Shape
    values: dict[str, Any]  # to execute the enclosing statement with

    @classmethod
    def of(cls, models: Sequence[str], *, chat: bool, now: float) -> Probe:
        walked = _walked(models)
        shape = _Shape(None if walked is None else len(walked), chat, False)
        values = _values(models, walked, 0, None, None)
        del values["size"]  # a probe reads no page
        return cls(shape, {**values, "now": now})

    def column(self, row: Any, rules: Rules) -> ColumnElement[bool]:
        """`row`: the worker's row in the enclosing statement; `rules`: symbolic (`built_once`)."""
        return _probe(self.shape, rules, row)


async def walk(
    session: AsyncSession,
    models: Sequence[str],
    *,
    size: int,
    limits: Limits | None = None,
    first: Page | None = None,
    most: int | None = None,
) -> AsyncIterator[list[Any]]:
    """Pages of the waiting requests in queue order that ask for one of `models` or for any model,
    skipping those whose lengths, choices or targets refuse `limits`' worker, until it runs out;
    the caller stops early when it has what it needs. The first page holds `size` rows at most,
    one per request (first appearance): `(request_id, effective_start, created_at)`; each next page
    twice as many as the one before, up to `most` (default: `size`). `first`: the first page, read
    already (by a pop before its transaction); the walk goes on after it."""
    current = first if first is not None else await page(session, models, size=size, limits=limits)
    while current.rows:
        yield current.rows
        if current.after is None:
            return
        size = min(size * 2, most or size)
        current = await page(session, models, size=size, limits=limits, after=current.after)
