"""Shared keys: a user lends its kudos to others through a key with its own budget, expiry and
token cap. The key (a UUID) is its public id, as upstream; only its hash is stored. The owner also
knows each key by that hash (`sharedkey_ids` in its own user record), which every route here takes in
place of the key, so a lost key can still be changed or deleted by its owner."""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.accounts import limits, owner_limits
from horde_lite.accounts.users import authenticate_user, display_name, hash_key, new_shared_key
from horde_lite.core.context import Caller, Horde
from horde_lite.core.errors import HordeError
from horde_lite.db.models import SharedKey, User
from horde_lite.inputs import KEY_DEFAULT_KUDOS, SharedKeyInput, SharedKeyPatch
from horde_lite.rc import Rc

DAY = 86400.0
_HASH = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class SharedKeyRecord:
    key: SharedKey
    id: str  # the key itself when the caller gave it, else its hash
    owner: str  # "name#id"


# The body's fields the key stores as sent.
_STORED_AS_SENT = ("kudos", "name", "max_text_tokens", "concurrency", "requests_per_minute", "tokens_per_day")


def _apply(shared: SharedKey, body: SharedKeyInput | SharedKeyPatch, now: float) -> None:
    """Set the fields the body carries (a PATCH leaves the others as they are)."""
    for name in _STORED_AS_SENT:
        value = getattr(body, name)
        if value is not msgspec.UNSET:
            setattr(shared, name, value)
    if body.expiry is not msgspec.UNSET:
        shared.expiry = None if body.expiry < 0 else now + body.expiry * DAY
    if body.allowed_models is not msgspec.UNSET:
        shared.allowed_models = limits.allow_list(body.allowed_models)
    if body.monthly_kudos is not msgspec.UNSET:
        shared.monthly_kudos = body.monthly_kudos
        # This month's budget is `kudos`; the monthly amount replaces it from the next month on.
        shared.refilled_at = max(shared.refilled_at or 0.0, now)


async def create(horde: Horde, caller: Caller, body: SharedKeyInput) -> SharedKeyRecord:
    now = horde.clock.now()
    async with horde.transaction() as session:
        owner = await authenticate_user(session, caller.apikey, now)
        if owner.anonymous:
            raise HordeError(Rc.AnonForbidden, "The anonymous user cannot make shared keys.")
        await owner_limits.room_for_a_shared_key(session, horde.settings, owner)
        key = new_shared_key()
        shared = SharedKey(key_hash=hash_key(key), user_id=owner.id, created_at=now, utilized=0.0)
        _apply(shared, body, now)
        if body.kudos is msgspec.UNSET:  # a key with a monthly amount starts the month with it
            shared.kudos = body.monthly_kudos if body.monthly_kudos >= 0 else KEY_DEFAULT_KUDOS
        session.add(shared)
        await session.flush()
        return SharedKeyRecord(shared, key, display_name(owner))


async def _load(session: AsyncSession, key: str) -> SharedKeyRecord:
    """A shared key by the key itself or by its hash."""
    digest = key if _HASH.fullmatch(key) else hash_key(key)
    shared = await session.get(SharedKey, digest)
    if shared is None:
        raise HordeError(Rc.SharedKeyNotFound, "No shared key with that id.")
    owner = await session.get(User, shared.user_id)
    assert owner is not None
    return SharedKeyRecord(shared, key, display_name(owner))


async def _owned(session: AsyncSession, caller: Caller, key: str, now: float) -> SharedKeyRecord:
    owner = await authenticate_user(session, caller.apikey, now)
    found = await _load(session, key)
    if found.key.user_id != owner.id:
        raise HordeError(Rc.WrongCredentials, "This shared key belongs to another user.")
    return found


async def show(horde: Horde, key: str) -> SharedKeyRecord:
    async with horde.transaction() as session:
        return await _load(session, key)


async def change(horde: Horde, caller: Caller, key: str, body: SharedKeyPatch) -> SharedKeyRecord:
    now = horde.clock.now()
    async with horde.transaction() as session:
        found = await _owned(session, caller, key, now)
        _apply(found.key, body, now)
        await session.flush()
        return found


async def remove(horde: Horde, caller: Caller, key: str) -> None:
    async with horde.transaction() as session:
        found = await _owned(session, caller, key, horde.clock.now())
        await session.delete(found.key)
