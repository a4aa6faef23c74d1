"""Worker messages (upstream's): a note to one worker, or from a moderator to every worker, handed
to the worker with each pop until it expires, so its operator reads it where the worker logs.

- Sending (POST /workers/messages): moderators to any worker or to all (no `worker_id`), with an
  origin of their choice; a user only to its own workers, the origin being its id, and at most
  `[messages] max_active_per_user` unexpired at once (owner_limits). Lifetime: 1 hour to 30 days.
- Reading: one message by id is public (upstream); the listing shows a user what concerns it (what
  it sent, what was sent to its workers, and what was sent to every worker); a moderator may list
  any user's or everything.
- Deleting: the sender or a moderator.
- A pop asks whether the worker has an unexpired message inside the statement that reads its owner
  and worker (`any_live`), and reads them only when it has.
- Expired messages stay listable for `[messages] keep_expired_days`, then the sweep deletes them.
"""

from __future__ import annotations

import unicodedata
import uuid
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import ColumnElement, bindparam, delete, exists, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.accounts import owner_limits
from horde_lite.accounts.profiles import Actor, acting_user
from horde_lite.accounts.users import ANONYMOUS_PUBLIC_ID, authenticate_user, public_id
from horde_lite.core.context import Caller, Horde
from horde_lite.core.errors import HordeError
from horde_lite.db.models import User, Worker, WorkerMessage
from horde_lite.inputs import MESSAGE_MAX_HOURS, WorkerMessageInput
from horde_lite.rc import Rc

Validity = Literal["active", "expired", "all"]
PAGE_SIZE = 50  # upstream's page of the listing
MAX_PAGE = 10_000
# The newest unexpired messages a pop carries: a worker's own messages are bounded by its owner's
# limit, but moderators' (to it and to every worker) are not.
POP_MESSAGES = 20
DEFAULT_ORIGIN = "Horde moderators"
HOUR = 3600.0
DAY = 86400.0


@dataclass(frozen=True, slots=True)
class MessageRecord:
    id: str
    worker_id: str | None  # None: to every worker
    user_id: int  # the sender's id (never the anonymous user, who cannot send)
    message: str
    origin: str
    created_at: float
    expires_at: float


def _record(row: WorkerMessage) -> MessageRecord:
    return MessageRecord(
        id=row.id, worker_id=row.worker_id, user_id=row.user_id, message=row.message,
        origin=row.origin, created_at=row.created_at, expires_at=row.expires_at,
    )  # fmt: skip


def canonical(value: str) -> str | None:
    """An id as the table holds it (a UUID, lowercase with dashes), or None when it is not one."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return None


def any_live(worker_id: ColumnElement[str]) -> ColumnElement[bool]:
    """Whether the worker has an unexpired message, its own or one to every worker (bound parameter
    `now`): two index probes a pop's first statement carries, so a pop without messages reads none."""
    m = WorkerMessage
    live = m.expires_at > bindparam("now")
    return or_(exists().where(m.worker_id == worker_id, live), exists().where(m.worker_id.is_(None), live))


# The newest unexpired messages to a worker and to every worker, built once (a pop may run it).
_LIVE_FOR = (
    select(WorkerMessage)
    .where(
        or_(WorkerMessage.worker_id == bindparam("worker_id"), WorkerMessage.worker_id.is_(None)),
        WorkerMessage.expires_at > bindparam("now"),
    )
    .order_by(WorkerMessage.created_at.desc(), WorkerMessage.id)
    .limit(POP_MESSAGES)
)


async def live_for(session: AsyncSession, worker_id: str, now: float) -> list[MessageRecord]:
    """What a pop hands the worker: its newest unexpired messages, oldest first."""
    rows = (await session.execute(_LIVE_FOR, {"worker_id": worker_id, "now": now})).scalars().all()
    return [_record(m) for m in reversed(rows)]


def _text(value: str, field: str, *, lines: bool) -> str:
    """A message or an origin as stored (`inputs.MESSAGE_PATTERN`, `ORIGIN_PATTERN`): not blank,
    without control characters, but for a message's line breaks and tabs; an origin is trimmed."""
    allowed = "\n\t" if lines else ""
    if any(c not in allowed and unicodedata.category(c) == "Cc" for c in value):
        kinds = "control characters other than line breaks and tabs" if lines else "control characters"
        raise HordeError(Rc.BadRequest, f"{field} may not hold {kinds}.", param=field)
    if not value.strip():
        raise HordeError(Rc.BadRequest, f"{field} may not be blank.", param=field)
    return value if lines else value.strip()


