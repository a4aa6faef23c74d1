"""POST /kudos/transfer: a registered user gives kudos to another user or to a shared key's owner.

Upstream's refusals: from the anonymous user, to the anonymous user, to yourself, from or to a
flagged user, an amount that is not positive, and more than the sender can spend above its floor
(its active holds count as spent).
Both balances move through the ledger in one transaction, in ascending user-id order.
"""

from __future__ import annotations

import re

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.accounts import flagged, kudos
from horde_lite.accounts.users import (
    ANONYMOUS_PUBLIC_ID,
    authenticate_user,
    find_by_name,
    hash_key,
    split_name,
)
from horde_lite.core.context import Caller, Horde
from horde_lite.core.errors import HordeError
from horde_lite.db.models import SharedKey, User
from horde_lite.inputs import KudosTransferInput
from horde_lite.rc import Rc

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


async def _target(session: AsyncSession, username: str, now: float) -> tuple[User, SharedKey | None]:
    """The receiving user: "name#id" (or a bare name), or a shared key (its owner receives, and a
    limited key's budget grows by the amount, as upstream)."""
    if _UUID.fullmatch(username.lower()):
        shared = await session.get(SharedKey, hash_key(username.lower()))
        if shared is not None:
            if shared.expiry is not None and shared.expiry <= now:
                raise HordeError(Rc.SharedKeyExpired, "This shared key has expired.")
            owner = await session.get(User, shared.user_id)
            assert owner is not None
            return owner, shared
    if (parsed := split_name(username)) is not None and parsed[1] == ANONYMOUS_PUBLIC_ID:
        raise HordeError(Rc.KudosTransferToAnon, "Kudos sent to the anonymous user would be lost.")
    try:
        return await find_by_name(session, username), None
    except HordeError:
        raise HordeError(Rc.InvalidTargetUsername, f"No user or shared key {username[:100]!r}.") from None


async def transfer(horde: Horde, caller: Caller, body: KudosTransferInput) -> float:
    """Move `amount` kudos; returns the amount transferred."""
    if body.amount < 0:
        raise HordeError(Rc.NegativeKudosTransfer, "A transfer amount cannot be negative.")
    amount = round(body.amount, 2)
    if amount <= 0:
        raise HordeError(Rc.InvalidKudosTransferAmount, "A transfer amount must be positive.")
    now = horde.clock.now()
    async with horde.transaction() as session:
        source = await authenticate_user(session, caller.apikey, now)
        if source.anonymous:
            raise HordeError(Rc.KudosTransferFromAnon, "The anonymous user cannot transfer kudos.")
        dest, shared = await _target(session, body.username, now)
        if dest.anonymous:
            raise HordeError(Rc.KudosTransferToAnon, "Kudos sent to the anonymous user would be lost.")
        if dest.id == source.id:
            raise HordeError(Rc.KudosTransferToSelf, "You cannot transfer kudos to yourself.")
        # Lock both balances in ascending user-id order (the lock order of every balance change),
        # then decide on the fresh values.
        locked = (
            select(User)
            .where(User.id.in_(sorted((source.id, dest.id))))
            .order_by(User.id)
            .with_for_update()
            .execution_options(populate_existing=True)
        )
        await session.execute(locked)
        flagged.refuse_transfer(source, dest)
        available = await kudos.spendable(session, source, horde.settings.kudos)
        if amount > available:
            raise HordeError(
                Rc.KudosTransferNotEnough,
                f"You can transfer at most {max(available, 0.0):.2f} kudos (your balance above your floor, "
                "less what your waiting requests hold).",
            )
        moves = [(source.id, -amount, "transfer_out"), (dest.id, amount, "transfer_in")]
        await kudos.record_all(session, moves, f"transfer:{source.id}:{dest.id}", now)
        if shared is not None:  # after the balances, as a submit updates them before the key
            await session.execute(
                update(SharedKey)
                .where(SharedKey.key_hash == shared.key_hash, SharedKey.kudos != -1)
                .values(kudos=SharedKey.kudos + amount)
            )
    return amount
