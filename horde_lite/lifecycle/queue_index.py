"""The queue's index: the part of the queue a worker could serve, in queue order, a page at a time.

`queue_entries` holds one row per waiting request and model it asks for (`ANY_MODEL` for a request
any model serves), keyed by the queue order (effective_start, created_at, request id) and carrying
the length limits a worker must meet. The pop and the wait estimate walk it per model through its
index instead of judging the whole queue: their cost follows what the worker (or the fleet that
could serve a request) can take, not the queue's length (docs/explanation/dispatch.md).

The entries are a hint beside the truth. Every reader still judges the request rows themselves
with the one eligibility check, so an entry left behind costs a skipped candidate, never a wrong
answer. Entries enter when a request is admitted and leave when it stops waiting (done, faulted,
cancelled, expired).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, and_, case, delete, insert, not_, or_, select, true, tuple_, union_all
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ColumnElement

from horde_lite.db.models import QueueEntry, TextRequest, Worker

ANY_MODEL = ""  # the entry of a request that names no model: every worker serves it

# Past this many models, one walk of the whole queue in order (its own index) is cheaper than a
# merge of per-model walks, each of which may read a page that the merge then drops.
MANY_MODELS = 8


@dataclass(frozen=True, slots=True)
class Position:
    """A request's place in the queue order."""

    effective_start: float
    created_at: float
    request_id: str


@dataclass(frozen=True, slots=True)
class Limits:
    """The lengths a worker accepts (its pop declaration); implied by the eligibility check, read
    here only to skip, inside the index, entries the worker could never take."""

    max_length: int
    max_context_length: int
    chat_max_completion_tokens: int | None
    chat_max_context_tokens: int | None

    @classmethod
    def of(cls, worker: Worker) -> Limits:
        return cls(
            worker.max_length,
            worker.max_context_length,
            worker.chat_max_completion_tokens,
            worker.chat_max_context_tokens,
        )


# The request columns an entry is made of.
_SOURCE = ("id", "models", "any_model", "effective_start", "created_at", "is_chat", "max_length",
           "max_context_length", "prompt_tokens")  # fmt: skip


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
    }
    models = [ANY_MODEL] if request.get("any_model", True) else sorted(set(request["models"]))
    return [{**common, "model": m} for m in models]


async def enter(session: AsyncSession, row: TextRequest) -> None:
    """Index a waiting request, with its final lengths (after any downgrade)."""
    await session.execute(insert(QueueEntry), entry_rows({c: getattr(row, c) for c in _SOURCE}))


async def leave(session: AsyncSession, request_id: str) -> None:
    """The request stopped waiting: no walk needs to pass it any more."""
    await session.execute(delete(QueueEntry).where(QueueEntry.request_id == request_id))


def _fits(is_chat: Any, need_length: Any, need_context: Any, limits: Limits) -> ColumnElement[bool]:
    legacy = and_(not_(is_chat), need_length <= limits.max_length, need_context <= limits.max_context_length)
    if limits.chat_max_completion_tokens is None or limits.chat_max_context_tokens is None:
        return legacy
    chat = and_(
        is_chat,
        need_length <= limits.chat_max_completion_tokens,
        need_context <= limits.chat_max_context_tokens,
    )
    return or_(legacy, chat)


def _between(key: Any, after: Position | None, before: Position | None) -> list[ColumnElement[bool]]:
    """After a page's last row (the full key); before a request: strictly earlier in time, so two
    requests made at the same instant with the same priority are not ahead of each other."""
    clauses: list[ColumnElement[bool]] = []
    if after is not None:
        clauses.append(tuple_(*key) > tuple_(after.effective_start, after.created_at, after.request_id))
    if before is not None:
        clauses.append(tuple_(*key[:2]) < tuple_(before.effective_start, before.created_at))
    return clauses


def page(
    models: Sequence[str] | None,
    *,
    size: int,
    limits: Limits | None = None,
    after: Position | None = None,
    before: Position | None = None,
) -> Select[Any]:
    """The next `size` waiting requests in queue order between `after` and `before` (see `_between`) that
    ask for one of `models` or for any model (None: every waiting request), skipping those whose
    lengths exceed `limits`. Rows: (request_id, effective_start, created_at); a request asking for
    two of the models may appear twice, side by side."""
    if models is None or len(set(models)) >= MANY_MODELS:
        r = TextRequest
        key = (r.effective_start, r.created_at, r.id)
        where = [r.state == "waiting", *_between(key, after, before)]
        if limits is not None:
            need_context = case((r.is_chat, r.prompt_tokens + r.max_length), else_=r.max_context_length)
            where.append(_fits(r.is_chat, r.max_length, need_context, limits))
        return (
            select(r.id.label("request_id"), r.effective_start, r.created_at)
            .where(*where)
            .order_by(r.effective_start, r.created_at, r.id)
            .limit(size)
        )
    e = QueueEntry
    key = (e.effective_start, e.created_at, e.request_id)
    fits = _fits(e.is_chat, e.need_length, e.need_context, limits) if limits is not None else true()
    branches = [
        select(e.request_id, e.effective_start, e.created_at)
        .where(e.model == model, fits, *_between(key, after, before))
        .order_by(e.effective_start, e.created_at, e.request_id)
        .limit(size)
        .subquery()
        for model in sorted({*models, ANY_MODEL})
    ]
    # SQLite takes ORDER BY/LIMIT only on a whole compound select: each branch is a subquery.
    merged = union_all(*(select(b.c.request_id, b.c.effective_start, b.c.created_at) for b in branches))
    m = merged.subquery("walk")
    return (
        select(m.c.request_id, m.c.effective_start, m.c.created_at)
        .order_by(m.c.effective_start, m.c.created_at, m.c.request_id)
        .limit(size)
    )


async def walk(
    session: AsyncSession,
    models: Sequence[str] | None,
    *,
    size: int,
    limits: Limits | None = None,
    before: Position | None = None,
    columns: Sequence[Any] = (),
) -> AsyncIterator[list[Any]]:
    """Pages of the walk in queue order (see `page`), until it runs out; the caller stops early
    when it has what it needs. Each page is a list of rows, one per request (first appearance):
    `(request_id, effective_start, created_at, *columns)`, the `columns` (of TextRequest) read in
    the same statement through the primary key; a request gone since its entry was read has them
    all NULL."""
    after: Position | None = None
    while True:
        walked = page(models, size=size, limits=limits, after=after, before=before).subquery("page")
        query = select(walked.c.request_id, walked.c.effective_start, walked.c.created_at, *columns)
        if columns:
            query = query.select_from(walked).outerjoin(TextRequest, TextRequest.id == walked.c.request_id)
        order = (walked.c.effective_start, walked.c.created_at, walked.c.request_id)
        rows = (await session.execute(query.order_by(*order))).all()
        if not rows:
            return
        seen: dict[str, Any] = {}
        for row in rows:
            seen.setdefault(row[0], row)
        yield list(seen.values())
        if len(rows) < size:
            return
        last = rows[-1]
        after = Position(last[1], last[2], last[0])
