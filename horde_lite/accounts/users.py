"""Users, API keys and shared keys. Keys are stored as SHA-256 hashes, never in clear."""

from __future__ import annotations

import hashlib
import re
import secrets
import unicodedata
import uuid
from dataclasses import dataclass

from sqlalchemy import bindparam, delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.core.errors import HordeError
from horde_lite.db.models import Generation, SharedKey, TextRequest, User, Worker
from horde_lite.rc import Rc

ANONYMOUS_KEY = "0000000000"
ANONYMOUS_NAME = "Anonymous"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def is_anonymous_key(apikey: str | None) -> bool:
    """No key, or the anonymous key: the caller is the anonymous user."""
    return not apikey or apikey == ANONYMOUS_KEY


def new_api_key() -> str:
    """22 characters: the horde-sdk refuses any other length (except UUIDs and the anonymous key).

    Never with a leading `-`: worker bridges and scripts take the key as a command-line value, and
    argparse reads `--apikey -abc...` as a missing value (1 key in 64 would fail that way).
    """
    while (key := secrets.token_urlsafe(16)).startswith("-"):
        pass
    return key


# The anonymous user's id as clients see it: upstream's `Anonymous#0`, which KoboldAI Lite
# special-cases. Its row has an ordinary autoincrement id that is never shown.
ANONYMOUS_PUBLIC_ID = 0


def public_id(user: User) -> int:
    return ANONYMOUS_PUBLIC_ID if user.anonymous else user.id


def display_name(user: User) -> str:
    return f"{user.username}#{public_id(user)}"


@dataclass(frozen=True, slots=True)
class Requester:
    """Who is asking: the paying user, and the shared key they came through, if any."""

    user: User
    shared_key: SharedKey | None = None
    locked: bool = False  # the user's row is locked FOR UPDATE in this transaction (`authenticate`)

    @property
    def kind(self) -> str:
        if self.shared_key is not None:
            return "shared_key"
        return "anonymous" if self.user.anonymous else "registered"


# The statements every call runs, built once: a statement object keeps its SQLAlchemy cache key, so
# reusing it skips building the query and its key at each call (the values are bound parameters).
_ANONYMOUS = select(User).where(User.anonymous.is_(True))
_USER_BY_KEY = select(User).where(User.api_key_hash == bindparam("digest"))
_USER_BY_KEY_LOCKED = _USER_BY_KEY.with_for_update().execution_options(populate_existing=True)
_SHARED_BY_KEY = select(SharedKey).where(SharedKey.key_hash == bindparam("digest"))


async def ensure_anonymous(session: AsyncSession, now: float) -> User:
    query = _ANONYMOUS
    user = (await session.execute(query)).scalar_one_or_none()
    if user is None:
        try:
            async with session.begin_nested():
                user = User(
                    username=ANONYMOUS_NAME,
                    api_key_hash=hash_key(ANONYMOUS_KEY),
                    anonymous=True,
                    created_at=now,
                )
                session.add(user)
                await session.flush()
        except IntegrityError:  # another first anonymous request created it (PostgreSQL)
            user = (await session.execute(query)).scalar_one()
    return user


USERNAME_MAX = 100  # the column's length


def _hidden(char: str) -> bool:
    """Control, format (zero-width, bidi), surrogate, private-use, unassigned and line or paragraph
    separator characters: none shows as itself, so a name holding one could pass for another."""
    category = unicodedata.category(char)
    return category.startswith("C") or category in ("Zl", "Zp")


def checked_username(username: str) -> str:
    """A name as it would be stored, or the refusal naming the rule: NFKC-normalised (fullwidth and
    other compatibility forms fold to the plain letters) and stripped; 1 to 100 characters, none of
    them hidden (`_hidden`), no '#', not the anonymous user's name."""
    name = unicodedata.normalize("NFKC", username).strip()
    if not name:
        raise HordeError(Rc.BadRequest, "A username must not be empty.", param="username")
    if len(name) > USERNAME_MAX:
        raise HordeError(
            Rc.TooLongUserName, f"A username is at most {USERNAME_MAX} characters.", param="username"
        )
    if any(_hidden(c) for c in name):
        raise HordeError(
            Rc.BadRequest,
            "A username may not hold control, format or unassigned characters.",
            param="username",
        )
    if name.casefold() == ANONYMOUS_NAME.casefold() or "#" in name:
        raise HordeError(
            Rc.BadRequest, f"{name!r} is reserved or contains '#'; pick another name.", param="username"
        )
    return name


