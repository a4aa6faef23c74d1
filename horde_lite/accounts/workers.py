"""Workers: check-in (every pop), names, measured lease speed and capacity, the public records,
maintenance, pause, info, rename, team and deletion."""

from __future__ import annotations

import math
import re
import unicodedata
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from sqlalchemy import ColumnElement, Select, bindparam, delete, inspect, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import make_transient_to_detached
from sqlalchemy.orm.attributes import set_committed_value

from horde_lite.accounts import flagged, owner_limits
from horde_lite.accounts.users import authenticate_user, hash_key, is_anonymous_key, split_name
from horde_lite.accounts.worker_messages import any_live
from horde_lite.core.context import Caller, Horde
from horde_lite.core.errors import HordeError
from horde_lite.core.modes import MODES_OFF, HordeModes
from horde_lite.db.change_log import CHECK_IN_NOTED_JUMP
from horde_lite.db.models import Team, User, Worker, WorkerModel
from horde_lite.inputs import NAME_CHARACTERS, PopInput, WorkerUpdate
from horde_lite.rc import Rc
from horde_lite.settings import Settings

# What a new worker name may hold, after Unicode NFKC normalization (which maps full-width and other
# compatibility forms onto ASCII): ASCII only, so no homoglyph from another script (Cyrillic U+0430 for
# Latin 'a') can pass as an existing name.
_NAME_CHARS = re.compile(f"[{NAME_CHARACTERS}]+")
NAME_RULE = "ASCII letters, digits, spaces and - _ . ( ) [ ] '"
# Seconds a stored check-in may lag the worker's last pop (`check_in_is_due`).
CHECK_IN_RESOLUTION = CHECK_IN_NOTED_JUMP / 2

T = TypeVar("T")


def _spaced(name: str) -> str:
    """NFKC, trimmed, inner whitespace runs as one space: the form a name is stored and shown in."""
    return " ".join(unicodedata.normalize("NFKC", name).split())


def worker_name_key(name: str) -> str:
    """What two worker names are compared by: the stored form, case-folded. Names that differ only
    by case, Unicode form or spacing have one key; `workers.name_key` is unique."""
    return unicodedata.normalize("NFKC", _spaced(name).casefold())[:100]


def clean_name(name: str, what: str = "worker", shortest: int = 1) -> str:
    """A new worker or team name as stored, or BadRequest if it breaks the name rule (the same
    for both, so neither can pose as another by a homoglyph)."""
    spaced = _spaced(name)
    if not shortest <= len(spaced) <= 100:
        raise HordeError(Rc.BadRequest, f"A {what} name must be {shortest} to 100 characters after trimming.")
    if not _NAME_CHARS.fullmatch(spaced):
        raise HordeError(Rc.BadRequest, f"A {what} name may use only {NAME_RULE}; {name[:100]!r} does not.")
    return spaced


def clean_worker_name(name: str) -> str:
    """A new name (first pop, rename) as stored, or BadRequest if it breaks the name rule."""
    return clean_name(name)


def effective_speed(lease_speed: float | None, settings: Settings) -> float:
    """The measured lease speed, or the assumed one while the worker is unmeasured."""
    return settings.speed.assumed_tokens_per_second if lease_speed is None else lease_speed


def capacity_for(lease_speed: float | None, settings: Settings) -> int:
    """floor(speed x (base lease - preparation allowance))."""
    return math.floor(effective_speed(lease_speed, settings) * settings.lease.generation_window_seconds)


def record_speed_sample(worker: Worker, tokens: int, seconds: float, settings: Settings) -> float:
    """Add one tokens-per-second-of-lease sample; the stored speed is the mean of the newest ones."""
    sample = tokens / max(seconds, 1e-3)
    samples = [*list(worker.speed_samples or []), round(sample, 4)][-settings.speed.samples :]
    worker.speed_samples = samples
    worker.lease_speed = sum(samples) / len(samples)
    worker.capacity = capacity_for(worker.lease_speed, settings)
    return sample


