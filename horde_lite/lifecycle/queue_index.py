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
(lifecycle/mirror.py).

The entries are a hint beside the truth. Every reader still judges the request rows themselves
with the one eligibility check, so an entry left behind costs a skipped candidate, never a wrong
answer. Entries enter when a request is admitted and leave when its last job is handed out or it
stops waiting (faulted, cancelled, expired); a job given back (lapsed, faulted) to a request with
none left brings them back, at the same place. Jobs being generated are thus not in the index: on
a busy horde the head of the queue is mostly requests whose jobs are all out, and a walk that read
them would page past hundreds of requests no worker may take.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Select,
    and_,
    bindparam,
    case,
    delete,
    insert,
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

from horde_lite.db.models import QueueEntry, QueueOwnerRefusal, QueueRefusal, TextRequest, Worker
from horde_lite.db.sqltypes import JsonList
from horde_lite.lifecycle.eligibility import (
    Rules,
    allow_list_admits,
    built_once,
    capable_worker_online_for_entry,
    fast_enough,
    refuses_by_name,
    refuses_owner,
    serves_models,
    speed_gate_admits_sql,
)
from horde_lite.policies.protocols import GateSql

ANY_MODEL = ""  # the entry of a request that names no model: every worker serves it

# Past this many models, one walk of the whole queue in order (its own index) is cheaper than a
# merge of per-model walks, each of which may read a page that the merge then drops.
MANY_MODELS = 8

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


# The request columns an entry is made of.
_SOURCE = ("id", "models", "any_model", "effective_start", "created_at", "is_chat", "max_length",
           "max_context_length", "prompt_tokens", "nsfw", "trusted_workers", "slow_workers", "targeted",
           "worker_allow", "required_features", "required_transports")  # fmt: skip


def targets(request: Mapping[str, Any], models: int) -> list[str]:
    """The workers the entries of a request asking for `models` models name: those of its
    allow-list when the entries would number at most `TARGET_ENTRIES`, else `ANY_WORKER` alone."""
    allow = sorted(set(request.get("worker_allow") or ())) if request.get("targeted") else []
    if not allow or models * len(allow) > TARGET_ENTRIES or any(len(w) > TARGET_LENGTH for w in allow):
        return [ANY_WORKER]
    return allow


# What makes a request's entries not plain (QueueEntry.plain), besides an allow-list they do not name.
_NOT_PLAIN = ("required_features", "required_transports")