async def valid_username(session: AsyncSession, username: str, *, renaming: User | None = None) -> str:
    """The name a new user (or a rename) gets (`checked_username`), if no other user has it:
    compared exactly and, for an ASCII name, without regard to case. The unique column backs the
    exact comparison."""
    name = checked_username(username)
    # SQLite's lower() folds ASCII only, PostgreSQL's every script: ASCII names compare the same
    # on both, others exactly.
    same = User.username == name
    if name.isascii():
        same = func.lower(User.username) == name.lower()
    taken = select(User.id).where(same)
    if renaming is not None:
        taken = taken.where(User.id != renaming.id)
    if (await session.execute(taken)).first() is not None:
        raise _name_taken(name)
    return name


async def create_user(
    session: AsyncSession, username: str, now: float, *, trusted: bool = False, moderator: bool = False
) -> tuple[User, str]:
    """Create a user and return it with its new key (shown once; only the hash is kept)."""
    username = await valid_username(session, username)
    key = new_api_key()
    user = User(
        username=username, api_key_hash=hash_key(key), trusted=trusted, moderator=moderator, created_at=now
    )
    try:
        async with session.begin_nested():
            session.add(user)
            await session.flush()
    except IntegrityError:  # the same name, created meanwhile by another transaction
        raise _name_taken(username) from None
    return user, key


async def rename(session: AsyncSession, user: User, username: str) -> str:
    """Give the user another name, under the rules of a new one (`valid_username`); returns it."""
    if user.anonymous or is_deleted(user):
        raise HordeError(
            Rc.BadRequest, "The anonymous user and deleted users keep their names.", param="username"
        )
    name = await valid_username(session, username, renaming=user)
    try:
        async with session.begin_nested():
            await session.execute(update(User).where(User.id == user.id).values(username=name))
    except IntegrityError:
        raise _name_taken(name) from None
    await session.refresh(user, ["username"])
    return name


def _name_taken(name: str) -> HordeError:
    return HordeError(Rc.NameAlreadyExists, f"A user named {name!r} already exists.", param="username")


# ASCII digits only: str.isdigit() and int() also take fullwidth and Arabic-Indic digits (U+FF11,
# U+0661), so "bob#" + U+FF11 would read as bob's id 1; and "²" passes isdigit() but not int().
_ID_DIGITS = re.compile(r"[0-9]+")
# The id column is 32-bit: an id of more digits names no user (and int() refuses strings beyond
# Python's digit limit, which a path or a name may carry).
_ID_MAX = 2**31 - 1


def user_id_part(uid: str) -> int | None:
    """The id of a "name#id": ASCII digits only, at most the id column's range (larger ids come
    back as its maximum, which no user has); None when it is not an id."""
    if not _ID_DIGITS.fullmatch(uid):
        return None
    digits = uid.lstrip("0") or "0"
    return _ID_MAX if len(digits) > len(str(_ID_MAX)) else min(int(digits), _ID_MAX)


def split_name(username: str) -> tuple[str, int | None] | None:
    """A "name#id" as (name, id), a bare name as (name, None); None when a '#' is followed by
    anything but ASCII digits (a fullwidth "1", "bob#", "bob#1a"), which names nobody rather than the
    bare name."""
    name, hash_sign, uid = username.partition("#")
    if not hash_sign:
        return name, None
    user_id = user_id_part(uid)
    return None if user_id is None else (name, user_id)


async def find_by_name(session: AsyncSession, username: str) -> User:
    parsed = split_name(username)
    if parsed is None:
        raise HordeError(Rc.UserNotFound, f"No user named {username!r}.")
    name, user_id = parsed
    # "name#id" must name the user with that id; a bare name is looked up by name.
    query = select(User).where(User.username == name)
    if user_id == ANONYMOUS_PUBLIC_ID:
        query = query.where(User.anonymous.is_(True))
    elif user_id is not None:
        query = query.where(User.id == user_id, User.anonymous.is_(False))
    user = (await session.execute(query)).scalar_one_or_none()
    if user is None:
        raise HordeError(Rc.UserNotFound, f"No user named {username!r}.")
    return user