async def _priority_user_ids(db: AsyncSession | AsyncConnection, names: list[str]) -> list[int]:
    """Resolve `priority_usernames` in one query (this runs on every pop). "name#id" must name the
    user with that id, as the CLI's lookup does; a bare name matches by name."""
    wanted: list[tuple[str, int | None]] = []
    for name in names[:50]:
        parsed = split_name(name)
        if parsed is None or (parsed[1] is not None and parsed[1] >= 2**31 - 1):
            continue  # names nobody (a non-ASCII digit), or an id beyond the id column's range
        wanted.append(parsed)
    if not wanted:
        return []
    rows = await db.execute(
        select(User.id, User.username).where(User.username.in_({base for base, _ in wanted}))
    )
    by_name = {username: user_id for user_id, username in rows}
    ids: list[int] = []
    for base, uid in wanted:
        found = by_name.get(base)
        if found is not None and uid in (None, found) and found not in ids:
            ids.append(found)
    return ids


# Built once (every pop runs it): a reused statement keeps its SQLAlchemy cache key.
_WORKER_BY_KEY_LOCKED = select(Worker).where(Worker.name_key == bindparam("key")).with_for_update()


def _owner_and_named(*columns: Any) -> Select[Any]:
    """The key's user and the named worker's row in one statement: a pop's common case, with whether
    the worker has an unexpired message (so a pop without one reads none). Joined on the name alone:
    a worker of another owner is found, and refused by `check_in`."""
    return (
        select(*columns, any_live(Worker.id))
        .join_from(User, Worker, Worker.name_key == bindparam("key"))
        .where(User.api_key_hash == bindparam("digest"))
    )


_OWNER_AND_WORKER = _owner_and_named(User, Worker).with_for_update(of=Worker)  # for a check-in that may write


# The look's read of the same rows as Core columns (`look_up`), in the mappers' attribute order.
_USER_ATTRS = inspect(User).column_attrs
_WORKER_ATTRS = inspect(Worker).column_attrs
_OWNER_AND_NAMED_COLUMNS = _owner_and_named(*(a.columns[0] for a in (*_USER_ATTRS, *_WORKER_ATTRS)))


def owner_and_named_with(*columns: ColumnElement[Any]) -> Select[Any]:
    """The unlocked statement of `look_up` with more columns, which may refer to the worker's row
    (`Named.extra`); build it once and pass it as `statement`."""
    return _OWNER_AND_NAMED_COLUMNS.add_columns(*columns)


@dataclass(frozen=True, slots=True)
class Named:
    """A pop's owner and the worker it names, and whether the worker has an unexpired message."""

    owner: User
    worker: Worker | None  # None: no worker of that name yet (a first pop), or not looked up
    has_messages: bool  # True also when not known (the pop then reads them)
    extra: tuple[Any, ...] = ()  # the columns a caller's `statement` adds (`owner_and_named_with`)


async def owner_and_worker(session: AsyncSession, apikey: str | None, name: str, now: float) -> Named | None:
    """The key's user and its named worker in one statement, the worker's row locked for a
    check-in; None for the anonymous key or when either is missing."""
    if is_anonymous_key(apikey):
        return None
    values = {"digest": hash_key(apikey), "key": worker_name_key(name), "now": now}
    found = (await session.execute(_OWNER_AND_WORKER, values)).one_or_none()
    if found is None:
        return None
    return Named(found[0], found[1], bool(found[2]))


async def look_up(
    conn: AsyncConnection,
    apikey: str | None,
    name: str,
    now: float,
    statement: Select[Any],
    values: dict[str, Any],
) -> Named | None:
    """`owner_and_worker`'s rows unlocked, read as Core rows on a connection outside any session (an idle
    pop's one statement, whose ORM load cost more than the statement): `statement` from
    `owner_and_named_with`, executed with `values` besides the key's and the name's. The owner and
    the worker are detached instances, as a closed session leaves those it loaded."""
    if is_anonymous_key(apikey):
        return None
    values = {**values, "digest": hash_key(apikey), "key": worker_name_key(name), "now": now}
    row = (await conn.execute(statement, values)).one_or_none()
    if row is None:
        return None
    users, workers = len(_USER_ATTRS), len(_USER_ATTRS) + len(_WORKER_ATTRS)
    owner = _loaded(User, _USER_ATTRS, row[:users])
    worker = _loaded(Worker, _WORKER_ATTRS, row[users:workers])
    return Named(owner, worker, bool(row[workers]), tuple(row[workers + 1 :]))


def _loaded(model: type[T], attrs: Any, values: Sequence[Any]) -> T:
    """An instance as a query loads it: its columns set, no changes pending, detached."""
    instance = model(**{a.key: value for a, value in zip(attrs, values, strict=True)})
    make_transient_to_detached(instance)
    return instance


