"""User records (find_user, GET /users, GET /users/{id}) and moderators' changes (PUT /users/{id}).

What a record shows depends on who asks: its own key (not a shared key) or a moderator also sees
the user's worker ids and shared-key ids; anyone else sees the public fields. The anonymous user is
`Anonymous#0` (users.public_id).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.accounts import kudos
from horde_lite.accounts.users import (
    ANONYMOUS_PUBLIC_ID,
    authenticate,
    authenticate_user,
    display_name,
    ensure_anonymous,
    public_id,
    set_flags,
    user_id_part,
)
from horde_lite.core.context import Caller, Horde
from horde_lite.core.errors import HordeError
from horde_lite.db.models import KudosEvent, SharedKey, User, Worker
from horde_lite.inputs import UserUpdate
from horde_lite.operators.usage import UserUsage, user_usage
from horde_lite.rc import Rc

PAGE_SIZE = 25  # upstream's page of GET /users
MAX_PAGE = 10_000  # upstream answers an empty list beyond it

# Ledger kinds -> upstream's kudos_details categories (what is not listed is not shown).
_DETAIL_OF_KIND = {
    "reward": "accumulated",
    "charge": "accumulated",
    "grant": "admin",
    "debit": "admin",
    "admin": "admin",
    "transfer_in": "received",
    "transfer_out": "gifted",
}


@dataclass(frozen=True, slots=True)
class UserRecord:
    user: User
    id: int  # the public id (0 for the anonymous user)
    username: str  # "name#id", with " (Shared Key: name)" when found through a shared key
    account_age: int  # seconds
    worker_count: int
    tokens_generated: int  # by all the user's workers, deleted ones included
    jobs_fulfilled: int
    # kudos_details: accumulated (earned minus spent on jobs), admin, received, gifted (a positive sum)
    kudos_details: dict[str, float] = field(default_factory=dict)
    # upstream's `records`: from the usage history kept (operators/usage.py)
    usage: UserUsage = field(default_factory=UserUsage)
    privileged: bool = False
    worker_ids: list[str] | None = None  # privileged only
    sharedkey_ids: list[str] | None = None  # privileged only: the keys' hashes (decisions)


@dataclass(frozen=True, slots=True)
class UserModified:
    """What PUT /users/{id} changed: only the fields it set are not None (upstream's ModifyUser)."""

    new_kudos: float | None = None
    trusted: bool | None = None
    moderator: bool | None = None


async def _records(
    session: AsyncSession, users: list[User], now: float, *, privileged: bool = False, suffix: str = ""
) -> list[UserRecord]:
    """The records of `users`, with five grouped queries however many users there are."""
    ids = [u.id for u in users]
    workers: dict[int, list[tuple[str, bool, int, int]]] = defaultdict(list)
    rows = await session.execute(
        select(Worker.owner_id, Worker.id, Worker.deleted_at.is_(None), Worker.completed_jobs,
               Worker.tokens_generated).where(Worker.owner_id.in_(ids)).order_by(Worker.created_at)
    )  # fmt: skip
    for owner_id, worker_id, live, jobs, tokens in rows:
        workers[owner_id].append((worker_id, bool(live), jobs, tokens))
    details: dict[int, dict[str, float]] = defaultdict(
        lambda: dict.fromkeys(set(_DETAIL_OF_KIND.values()), 0.0)
    )
    sums = await session.execute(
        select(KudosEvent.user_id, KudosEvent.kind, func.sum(KudosEvent.amount))
        .where(KudosEvent.user_id.in_(ids))
        .group_by(KudosEvent.user_id, KudosEvent.kind)
    )
    for user_id, kind, amount in sums:
        if kind in _DETAIL_OF_KIND:
            detail = _DETAIL_OF_KIND[kind]
            details[user_id][detail] += -amount if detail == "gifted" else amount
    keys: dict[int, list[str]] = defaultdict(list)
    if privileged:
        shared = await session.execute(
            select(SharedKey.user_id, SharedKey.key_hash)
            .where(SharedKey.user_id.in_(ids))
            .order_by(SharedKey.created_at)
        )
        for user_id, key_hash in shared:
            keys[user_id].append(key_hash)
    used = await user_usage(session, ids)
    records = []
    for user in users:
        mine = workers[user.id]
        live = [w[0] for w in mine if w[1]]
        records.append(
            UserRecord(
                user=user,
                id=public_id(user),
                username=display_name(user) + suffix,
                account_age=int(max(0.0, now - user.created_at)),
                worker_count=len(live),
                tokens_generated=sum(w[3] for w in mine),
                jobs_fulfilled=sum(w[2] for w in mine),
                kudos_details={k: round(v, 2) for k, v in details[user.id].items()},
                usage=used.get(user.id, UserUsage()),
                privileged=privileged,
                worker_ids=live if privileged else None,
                sharedkey_ids=keys[user.id] if privileged else None,
            )
        )
    return records


async def _by_public_id(session: AsyncSession, user_id: str, now: float) -> User:
    """A user by the id clients know (the number in "name#id"); 0 is the anonymous user."""
    number = user_id_part(user_id)
    if number is None:
        raise HordeError(Rc.UserNotFound, "Use the numeric part of the user's id, e.g. the 1 in 'db0#1'.")
    if number == ANONYMOUS_PUBLIC_ID:
        return await ensure_anonymous(session, now)
    user = await session.get(User, number)
    if user is None or user.anonymous:
        raise HordeError(Rc.UserNotFound, f"No user with id {number}.")
    return user


async def find_user(horde: Horde, caller: Caller) -> UserRecord:
    """GET /find_user: the caller's own record (no key: the anonymous user's). Through a shared
    key, the owner's public record named after the key, as upstream."""
    now = horde.clock.now()
    async with horde.transaction() as session:
        requester = await authenticate(session, caller.apikey, now)
        shared = requester.shared_key
        if shared is None:
            return (await _records(session, [requester.user], now, privileged=True))[0]
        suffix = f" (Shared Key: {shared.name})" if shared.name else " (Shared Key)"
        return (await _records(session, [requester.user], now, suffix=suffix))[0]


async def user_by_id(horde: Horde, caller: Caller, user_id: str) -> UserRecord:
    """GET /users/{id}: public, or privileged for the user's own key and for moderators. A key
    that matches nobody is refused (InvalidAPIKey), as upstream."""
    now = horde.clock.now()
    async with horde.transaction() as session:
        viewer = await authenticate(session, caller.apikey, now) if caller.apikey else None
        user = await _by_public_id(session, user_id, now)
        privileged = (
            viewer is not None
            and viewer.shared_key is None
            and (viewer.user.moderator or viewer.user.id == user.id)
        )
        return (await _records(session, [user], now, privileged=privileged))[0]


async def list_users(horde: Horde, *, page: int = 1, sort: str = "kudos") -> list[UserRecord]:
    """GET /users: 25 public records a page, by kudos (highest first) or by age (oldest first);
    an unknown sort is by kudos and a page below 1 is the first, as upstream."""
    if page > MAX_PAGE:
        return []
    order = (User.created_at, User.id) if sort == "age" else (User.kudos.desc(), User.id)
    query = select(User).order_by(*order).offset((max(page, 1) - 1) * PAGE_SIZE).limit(PAGE_SIZE)
    now = horde.clock.now()
    async with horde.transaction() as session:
        users = list((await session.execute(query)).scalars())
        return await _records(session, users, now) if users else []


async def modify_user(horde: Horde, caller: Caller, user_id: str, body: UserUpdate) -> UserModified:
    """PUT /users/{id}, moderators only: kudos (added through the ledger), trusted, moderator. The
    anonymous user's balance may be adjusted, its flags not."""
    if body.kudos is None and body.trusted is None and body.moderator is None:
        raise HordeError(Rc.NoValidActions, "No user modification selected.")
    now = horde.clock.now()
    async with horde.transaction() as session:
        actor = await authenticate_user(session, caller.apikey, now)
        if not actor.moderator:
            raise HordeError(Rc.NotModerator, "Only a moderator can change a user.")
        user = await _by_public_id(session, user_id, now)
        if user.anonymous and (body.trusted is not None or body.moderator is not None):
            raise HordeError(Rc.BadRequest, "The anonymous user cannot be made trusted or a moderator.")
        # The lock order (docs/explanation/locking.md): the user's workers (their copy of the
        # trusted flag), then the user's row, then its ledger event.
        if body.trusted is not None:
            mine = select(Worker.id).where(Worker.owner_id == user.id).order_by(Worker.id)
            await session.execute(mine.with_for_update())
        await session.execute(select(User.id).where(User.id == user.id).with_for_update())
        await set_flags(session, user, trusted=body.trusted, moderator=body.moderator)
        new_kudos = None
        if body.kudos is not None:
            await kudos.record(session, user.id, round(body.kudos, 2), "admin", f"moderator:{actor.id}", now)
            await session.refresh(user, ["kudos"])
            new_kudos = round(user.kudos, 2)
        return UserModified(new_kudos=new_kudos, trusted=body.trusted, moderator=body.moderator)