async def authenticate(
    session: AsyncSession, apikey: str | None, now: float, *, lock: bool = False
) -> Requester:
    """Resolve an `apikey` header: a user's key, a shared key, or the anonymous key (the default).
    `lock`: a registered user's row (a shared key's owner) is read FOR UPDATE, in the statement
    that finds it (admission serializes one requester's creations on that row); the anonymous
    user's never is: everyone without a key shares it."""
    if is_anonymous_key(apikey):
        return Requester(await ensure_anonymous(session, now))
    digest = hash_key(apikey)
    found = _USER_BY_KEY_LOCKED if lock else _USER_BY_KEY
    user = (await session.execute(found, {"digest": digest})).scalar_one_or_none()
    if user is not None:
        return Requester(user, locked=lock)
    shared = (await session.execute(_SHARED_BY_KEY, {"digest": digest})).scalar_one_or_none()
    if shared is not None:
        owner = await session.get(User, shared.user_id, with_for_update=lock, populate_existing=lock)
        assert owner is not None
        return Requester(owner, shared, locked=lock)
    raise HordeError(Rc.InvalidAPIKey, "No user matched the provided API key.")


async def authenticate_user(session: AsyncSession, apikey: str | None, now: float) -> User:
    """A registered user's own key: what workers, shared-key management and moderation need."""
    requester = await authenticate(session, apikey, now)
    if requester.shared_key is not None:
        raise HordeError(Rc.WrongCredentials, "A shared key cannot be used for this; use the owner's key.")
    return requester.user


def check_shared_key(
    shared: SharedKey, now: float, max_length: int, cost: float, *, left: float | None = None
) -> None:
    """The shared key's own limits: expiry, token cap and kudos budget. `left` is what the budget
    has left after what the key's unfinished requests reserve (admission reads it under the key's
    row lock); without it, the budget less what was already charged."""
    if shared.expiry is not None and shared.expiry <= now:
        raise HordeError(Rc.SharedKeyExpired, "This shared key has expired.")
    if shared.kudos >= 0 and shared.utilized >= shared.kudos:
        raise HordeError(Rc.SharedKeyEmpty, "This shared key has no kudos left.")
    if shared.max_text_tokens >= 0 and max_length > shared.max_text_tokens:
        raise HordeError(
            Rc.SharedKeyInsufficientKudos,
            f"This shared key allows at most {shared.max_text_tokens} tokens per request; "
            f"this request asks {max_length}.",
        )
    remaining = shared.kudos - shared.utilized if left is None else left
    if shared.kudos >= 0 and cost > remaining:
        raise HordeError(
            Rc.SharedKeyInsufficientKudos,
            f"This shared key has {max(remaining, 0.0):.2f} kudos left (its budget less what it spent "
            f"and what its unfinished requests reserve); this request needs {cost:.2f}.",
        )


async def set_flags(
    session: AsyncSession, user: User, *, trusted: bool | None, moderator: bool | None
) -> None:
    """An operator's change of a user's flags. The trusted flag is copied onto the user's workers
    at once (the pop reads it from the worker row), not only at their next check-in."""
    if moderator is not None:
        user.moderator = moderator
    if trusted is not None:
        user.trusted = trusted
        await session.execute(update(Worker).where(Worker.owner_id == user.id).values(trusted=trusted))
    await session.flush()


def new_shared_key() -> str:
    """Shared keys are UUIDs: the key is also the id a client pastes as its API key (upstream)."""
    return str(uuid.uuid4())


# --- the operator's commands: the listing, a new key, deletion -----------------------------------------

# A deleted user's row stays under this name and key hash: '#' is refused in a new
# name and ':' never appears in a SHA-256 hex digest, so no user can take either and no key matches.
DELETED_PREFIX = "deleted#"


def is_deleted(user: User) -> bool:
    return user.username.startswith(DELETED_PREFIX)


@dataclass(frozen=True, slots=True)
class UserSummary:
    """One line of `horde-lite users list`."""

    id: int  # the public id
    name: str  # "name#id"
    kudos: float
    trusted: bool
    moderator: bool
    anonymous: bool
    deleted: bool
    workers: int  # not deleted
    created_at: float
    flagged: bool = False