async def authenticate_worker(session: AsyncSession, apikey: str | None, body: PopInput, now: float) -> Named:
    """A pop's owner (a registered user's own key) and, when it exists, the worker it names,
    locked for `check_in`. An existing worker popping with its owner's key takes one statement;
    anything else (a first pop, another kind of key, no match) takes the general path, which finds
    the owner or raises, and leaves the worker to `check_in`."""
    found = await owner_and_worker(session, apikey, body.name, now)
    if found is not None:
        return found
    return Named(await authenticate_user(session, apikey, now), None, has_messages=True)


def check_in_is_due(last: float, now: float) -> bool:
    """Whether a pop writes its check-in time. A worker polling every second would otherwise update
    its row at every pop, most of them finding nothing. Kept to within half the jump the change log
    notes, a polling worker's check-ins are never noted (as before, when each pop wrote one), and a
    worker that stops goes offline at most that much sooner. A clock that moved back writes at once."""
    return not last <= now < check_in_due_at(last)


def check_in_due_at(last: float) -> float:
    """When a check-in made at `last` is due again (from then on, `check_in_is_due`)."""
    return last + CHECK_IN_RESOLUTION


async def check_in(
    session: AsyncSession,
    owner: User,
    body: PopInput,
    settings: Settings,
    now: float,
    *,
    worker: Worker | None = None,
    modes: HordeModes = MODES_OFF,
    address: str | None = None,
) -> Worker:
    """Create the worker on its first pop, else store its new declarations. Raises for a name
    owned by someone else, for the anonymous user, and for an owner at its limit of workers or
    beyond its invitation under the horde's `modes` (the pop that would create one more; its
    existing workers keep working). `worker`: the named worker's row, when the caller has read it
    locked (`authenticate_worker`). `address`: the pop's (`ip_rule.stored_address`), kept as the
    worker's last; None keeps the one it has."""
    if owner.anonymous:
        raise HordeError(Rc.AnonForbiddenWorker, "Anonymous users cannot run workers; register a key.")
    flagged.refuse_worker(owner)  # before a first pop creates a worker, too
    # The row lock serializes concurrent check-ins of one worker (a worker's threads pop at once),
    # so their model lists never race. A worker is found by its name's key, so "Bob", "bob " and
    # full-width "Bob" are one worker; a name no worker holds yet must pass the name rule.
    key = worker_name_key(body.name)
    if worker is None:
        worker = (await session.execute(_WORKER_BY_KEY_LOCKED, {"key": key})).scalar_one_or_none()
    if worker is None:
        worker = await _create(session, owner, body.name, key, settings, now, modes)
    if worker.owner_id != owner.id:
        raise HordeError(Rc.WrongCredentials, f"The worker name {body.name!r} belongs to another user.")
    models = declared_models(body)
    priority_user_ids = await _priority_user_ids(session, body.priority_usernames)
    for column, value in _declared(worker, owner, body, priority_user_ids, settings).items():
        setattr(worker, column, value)
    owner_limits.hold_in_maintenance(worker, owner, settings, now)
    if check_in_is_due(worker.last_check_in, now):
        worker.last_check_in = now
    if address is not None and worker.ipaddr != address:
        worker.ipaddr = address
    if worker.models != models:
        worker.models = models
        await session.flush()
        await session.execute(delete(WorkerModel).where(WorkerModel.worker_id == worker.id))
        session.add_all(WorkerModel(worker_id=worker.id, model=m) for m in models)
    await session.flush()
    return worker


async def _create(
    session: AsyncSession,
    owner: User,
    wanted: str,
    key: str,
    settings: Settings,
    now: float,
    modes: HordeModes,
) -> Worker:
    """A first pop's new worker, within the owner's limit of workers. The owner's users row is
    locked first, so concurrent first pops count one after the other; one that waited looks for
    the name again, which the other may have created meanwhile (then it is that worker)."""
    name = clean_worker_name(wanted)
    await owner_limits.lock_user(session, owner)
    worker = (await session.execute(_WORKER_BY_KEY_LOCKED, {"key": key})).scalar_one_or_none()
    if worker is not None:
        return worker
    await owner_limits.room_for_a_worker(session, settings, owner, modes)
    try:
        async with session.begin_nested():
            worker = Worker(
                id=str(uuid.uuid4()), name=name, name_key=key, owner_id=owner.id, created_at=now,
                last_check_in=now, speed_samples=[],
            )  # fmt: skip
            session.add(worker)
            await session.flush()
    except IntegrityError:  # another owner's pop created this name first (PostgreSQL)
        worker = (await session.execute(_WORKER_BY_KEY_LOCKED, {"key": key})).scalar_one()
    return worker


