"""User records (find_user, GET /users, GET /users/{id}) and the changes to users that moderators,
and for some fields the users themselves, make: POST /users, PUT /users/{id}, DELETE /users/{id},
POST /kudos/award. The dashboard's users panel calls the same entry points, as a `SignedIn` actor.

What a record shows depends on who asks: its own key (not a shared key) or a moderator also sees
the user's worker ids, shared-key ids, contact and flagged state; only a moderator sees the admin
comment; anyone
sees the worker ids of a user who made them public. The anonymous user is `Anonymous#0`
(users.public_id).
"""

from __future__ import annotations

import unicodedata
from collections import defaultdict
from dataclasses import dataclass, field

import msgspec
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.accounts import flagged, kudos, limits
from horde_lite.accounts.users import (
    ANONYMOUS_NAME,
    ANONYMOUS_PUBLIC_ID,
    DeletedUser,
    authenticate,
    authenticate_user,
    create_user,
    delete_user,
    display_name,
    ensure_anonymous,
    find_by_name,
    is_deleted,
    public_id,
    rename,
    set_flags,
    split_name,
    user_id_part,
)
from horde_lite.core.context import Caller, Horde
from horde_lite.core.errors import HordeError
from horde_lite.db.models import KudosEvent, SharedKey, User, Worker
from horde_lite.inputs import KudosAwardInput, UserCreate, UserUpdate
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
    "award": "awarded",
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
    worker_ids: list[str] | None = None  # privileged, or the user made them public
    sharedkey_ids: list[str] | None = None  # privileged only: the keys' hashes (decisions)
    contact: str | None = None  # privileged only
    admin_comment: str | None = None  # moderators only
    flagged: bool | None = None  # privileged only


@dataclass(frozen=True, slots=True)
class UserModified:
    """What PUT /users/{id} changed: only the fields it set are not None (upstream's ModifyUser)."""

    new_kudos: float | None = None
    trusted: bool | None = None
    moderator: bool | None = None
    username: str | None = None  # "name#id"
    contact: str | None = None
    admin_comment: str | None = None
    public_workers: bool | None = None
    worker_invited: int | None = None
    flagged: bool | None = None
    limits_changed: limits.UserLimitsChanged | None = None


@dataclass(frozen=True, slots=True)
class SignedIn:
    """A moderator signed in to the dashboard (no key at hand): the actor is read again, and its
    moderator flag checked, in the action's own transaction."""

    user_id: int


# Who acts on a user: a key's caller (the API) or a dashboard session.
Actor = Caller | SignedIn


@dataclass(frozen=True, slots=True)
class NewUser:
    user: User
    name: str  # "name#id"
    api_key: str  # shown once


# Upstream's ModifyUserInput fields horde_lite refuses, each with the reason the refusal gives.
_IMAGE_OR_SERVICE = (
    "is one of upstream's image or service-account features, which horde_lite (text only) has not"
)
REFUSED_FIELDS: dict[str, str] = {
    "usage_multiplier": (
        "is not taken: a request's price is fixed at admission from its model, length and context, the "
        "same for every requester; adjust the user's kudos instead"
    ),
    "undelete": (
        "is not possible: deleting a user releases its name and destroys its key at once (the row stays "
        "as deleted#<id> for the ledger and statistics); create a new user instead"
    ),
    "reset_suspicion": "has nothing to reset: horde_lite keeps no suspicion score",
    **{name: _IMAGE_OR_SERVICE for name in (
        "customizer", "vpn", "special", "education", "service", "filtered", "generate_proxy_passkey"
    )},
}  # fmt: skip
# The fields only a moderator may change; the others (username, contact, public_workers) the user too.
_MODERATOR_FIELDS = (
    "kudos",
    "trusted",
    "moderator",
    "worker_invited",
    "admin_comment",
    "flagged",
    *limits.USER_LIMIT_FIELDS,
)
_OWN_FIELDS = ("username", "contact", "public_workers")