async def send(horde: Horde, who: Actor, body: WorkerMessageInput) -> MessageRecord:
    """POST /workers/messages, and the dashboard's form (a signed-in moderator)."""
    message = _text(body.message, "message", lines=True)
    origin = _text(body.origin, "origin", lines=False) if body.origin is not None else None
    now = horde.clock.now()
    async with horde.transaction() as session:
        sender = await acting_user(session, who, now)
        if sender.anonymous:
            raise HordeError(Rc.AnonForbidden, "The anonymous user cannot send worker messages: use a key.")
        worker_id = None
        if body.worker_id is not None:
            wanted = canonical(body.worker_id)
            worker = await session.get(Worker, wanted) if wanted is not None else None
            if worker is None or worker.deleted_at is not None:
                raise HordeError(Rc.WorkerNotFound, f"No worker with id {body.worker_id[:64]!r}.")
            worker_id = worker.id
            if not sender.moderator and worker.owner_id != sender.id:
                raise HordeError(Rc.MessagesOnlyOwnWorkers, "You can only send messages to your own workers.")
        elif not sender.moderator:
            raise HordeError(
                Rc.MessagesOnlyOwnWorkers,
                "Only a moderator can send a message to every worker; name one of your workers (worker_id).",
            )
        if not sender.moderator:
            origin = str(public_id(sender))  # upstream: a user's messages say who sent them
        await owner_limits.room_for_a_message(session, horde.settings, sender, now)
        row = WorkerMessage(
            id=str(uuid.uuid4()), worker_id=worker_id, user_id=sender.id, message=message,
            origin=origin or DEFAULT_ORIGIN, created_at=now,
            expires_at=now + min(body.expiry, MESSAGE_MAX_HOURS) * HOUR,
        )  # fmt: skip
        session.add(row)
        await session.flush()
        return _record(row)


async def _message(session: AsyncSession, message_id: str) -> WorkerMessage:
    wanted = canonical(message_id)
    row = await session.get(WorkerMessage, wanted) if wanted is not None else None
    if row is None:
        raise HordeError(Rc.WorkermessageNotFound, f"WorkerMessage with ID {message_id[:64]!r} not found.")
    return row


async def show(horde: Horde, message_id: str) -> MessageRecord:
    """GET /workers/messages/{id}: public, as upstream (its id is a random UUID)."""
    async with horde.reading() as session:
        return _record(await _message(session, message_id))


async def remove(horde: Horde, who: Actor, message_id: str) -> None:
    """DELETE /workers/messages/{id}: the sender or a moderator (the dashboard's too)."""
    now = horde.clock.now()
    async with horde.transaction() as session:
        actor = await acting_user(session, who, now)
        row = await _message(session, message_id)
        if row.user_id != actor.id and not actor.moderator:
            raise HordeError(Rc.Forbidden, "You can only delete your own messages.")
        await session.delete(row)


async def listing(
    horde: Horde,
    caller: Caller,
    *,
    user_id: int | None = None,
    worker_id: str | None = None,
    validity: Validity = "active",
    page: int = 1,
) -> list[MessageRecord]:
    """GET /workers/messages: 50 a page, newest first. A user who is not a moderator sees what
    concerns it (sent by it, to its workers, to every worker), and may name only itself in
    `user_id`; a moderator sees everything, or what concerns the user it names."""
    if page > MAX_PAGE:
        return []
    now = horde.clock.now()
    async with horde.transaction() as session:  # the anonymous key may create the anonymous user
        viewer = await authenticate_user(session, caller.apikey, now)
        if not viewer.moderator and user_id is not None and user_id != public_id(viewer):
            raise HordeError(Rc.Forbidden, "You can only view your own messages.")
        m = WorkerMessage
        query = select(m)
        about: int | None = viewer.id if not viewer.moderator else None
        if user_id is not None and viewer.moderator:
            about = await _user_row_id(session, user_id)
            if about is None:
                return []
        if about is not None:
            theirs = select(Worker.id).where(Worker.owner_id == about)
            query = query.where(or_(m.user_id == about, m.worker_id.in_(theirs), m.worker_id.is_(None)))
        if worker_id is not None:
            query = query.where(m.worker_id == (canonical(worker_id) or ""))
        if validity == "active":
            query = query.where(m.expires_at > now)
        elif validity == "expired":
            query = query.where(m.expires_at <= now)
        query = query.order_by(m.created_at.desc(), m.id)
        query = query.offset((max(page, 1) - 1) * PAGE_SIZE).limit(PAGE_SIZE)
        rows = (await session.execute(query)).scalars().all()
    return [_record(row) for row in rows]


async def _user_row_id(session: AsyncSession, user_id: int) -> int | None:
    """The row id of the user with that public id (0: the anonymous user), None for nobody."""
    if user_id == ANONYMOUS_PUBLIC_ID:
        found = select(User.id).where(User.anonymous.is_(True))
    else:
        found = select(User.id).where(User.id == user_id, User.anonymous.is_(False))
    return (await session.execute(found)).scalar_one_or_none()


@dataclass(frozen=True, slots=True)
class ListedMessage:
    """A message as the dashboard lists it: with its worker's name (None: to every worker)."""

    record: MessageRecord
    worker_name: str | None
    expired: bool


async def recent(horde: Horde, limit: int = PAGE_SIZE) -> list[ListedMessage]:
    """The newest messages, expired or not, for the dashboard's panel."""
    now = horde.clock.now()
    query = (
        select(WorkerMessage, Worker.name)
        .outerjoin(Worker, Worker.id == WorkerMessage.worker_id)
        .order_by(WorkerMessage.created_at.desc(), WorkerMessage.id)
        .limit(limit)
    )
    async with horde.reading() as session:
        rows = (await session.execute(query)).tuples().all()
    return [ListedMessage(_record(m), name, m.expires_at <= now) for m, name in rows]


async def trim(session: AsyncSession, now: float, keep_expired_days: int) -> int:
    """Delete the messages expired more than `keep_expired_days` days ago (0 keeps them); the rows
    deleted."""
    if keep_expired_days <= 0:
        return 0
    cutoff = now - keep_expired_days * DAY
    result = await session.execute(delete(WorkerMessage).where(WorkerMessage.expires_at < cutoff))
    return int(getattr(result, "rowcount", 0) or 0)