def declared_models(body: PopInput) -> list[str]:
    return list(dict.fromkeys(m.strip() for m in body.models if m.strip()))[:100]


def _declared(
    worker: Worker, owner: User, body: PopInput, priority_user_ids: list[int], settings: Settings
) -> dict[str, Any]:
    """The worker's columns a check-in sets from its pop (and its owner), besides the models and the
    check-in time: the one list both `check_in` and `check_in_need` read."""
    chat = body.chat
    return {
        "trusted": owner.trusted,
        "max_length": body.max_length,
        "max_context_length": body.max_context_length,
        "threads": body.threads,
        "bridge_agent": body.bridge_agent[:255],
        "nsfw": body.nsfw,
        "priority_user_ids": priority_user_ids,
        "chat_max_completion_tokens": chat.max_completion_tokens if chat else None,
        "chat_max_context_tokens": chat.max_context_tokens if chat else None,
        "chat_features": sorted(set(chat.features)) if chat else [],
        "chat_image_transports": sorted(set(chat.image_transports)) if chat else [],
        "capacity": capacity_for(worker.lease_speed, settings),
    }


CheckInNeed = Literal["nothing", "time", "all"]


async def check_in_need(
    db: AsyncSession | AsyncConnection,
    worker: Worker,
    owner: User,
    body: PopInput,
    settings: Settings,
    now: float,
    address: str | None = None,
) -> CheckInNeed:
    """What `check_in` would write for this pop, read without writing (`worker` is left as it
    was): "nothing"; only the check-in "time" and the address (`stamp_check_in` does that); or
    "all", for a changed declaration, owner's trust or capacity (and for a pop `check_in` refuses)."""
    if owner.anonymous or worker.owner_id != owner.id or worker.models != declared_models(body):
        return "all"
    if owner_limits.cooling(owner, now) and not worker.maintenance:
        return "all"  # the check-in puts it back into maintenance
    priority_user_ids = await _priority_user_ids(db, body.priority_usernames)
    declared = _declared(worker, owner, body, priority_user_ids, settings)
    if any(getattr(worker, column) != value for column, value in declared.items()):
        return "all"
    moved = address is not None and worker.ipaddr != address
    return "time" if moved or check_in_is_due(worker.last_check_in, now) else "nothing"


# A check-in that changes nothing but its time and address: one statement, no ORM flush, no row read
# first. Not of a worker deleted since the pop read it: that would bring it back online and hand it
# a job.
_STAMP = (
    update(Worker)
    .where(Worker.id == bindparam("worker_id"), Worker.deleted_at.is_(None))
    .values(last_check_in=bindparam("now"), ipaddr=bindparam("ipaddr"))
)


async def stamp_check_in(
    session: AsyncSession, worker: Worker, now: float, address: str | None = None
) -> None:
    """`address`: the pop's, as `check_in` takes it (None keeps the worker's)."""
    ipaddr = worker.ipaddr if address is None else address
    conn = await session.connection()
    await conn.execute(_STAMP, {"worker_id": worker.id, "now": now, "ipaddr": ipaddr})
    set_committed_value(worker, "last_check_in", now)
    set_committed_value(worker, "ipaddr", ipaddr)


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """A worker's public record: its row and what is derived from it at read time."""

    worker: Worker
    online: bool
    speed: float  # the measured lease speed, or the assumed one while unmeasured
    assumed_speed: float
    team_name: str | None  # its team's (worker.team_id), None without one
    owner_flagged: bool = False  # its owner is flagged: it gets no jobs (accounts/flagged.py)


@dataclass(frozen=True, slots=True)
class WorkerChange:
    """What PUT /workers/{id} changed: only the fields it set are not None (upstream's answer)."""

    maintenance: bool | None = None
    paused: bool | None = None
    info: str | None = None
    name: str | None = None
    team: str | None = None


@dataclass(frozen=True, slots=True)
class DeletedWorker:
    id: str
    name: str


def _record(
    worker: Worker, team_name: str | None, owner_flagged: bool, settings: Settings, now: float
) -> WorkerRecord:
    return WorkerRecord(
        worker=worker,
        online=worker.last_check_in >= now - settings.worker.online_seconds,
        speed=effective_speed(worker.lease_speed, settings),
        assumed_speed=settings.speed.assumed_tokens_per_second,
        team_name=team_name,
        owner_flagged=owner_flagged,
    )