def entry_rows(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The entries of a waiting request given as its column values (bulk loaders use this too).
    The lengths are what `chat_limits_admit`/`legacy_limits_admit` compare with a worker's."""
    chat = bool(request["is_chat"])
    need_context = (
        request.get("prompt_tokens", 0) + request["max_length"] if chat else request["max_context_length"]
    )
    common = {
        "request_id": request["id"],
        "effective_start": request["effective_start"],
        "created_at": request["created_at"],
        "is_chat": chat,
        "need_length": request["max_length"],
        "need_context": need_context,
        "nsfw": bool(request.get("nsfw", False)),
        "trusted_workers": bool(request.get("trusted_workers", False)),
        "slow_workers": bool(request.get("slow_workers", True)),
    }
    models = [ANY_MODEL] if request.get("any_model", True) else sorted(set(request["models"]))
    named = targets(request, len(models))
    common["plain"] = not any(request.get(c) for c in _NOT_PLAIN) and (
        not request.get("targeted") or named != [ANY_WORKER]
    )
    return [{**common, "model": m, "target": t} for m in models for t in named]


async def enter(session: AsyncSession, row: TextRequest) -> None:
    """Index a waiting request, with its final lengths (after any downgrade)."""
    await session.execute(insert(QueueEntry.__table__), entry_rows({c: getattr(row, c) for c in _SOURCE}))


# Core, built once: entries are never loaded as objects, so the ORM has nothing to synchronise.
_LEAVE = delete(QueueEntry.__table__).where(QueueEntry.__table__.c.request_id == bindparam("request_id"))


async def leave(session: AsyncSession, request_id: str) -> None:
    """The request has no job to hand out (all out, or it stopped waiting): no walk needs to pass
    it."""
    await session.execute(_LEAVE, {"request_id": request_id})


async def come_back(session: AsyncSession, row: TextRequest) -> None:
    """A request whose jobs were all out has one to hand out again: its entries return, keyed as
    before. Any left behind are replaced, so a stale entry cannot turn a give-back into an error."""
    await leave(session, row.id)
    await enter(session, row)


def refusal_rows(request_id: str, workers: Iterable[str]) -> list[dict[str, Any]]:
    """The refusals of a request naming `workers` (bulk loaders use this too); a name longer than
    a worker id refuses no worker."""
    return [
        {"request_id": request_id, "worker_id": w} for w in sorted(set(workers)) if len(w) <= TARGET_LENGTH
    ]


async def refuse(session: AsyncSession, request_id: str, workers: Iterable[str]) -> None:
    """The request refuses `workers` for good (its deny-list at admission, a worker that failed
    it), so walks skip it for them; none already refused may be among them."""
    rows = refusal_rows(request_id, workers)
    if rows:
        await session.execute(insert(QueueRefusal.__table__), rows)


async def refuse_owner(session: AsyncSession, request_id: str, owner_id: int) -> None:
    """The request refuses every worker of `owner_id` for good (one of them failed it); the owner
    is not refused already."""
    refusal = {"request_id": request_id, "owner_id": owner_id}
    await session.execute(insert(QueueOwnerRefusal.__table__), [refusal])


def _not_refused(request_id: Any) -> ColumnElement[bool]:
    return and_(
        not_(refuses_by_name(request_id, bindparam("worker_id"))),
        not_(refuses_owner(request_id, bindparam("owner_id"))),
    )


def _fits(is_chat: Any, need_length: Any, need_context: Any, chat: bool) -> ColumnElement[bool]:
    """The lengths a worker accepts, as bound parameters (`Limits` gives their values); `chat`:
    the worker declared chat limits."""
    legacy = and_(
        not_(is_chat),
        need_length <= bindparam("max_length"),
        need_context <= bindparam("max_context_length"),
    )
    if not chat:
        return legacy
    return or_(
        legacy,
        and_(is_chat, need_length <= bindparam("chat_length"), need_context <= bindparam("chat_context")),
    )


def _chooses(nsfw: Any, trusted_workers: Any, slow_workers: Any) -> list[ColumnElement[bool]]:
    """The request's choices a worker must meet (`Limits` gives the worker's side)."""
    return [
        or_(not_(nsfw), bindparam("worker_nsfw")),
        or_(not_(trusted_workers), bindparam("worker_trusted")),
        or_(slow_workers, bindparam("worker_fast")),
    ]


def _targets_worker(target: Any) -> ColumnElement[bool]:
    """An entry the worker may read: one that targets no worker, or this one."""
    return or_(target == ANY_WORKER, target == bindparam("worker_id"))


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
    """Whether the page's walk applies the speed gate: a walk with the worker's limits, over the
    whole queue (it reads the request rows: the claim's own rule) or, under a gate that allows it
    (`capable_worker_only_narrows`, see SpeedGate), by model (the entries answer for plain requests only)."""
    if rules is None or shape.chat is None:
        return False
    return shape.models is None or getattr(rules.gate, "capable_worker_only_narrows", False) is True


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


def _build(shape: _Shape, gated: Rules | None) -> Select[Any]:
    """`gated`: the rules (with the time as a bound parameter) whose speed gate the walk applies."""
    size = bindparam("size")
    if shape.models is None:  # the whole queue through its own index
        r = TextRequest
        key = (r.effective_start, r.created_at, r.id)
        where = [r.state == "waiting", r.n_remaining > 0, *_after(key, shape.after)]
        if shape.chat is not None:
            need_context = case((r.is_chat, r.prompt_tokens + r.max_length), else_=r.max_context_length)
            where.append(_fits(r.is_chat, r.max_length, need_context, shape.chat))
            where += _chooses(r.nsfw, r.trusted_workers, r.slow_workers)
            where += [allow_list_admits(r, bindparam("worker_id")), _not_refused(r.id)]
            if gated is not None:
                where.append(speed_gate_admits_sql(r, bindparam("capacity"), gated))
        # The models, read from the row: else a worker serving none of the head's models would page
        # through all of it, each row judged by the claim.
        where.append(serves_models(bindparam("worker_models", type_=JsonList), r))
        built = select(r.id.label("request_id"), r.effective_start, r.created_at).where(*where)
        return built.order_by(*key).limit(size)
    e = QueueEntry
    key = (e.effective_start, e.created_at, e.request_id)
    fits: list[ColumnElement[bool]] = [true()]
    if shape.chat is not None:
        fits = [_fits(e.is_chat, e.need_length, e.need_context, shape.chat)]
        fits += [*_chooses(e.nsfw, e.trusted_workers, e.slow_workers), _targets_worker(e.target)]
        fits.append(_not_refused(e.request_id))
    if gated is not None:
        # The speed gate, asked of the entry: its capable-worker question answers for plain
        # entries only (false, "not known", for the rest), which a gate that a capable worker only
        # narrows turns into
        # admitting them; the claim asks the full question.
        sql = GateSql(
            is_chat=e.is_chat,
            max_length=e.need_length,
            capacity=bindparam("capacity"),
            capable_worker_online=lambda: capable_worker_online_for_entry(e, gated),
        )
        fits.append(gated.gate.admits_sql(sql))

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
    walked = None if len(set(models)) >= MANY_MODELS else sorted({*models, ANY_MODEL})
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