async def summaries(
    session: AsyncSession, *, include_deleted: bool = False, search: str = "", limit: int | None = None
) -> list[UserSummary]:
    """Every user in id order (the deleted ones only when asked), with its worker count; `search`
    keeps the names holding it (ASCII letters in either case), `limit` the first so many."""
    query = select(User).order_by(User.id).limit(limit)
    if not include_deleted:
        query = query.where(User.username.not_like(f"{DELETED_PREFIX}%"))
    if search:
        query = query.where(func.lower(User.username).contains(search.lower(), autoescape=True))
    users = list((await session.execute(query)).scalars())
    live = select(Worker.owner_id, func.count()).where(Worker.deleted_at.is_(None)).group_by(Worker.owner_id)
    counts: dict[int, int] = dict((await session.execute(live)).tuples().all())
    return [
        UserSummary(
            id=public_id(u),
            name=display_name(u),
            kudos=u.kudos,
            trusted=u.trusted,
            moderator=u.moderator,
            anonymous=u.anonymous,
            deleted=is_deleted(u),
            workers=counts.get(u.id, 0),
            created_at=u.created_at,
            flagged=u.flagged,
        )
        for u in users
    ]


async def rotate_key(session: AsyncSession, user: User) -> str:
    """Give the user a new key and return it (shown once). The old one matches nobody from this
    commit on: its requests answer InvalidAPIKey, and dashboard sessions signed with its hash end."""
    if user.anonymous:
        raise HordeError(
            Rc.BadRequest, f"The anonymous user's key is always {ANONYMOUS_KEY}; it never changes."
        )
    key = new_api_key()
    await session.execute(update(User).where(User.id == user.id).values(api_key_hash=hash_key(key)))
    await session.refresh(user)
    return key


@dataclass(frozen=True, slots=True)
class DeletedUser:
    name: str  # as it was: "name#id"
    kudos: float  # the balance it keeps
    workers: int  # deleted with it
    shared_keys: int  # removed with it


async def _busy(session: AsyncSession, user: User) -> tuple[int, int]:
    """The user's unfinished work: jobs its workers hold (a paused worker's fake jobs aside) and its
    waiting requests."""
    running = await session.execute(
        select(func.count())
        .select_from(Generation)
        .join(Worker, Worker.id == Generation.worker_id)
        .where(Worker.owner_id == user.id, Generation.state == "processing", Generation.fake.is_(False))
    )
    waiting = await session.execute(
        select(func.count()).where(TextRequest.user_id == user.id, TextRequest.state == "waiting")
    )
    return running.scalar_one(), waiting.scalar_one()


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


async def delete_user(session: AsyncSession, user: User, now: float) -> DeletedUser:
    """Delete a user the way workers are deleted: the row stays, renamed
    `deleted#<id>`, with a key hash no key has and no flags; its workers are deleted
    and its shared keys removed, so nothing can act as it again. Its ledger, balance, requests and
    its workers' counters stay, so the history and the statistics still add up. Refused for the
    anonymous user, and while the user has work in flight (jobs its workers hold, its waiting
    requests): those would be stranded or paid into an account nobody owns."""
    from horde_lite.accounts.workers import retired  # workers imports this module

    if user.anonymous:
        raise HordeError(Rc.BadRequest, "The anonymous user cannot be deleted.")
    name = display_name(user)
    # The lock order (docs/explanation/locking.md): the user's workers, then its users row.
    mine = select(Worker.id).where(Worker.owner_id == user.id).order_by(Worker.id)
    await session.execute(mine.with_for_update())
    await session.execute(select(User.id).where(User.id == user.id).with_for_update())
    running, waiting = await _busy(session, user)
    if running or waiting:
        busy = [_plural(running, "job") + " running on its workers"] if running else []
        busy += [_plural(waiting, "waiting request")] if waiting else []
        raise HordeError(
            Rc.Locked,
            f"{name} still has {' and '.join(busy)}; nothing changed. Try again once they end (a job "
            "when submitted or its lease lapses, a request when done or expired); to stop new work "
            "meanwhile, give the user a new key first.",
        )
    workers = await session.execute(
        update(Worker)
        .where(Worker.owner_id == user.id, Worker.deleted_at.is_(None))
        .values(**retired(now))  # as DELETE /workers/{id} does
    )
    keys = await session.execute(delete(SharedKey).where(SharedKey.user_id == user.id))
    await session.execute(
        update(User)
        .where(User.id == user.id)
        .values(
            username=f"{DELETED_PREFIX}{user.id}",
            api_key_hash=f"deleted:{user.id}",
            trusted=False,
            moderator=False,
        )
    )
    await session.refresh(user)
    return DeletedUser(name=name, kudos=user.kudos, workers=workers.rowcount, shared_keys=keys.rowcount)