# Workers with their team's name (None without one) and whether their owner is flagged.
_WITH_TEAM = (
    select(Worker, Team.name, User.flagged)
    .join(User, User.id == Worker.owner_id)
    .outerjoin(Team, Team.id == Worker.team_id)
)


async def _live_worker(session: AsyncSession, worker_id: str, *, lock: bool = False) -> Worker:
    """A worker that has not been deleted, by id (anything that is not an id finds nothing)."""
    worker = None
    if len(worker_id) <= 36 and "\x00" not in worker_id:
        worker = await session.get(Worker, worker_id, with_for_update=lock or None)
    if worker is None or worker.deleted_at is not None:
        raise HordeError(Rc.WorkerNotFound, f"No worker with id {worker_id[:64]!r}.")
    return worker


async def last_address(session: AsyncSession, worker_id: str) -> tuple[str, str | None]:
    """A live worker's id and the address its last pop came from (None: none recorded yet), for a
    moderator's block of it; WorkerNotFound for an id that names no live worker."""
    worker = await _live_worker(session, worker_id)
    return worker.id, worker.ipaddr


async def list_workers(
    horde: Horde, *, name: str | None = None, kind: str | None = None
) -> list[WorkerRecord]:
    """The online workers (GET /workers), optionally one name (compared by its key) or one type."""
    if kind not in (None, "text", "all"):
        return []  # horde_lite serves text only
    now = horde.clock.now()
    query = _WITH_TEAM.where(Worker.last_check_in >= now - horde.settings.worker.online_seconds)
    query = query.where(Worker.deleted_at.is_(None))
    if name is not None:
        query = query.where(Worker.name_key == worker_name_key(name))
    async with horde.reading() as session:
        rows = (await session.execute(query.order_by(Worker.name))).tuples().all()
    return [_record(w, team_name, owner_flagged, horde.settings, now) for w, team_name, owner_flagged in rows]


async def worker_by_id(horde: Horde, worker_id: str) -> WorkerRecord:
    """One worker, online or not (GET /workers/{id})."""
    async with horde.reading() as session:
        worker = await _live_worker(session, worker_id)
        team_name, owner_flagged = await _team_and_owner(session, worker)
    return _record(worker, team_name, owner_flagged, horde.settings, horde.clock.now())


async def worker_by_name(horde: Horde, name: str) -> WorkerRecord:
    """One worker by name, compared by its key (GET /workers/name/{name})."""
    async with horde.reading() as session:
        query = _WITH_TEAM.where(Worker.name_key == worker_name_key(name))
        found = (await session.execute(query)).tuples().one_or_none()
    if found is None:
        raise HordeError(Rc.WorkerNotFound, f"No worker named {name[:100]!r}.")
    return _record(found[0], found[1], found[2], horde.settings, horde.clock.now())


async def _team_and_owner(session: AsyncSession, worker: Worker) -> tuple[str | None, bool]:
    """The worker's team's name (None without one) and whether its owner is flagged."""
    team = select(Team.name).where(Team.id == worker.team_id).scalar_subquery()
    found = await session.execute(select(team, User.flagged).where(User.id == worker.owner_id))
    team_name, owner_flagged = found.one()
    return team_name, bool(owner_flagged)


def _owner_or_moderator(actor: User, worker: Worker, what: str) -> None:
    if worker.owner_id != actor.id and not actor.moderator:
        raise HordeError(Rc.WrongCredentials, f"Only the worker's owner or a moderator can {what}.")


async def _acting_user(session: AsyncSession, caller: Caller, now: float) -> User:
    actor = await authenticate_user(session, caller.apikey, now)
    if actor.anonymous:
        raise HordeError(Rc.AnonForbiddenWorker, "The anonymous user cannot change workers; use your key.")
    return actor


async def _rename(session: AsyncSession, worker: Worker, wanted: str) -> str:
    """Rename under the name rule; a name another worker holds (up to its key) is refused."""
    name = clean_worker_name(wanted)
    key = worker_name_key(name)
    if key != worker.name_key:
        taken = await session.execute(select(Worker.id).where(Worker.name_key == key))
        if taken.first() is not None:
            raise HordeError(Rc.WorkerNameAlreadyExists, f"The worker name {name!r} is already taken.")
    try:
        async with session.begin_nested():
            worker.name, worker.name_key = name, key
            await session.flush()
    except IntegrityError:  # another rename or first pop took it meanwhile (PostgreSQL)
        raise HordeError(Rc.WorkerNameAlreadyExists, f"The worker name {name!r} is already taken.") from None
    return name