async def _records(
    session: AsyncSession,
    users: list[User],
    now: float,
    *,
    privileged: bool = False,
    moderator: bool = False,
    suffix: str = "",
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
                worker_ids=live if privileged or user.public_workers else None,
                sharedkey_ids=keys[user.id] if privileged else None,
                contact=user.contact if privileged else None,
                admin_comment=user.admin_comment if moderator else None,
                flagged=user.flagged if privileged else None,
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
            me = requester.user
            return (await _records(session, [me], now, privileged=True, moderator=me.moderator))[0]
        suffix = f" (Shared Key: {shared.name})" if shared.name else " (Shared Key)"
        return (await _records(session, [requester.user], now, suffix=suffix))[0]


async def user_by_id(horde: Horde, caller: Caller, user_id: str) -> UserRecord:
    """GET /users/{id}: public, or privileged for the user's own key and for moderators. A key
    that matches nobody is refused (InvalidAPIKey), as upstream."""
    now = horde.clock.now()
    async with horde.transaction() as session:
        viewer = await authenticate(session, caller.apikey, now) if caller.apikey else None
        user = await _by_public_id(session, user_id, now)
        own_key = viewer is not None and viewer.shared_key is None
        moderator = own_key and viewer is not None and viewer.user.moderator
        privileged = moderator or (own_key and viewer is not None and viewer.user.id == user.id)
        return (await _records(session, [user], now, privileged=privileged, moderator=moderator))[0]


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


async def _actor(session: AsyncSession, who: Actor, now: float) -> User:
    """The user acting: a key's owner (a shared key is refused: WrongCredentials), or a signed-in
    moderator read again (a session whose user is gone or no longer a moderator acts as nobody)."""
    if isinstance(who, Caller):
        return await authenticate_user(session, who.apikey, now)
    user = await session.get(User, who.user_id)
    if user is None or user.anonymous or not user.moderator:
        raise HordeError(Rc.NotModerator, "This dashboard session is no longer a moderator's; sign in again.")
    return user


async def acting_user(session: AsyncSession, who: Actor, now: float) -> User:
    """The user acting, for other modules' actions that the dashboard also offers."""
    return await _actor(session, who, now)


def _moderator(actor: User, action: str) -> None:
    if not actor.moderator:
        raise HordeError(Rc.NotModerator, f"Only a moderator can {action}.")


async def _live_user(session: AsyncSession, user_id: str, now: float) -> User:
    """A user to act on by public id: a deleted user is not one any more."""
    user = await _by_public_id(session, user_id, now)
    if is_deleted(user):
        raise HordeError(Rc.UserNotFound, f"User {user.id} was deleted.")
    return user


def _note(value: str, field_name: str) -> str:
    """A contact or an admin comment as stored: stripped, with no hidden characters."""
    text = value.strip()
    if any(unicodedata.category(c).startswith("C") for c in text):
        raise HordeError(
            Rc.BadRequest, f"{field_name} may not hold control, format or unassigned characters.",
            param=field_name,
        )  # fmt: skip
    return text


def refused_fields(body: UserUpdate) -> None:
    """Upstream's fields horde_lite has not: each one sent is named, with the reason."""
    sent = [name for name in REFUSED_FIELDS if getattr(body, name) is not msgspec.UNSET]
    if sent:
        reasons = "; ".join(f"`{name}` {REFUSED_FIELDS[name]}" for name in sent)
        raise HordeError(
            Rc.BadRequest, f"Nothing changed: {reasons}.", param=sent[0],
            errors={name: REFUSED_FIELDS[name] for name in sent},
        )  # fmt: skip


def _changes(body: UserUpdate) -> list[str]:
    return [name for name in (*_MODERATOR_FIELDS, *_OWN_FIELDS) if getattr(body, name) is not None]


async def modify_user(horde: Horde, who: Actor, user_id: str, body: UserUpdate) -> UserModified:
    """PUT /users/{id}: upstream's fields, each honoured or refused by name. A moderator may change
    any of them; the user itself its name, contact and public_workers. Kudos move through the ledger.
    Of the anonymous user, only the balance may be adjusted. Nothing changes unless all may."""
    refused_fields(body)
    changes = _changes(body)
    if not changes:
        raise HordeError(Rc.NoValidActions, "No user modification selected.")
    now = horde.clock.now()
    async with horde.transaction() as session:
        actor = await _actor(session, who, now)
        user = await _live_user(session, user_id, now)
        if not actor.moderator:
            if actor.anonymous and any(f in _OWN_FIELDS for f in changes):
                raise HordeError(Rc.AnonForbiddenUserMod, "The anonymous user cannot change a user.")
            theirs = [f for f in changes if f in _MODERATOR_FIELDS or actor.id != user.id]
            if theirs:
                raise HordeError(
                    Rc.NotModerator, f"Only a moderator can change {', '.join(theirs)} of this user.",
                    param=theirs[0],
                )  # fmt: skip
        if body.flagged is not None:
            flagged.flaggable(user)
        anonymous_may = ("kudos", *limits.USER_LIMIT_FIELDS)
        if user.anonymous and any(f not in anonymous_may for f in changes):
            raise HordeError(
                Rc.BadRequest, "Of the anonymous user, only the kudos balance and the limits can be changed.",
                param=next(f for f in changes if f not in anonymous_may),
            )  # fmt: skip
        # The lock order (docs/explanation/locking.md): the user's workers (their copy of the
        # trusted flag), then the user's row, then its ledger event.
        if body.trusted is not None:
            mine = select(Worker.id).where(Worker.owner_id == user.id).order_by(Worker.id)
            await session.execute(mine.with_for_update())
        await session.execute(select(User.id).where(User.id == user.id).with_for_update())
        name = await rename(session, user, body.username) if body.username is not None else None
        contact = _note(body.contact, "contact") if body.contact is not None else None
        comment = _note(body.admin_comment, "admin_comment") if body.admin_comment is not None else None
        await set_flags(session, user, trusted=body.trusted, moderator=body.moderator)
        if contact is not None:
            user.contact = contact
        if comment is not None:
            user.admin_comment = comment
        if body.public_workers is not None:
            user.public_workers = body.public_workers
        if body.worker_invited is not None:
            user.worker_invited = body.worker_invited
        if body.flagged is not None:
            user.flagged = body.flagged
        await session.flush()
        new_kudos = None
        if body.kudos is not None:
            await kudos.record(session, user.id, round(body.kudos, 2), "admin", f"moderator:{actor.id}", now)
        changed = (
            await limits.set_user_limits(session, user, body, actor.id, now)
            if limits.sets_limits(body)
            else None
        )
        if body.kudos is not None:  # after a monthly award too, which moves the balance
            await session.refresh(user, ["kudos"])
            new_kudos = round(user.kudos, 2)
        return UserModified(
            new_kudos=new_kudos, trusted=body.trusted, moderator=body.moderator,
            username=display_name(user) if name is not None else None, contact=contact,
            admin_comment=comment, public_workers=body.public_workers, worker_invited=body.worker_invited,
            flagged=body.flagged, limits_changed=changed,
        )  # fmt: skip


async def create(horde: Horde, who: Actor, body: UserCreate) -> NewUser:
    """POST /users: a moderator creates a user (the rules of `horde-lite users create`); a
    starting balance is a grant through the ledger. The key is returned once."""
    now = horde.clock.now()
    async with horde.transaction() as session:
        actor = await _actor(session, who, now)
        _moderator(actor, "create a user")
        user, key = await create_user(
            session, body.username, now, trusted=body.trusted, moderator=body.moderator
        )
        if body.kudos:
            await kudos.record(session, user.id, round(body.kudos, 2), "grant", f"moderator:{actor.id}", now)
        return NewUser(user=user, name=display_name(user), api_key=key)


async def delete(horde: Horde, who: Actor, user_id: str) -> DeletedUser:
    """DELETE /users/{id}: by the user itself or a moderator, never of a moderator (upstream's
    rule; the operator's CLI may), through `users.delete_user`: refused while the user has work in
    flight; its workers are deleted, its shared keys removed, its balance and history kept."""
    now = horde.clock.now()
    async with horde.transaction() as session:
        actor = await _actor(session, who, now)
        if actor.anonymous:
            raise HordeError(Rc.AnonForbiddenUser, "The anonymous user cannot delete users.")
        user = await _live_user(session, user_id, now)
        if not actor.moderator and actor.id != user.id:
            raise HordeError(Rc.NotUserOrMod, "Only the user themselves or a moderator can delete a user.")
        if user.moderator:
            raise HordeError(
                Rc.CannotDeleteMod,
                "A moderator cannot be deleted: take the moderator flag away first "
                "(PUT /users/{id} with moderator false), or the operator deletes it "
                "(horde-lite users delete).",
            )
        return await delete_user(session, user, now)


async def award(horde: Horde, who: Actor, body: KudosAwardInput) -> float:
    """POST /kudos/award: a moderator gives kudos to a registered user (an `awarded` ledger event);
    returns the amount."""
    if body.amount <= 0:
        raise HordeError(Rc.BadRequest, "amount must be positive (at least 0.01).", param="amount")
    amount = round(body.amount, 2)
    if amount <= 0:
        raise HordeError(Rc.BadRequest, "amount must be at least 0.01.", param="amount")
    now = horde.clock.now()
    async with horde.transaction() as session:
        actor = await _actor(session, who, now)
        if not actor.moderator:
            raise HordeError(Rc.NotAllowedAwards, "Only a moderator can award kudos.")
        parsed = split_name(body.username)
        if parsed is not None and (parsed[1] == ANONYMOUS_PUBLIC_ID or parsed == (ANONYMOUS_NAME, None)):
            raise HordeError(Rc.KudosAwardToAnon, "Kudos cannot be awarded to the anonymous user.")
        try:
            dest = await find_by_name(session, body.username)
        except HordeError:
            raise HordeError(Rc.InvalidAwardUsername, f"No user named {body.username[:100]!r}.") from None
        if dest.anonymous:
            raise HordeError(Rc.KudosAwardToAnon, "Kudos cannot be awarded to the anonymous user.")
        flagged.refuse_award(dest)
        await kudos.record(session, dest.id, amount, "award", f"moderator:{actor.id}", now)
    return amount
