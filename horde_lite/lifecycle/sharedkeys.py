"""Shared keys: a user lends its kudos to others through a key with its own budget, expiry and
token cap. The key (a UUID) is its public id, as upstream; only its hash is stored."""

from __future__ import annotations

from typing import Any

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.db.models import SharedKey, User
from horde_lite.lifecycle.context import Horde
from horde_lite.lifecycle.errors import HordeError
from horde_lite.lifecycle.inputs import SharedKeyInput, SharedKeyPatch
from horde_lite.lifecycle.users import display_name, hash_key, new_shared_key

DAY = 86400.0


def _view(shared: SharedKey, owner: User, key: str) -> dict[str, Any]:
    return {
        "id": key,
        "username": display_name(owner),
        "name": shared.name,
        "kudos": shared.kudos,
        "utilized": round(shared.utilized, 2),
        "expiry": shared.expiry,
        "max_text_tokens": shared.max_text_tokens,
    }


def _apply(shared: SharedKey, body: SharedKeyInput | SharedKeyPatch, now: float) -> None:
    """Set the fields the body carries (a PATCH leaves the others as they are)."""
    if body.kudos is not msgspec.UNSET:
        shared.kudos = body.kudos
    if body.name is not msgspec.UNSET:
        shared.name = body.name
    if body.max_text_tokens is not msgspec.UNSET:
        shared.max_text_tokens = body.max_text_tokens
    if body.expiry is not msgspec.UNSET:
        shared.expiry = None if body.expiry < 0 else now + body.expiry * DAY


async def create(session: AsyncSession, horde: Horde, owner: User, body: SharedKeyInput) -> dict[str, Any]:
    if owner.anonymous:
        raise HordeError("AnonForbidden", "The anonymous user cannot make shared keys.")
    key = new_shared_key()
    now = horde.clock.now()
    shared = SharedKey(key_hash=hash_key(key), user_id=owner.id, created_at=now, utilized=0.0)
    _apply(shared, body, now)
    session.add(shared)
    await session.flush()
    return _view(shared, owner, key)


async def _load(session: AsyncSession, key: str) -> SharedKey:
    shared = await session.get(SharedKey, hash_key(key))
    if shared is None:
        raise HordeError("SharedKeyNotFound", "No shared key with that id.")
    return shared


async def show(session: AsyncSession, key: str) -> dict[str, Any]:
    shared = await _load(session, key)
    owner = await session.get(User, shared.user_id)
    assert owner is not None
    return _view(shared, owner, key)


async def change(
    session: AsyncSession, horde: Horde, owner: User, key: str, body: SharedKeyPatch
) -> dict[str, Any]:
    shared = await _load(session, key)
    if shared.user_id != owner.id:
        raise HordeError("WrongCredentials", "This shared key belongs to another user.")
    _apply(shared, body, horde.clock.now())
    return _view(shared, owner, key)


async def remove(session: AsyncSession, owner: User, key: str) -> None:
    shared = await _load(session, key)
    if shared.user_id != owner.id:
        raise HordeError("WrongCredentials", "This shared key belongs to another user.")
    await session.delete(shared)