async def _lifting(session: AsyncSession, actor: User, worker: Worker, now: float) -> None:
    """Maintenance lifted while the owner's failure cool-down runs: refused to the owner; a
    moderator's lift ends the cool-down (else the worker's next check-in would put it back). The
    owner's users row is locked after the worker's (docs/explanation/locking.md)."""
    owner = await session.get(User, worker.owner_id, with_for_update=True, populate_existing=True)
    if owner is None or not owner_limits.cooling(owner, now):
        return
    if not actor.moderator:
        owner_limits.refuse_early_lift(owner, now)
    owner.failure_cooldown_until = 0.0


async def _team_to_join(session: AsyncSession, worker: Worker, team_id: str) -> Team | None:
    """The team a worker joins ("": none). Read FOR SHARE, so a deletion of it running meanwhile
    either waits for this join (and then takes the worker out) or ends first (TeamNotFound)."""
    from horde_lite.accounts import teams  # teams imports this module

    if not team_id:
        return None
    return await teams.find_team(session, team_id, share=team_id != worker.team_id)


async def modify_worker(horde: Horde, caller: Caller, worker_id: str, body: WorkerUpdate) -> WorkerChange:
    """PUT /workers/{id}. Maintenance, info, name and team: the owner or a moderator; paused:
    moderators only. Every permission is checked, and the team found, before anything changes."""
    wants_maintenance = body.maintenance is not None or body.maintenance_msg is not None
    if not (wants_maintenance or body.paused is not None or body.info is not None or body.name is not None
            or body.team is not None):  # fmt: skip
        raise HordeError(Rc.NoWorkerModSelected, "No worker modification selected.")
    async with horde.transaction() as session:
        actor = await _acting_user(session, caller, horde.clock.now())
        worker = await _live_worker(session, worker_id, lock=True)
        if wants_maintenance or body.info is not None or body.name is not None or body.team is not None:
            _owner_or_moderator(actor, worker, "change its maintenance, info, name or team")
        if body.paused is not None and not actor.moderator:
            raise HordeError(Rc.NotModerator, "Only a moderator can pause a worker.")
        team = await _team_to_join(session, worker, body.team) if body.team is not None else None
        if body.maintenance is False and worker.maintenance:
            await _lifting(session, actor, worker, horde.clock.now())
        if body.maintenance is not None:
            worker.maintenance = body.maintenance
        if body.maintenance_msg is not None:
            worker.maintenance_msg = body.maintenance_msg[:255]
        if body.paused is not None:
            worker.paused = body.paused
        if body.info is not None:
            worker.info = body.info
        if body.team is not None:
            worker.team_id = team.id if team is not None else None
        name = await _rename(session, worker, body.name) if body.name is not None else None
        await session.flush()
        return WorkerChange(
            maintenance=worker.maintenance if wants_maintenance else None,
            paused=worker.paused if body.paused is not None else None,
            info=worker.info if body.info is not None else None,
            name=name,
            # Upstream's answer: the team's name, or "None" for no team.
            team=(team.name if team is not None else "None") if body.team is not None else None,
        )


def retired(now: float) -> dict[str, Any]:
    """What deleting a worker sets (DELETE /workers/{id}, and a deleted user's workers): marked
    deleted, its name free, out of its team, and offline at once for every reader (each one's online
    test is the last check-in's age), so it never counts as capacity, capable or eligible."""
    return {"deleted_at": now, "name_key": None, "last_check_in": 0.0, "team_id": None}


async def delete_worker(horde: Horde, caller: Caller, worker_id: str) -> DeletedWorker:
    """DELETE /workers/{id}: the owner or a moderator. The row stays, marked deleted and without a
    name key: it leaves every listing, its name is free for a new worker, and its history stays
    (finished requests still name it, its owner's ledger is untouched). A job it holds keeps its
    lease: the owner may still submit it, else it lapses back to the queue like any other. It is
    offline from that moment: no reader counts it."""
    async with horde.transaction() as session:
        actor = await _acting_user(session, caller, horde.clock.now())
        worker = await _live_worker(session, worker_id, lock=True)
        _owner_or_moderator(actor, worker, "delete it")
        for column, value in retired(horde.clock.now()).items():
            setattr(worker, column, value)
        await session.flush()
        return DeletedWorker(id=worker.id, name=worker.name)
