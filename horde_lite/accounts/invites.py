"""Invite codes: what a registration needs in `[accounts] registration = "invite"` mode.

A moderator makes a code (the API, the CLI or the dashboard) that allows a number of registrations
until it expires or is revoked. The code is shown once and only its hash is kept, as for API keys.
A registration claims one use with a single conditional UPDATE in the transaction that creates the
user, so concurrent registrations never use a code more often than it allows, and a refused
registration gives its use back by rolling back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.accounts.users import display_name, hash_key, new_api_key, user_id_part
from horde_lite.core.context import Horde
from horde_lite.core.errors import HordeError
from horde_lite.db.models import InviteCode, User
from horde_lite.rc import Rc

DAY = 86400.0
MAX_USES = 10_000
MAX_DAYS = 36_500  # as a shared key's expiry
LISTED = 1000  # the newest codes a listing shows
HINT = 4  # leading characters kept to tell codes apart (the other 18 keep ~108 random bits)
# What a code can be: URL-safe base64. Anything else names no invite and is never hashed (a lone
# surrogate cannot even be encoded).
_CODE = re.compile(r"[A-Za-z0-9_-]{1,100}")


InviteState = Literal["active", "used up", "expired", "revoked"]


@dataclass(frozen=True, slots=True)
class Invite:
    """A code as a listing shows it; `code` only in the answer that made it."""

    id: int
    hint: str
    uses: int
    uses_left: int
    state: InviteState
    expires_at: float | None
    created_by: str | None  # "name#id"; None: the CLI or open operator pages
    created_at: float
    revoked_at: float | None
    code: str | None = None


def new_code() -> str:
    """An API key's shape (22 URL-safe characters, never a leading '-'), never all digits: a
    revocation reads a value of ASCII digits as the invite's id."""
    while user_id_part(code := new_api_key()) is not None:
        pass
    return code


def state_of(invite: InviteCode, now: float) -> InviteState:
    if invite.revoked_at is not None:
        return "revoked"
    if invite.used >= invite.uses:
        return "used up"
    if invite.expires_at is not None and invite.expires_at <= now:
        return "expired"
    return "active"


def _invite(row: InviteCode, creator: User | None, now: float, code: str | None = None) -> Invite:
    return Invite(
        id=row.id, hint=row.hint, uses=row.uses, uses_left=max(row.uses - row.used, 0),
        state=state_of(row, now), expires_at=row.expires_at,
        created_by=display_name(creator) if creator is not None else None, created_at=row.created_at,
        revoked_at=row.revoked_at, code=code,
    )  # fmt: skip


def _check_terms(uses: int, days: int) -> None:
    """The API's struct bounds these already; the CLI's values come here unchecked."""
    if not 1 <= uses <= MAX_USES:
        raise HordeError(Rc.BadRequest, f"An invite allows 1 to {MAX_USES} registrations.", param="uses")
    if not 0 <= days <= MAX_DAYS:
        raise HordeError(
            Rc.BadRequest, f"An invite lasts 1 to {MAX_DAYS} days (0: it never expires).", param="days"
        )


async def create_in(
    session: AsyncSession, now: float, *, uses: int, days: int, creator: User | None
) -> Invite:
    _check_terms(uses, days)
    code = new_code()
    row = InviteCode(
        code_hash=hash_key(code), hint=code[:HINT], uses=uses, used=0,
        expires_at=now + days * DAY if days else None, created_by=creator.id if creator else None,
        created_at=now,
    )  # fmt: skip
    session.add(row)
    await session.flush()
    return _invite(row, creator, now, code)


async def _moderator_named(session: AsyncSession, name: str | None) -> User | None:
    """The moderator the guard let in, by the username it reported ("" or None: open pages)."""
    if not name:
        return None
    return (await session.execute(select(User).where(User.username == name))).scalar_one_or_none()


async def create(horde: Horde, *, uses: int, days: int, by: str | None) -> Invite:
    """A new code, made by the moderator named `by` (the guard's viewer)."""
    async with horde.transaction() as session:
        creator = await _moderator_named(session, by)
        return await create_in(session, horde.clock.now(), uses=uses, days=days, creator=creator)


async def listing_in(session: AsyncSession, now: float) -> list[Invite]:
    query = (
        select(InviteCode, User)
        .outerjoin(User, User.id == InviteCode.created_by)
        .order_by(InviteCode.id.desc())
        .limit(LISTED)
    )
    return [_invite(row, creator, now) for row, creator in (await session.execute(query)).tuples()]


async def listing(horde: Horde) -> list[Invite]:
    """The newest codes first, whatever their state."""
    async with horde.reading() as session:
        return await listing_in(session, horde.clock.now())


def _unknown(what: str = "code", **extra: str) -> HordeError:
    return HordeError(Rc.InviteNotFound, f"No invite has that {what}.", **extra)


async def _find(session: AsyncSession, code_or_id: str) -> InviteCode:
    """An invite by its code, or by the id a listing shows (ASCII digits: no code is all digits)."""
    invite_id = user_id_part(code_or_id)
    if invite_id is not None:
        query = select(InviteCode).where(InviteCode.id == invite_id)
    elif _CODE.fullmatch(code_or_id):
        query = select(InviteCode).where(InviteCode.code_hash == hash_key(code_or_id))
    else:
        raise _unknown("code or id")
    found = (await session.execute(query.with_for_update())).scalar_one_or_none()
    if found is None:
        raise _unknown("code or id")
    return found


async def revoke_in(session: AsyncSession, code_or_id: str, now: float) -> Invite:
    """Revoke a code (again: nothing changes); it admits nobody from this commit on."""
    row = await _find(session, code_or_id)
    if row.revoked_at is None:
        row.revoked_at = now
        await session.flush()
    creator = await session.get(User, row.created_by) if row.created_by is not None else None
    return _invite(row, creator, now)


async def revoke(horde: Horde, code_or_id: str) -> Invite:
    async with horde.transaction() as session:
        return await revoke_in(session, code_or_id, horde.clock.now())


async def claim(session: AsyncSession, code: str | None, now: float) -> None:
    """Count one use of `code` in the caller's transaction, or refuse naming why it cannot be used.
    The UPDATE's own condition decides: a concurrent claim of the last use waits for this
    transaction's row lock (PostgreSQL) or its turn (SQLite), then finds the code used up."""
    if not code:
        raise HordeError(
            Rc.InviteRequired, "Registration on this horde needs an invite code.", param="invite"
        )
    if not _CODE.fullmatch(code):
        raise _unknown(param="invite")
    digest = hash_key(code)
    claimed = await session.execute(
        update(InviteCode)
        .where(
            InviteCode.code_hash == digest,
            InviteCode.revoked_at.is_(None),
            InviteCode.used < InviteCode.uses,
            InviteCode.expires_at.is_(None) | (InviteCode.expires_at > now),
        )
        .values(used=InviteCode.used + 1)
        .execution_options(synchronize_session=False)
    )
    if claimed.rowcount == 1:
        return
    found = await session.execute(select(InviteCode).where(InviteCode.code_hash == digest))
    row = found.scalar_one_or_none()
    if row is None:
        raise _unknown(param="invite")
    used_up = (Rc.InviteUsedUp, "This invite code has been used as often as it allows.")
    refusal = {
        "revoked": (Rc.InviteRevoked, "This invite code was revoked."),
        "expired": (Rc.InviteExpired, "This invite code has expired."),
    }.get(state_of(row, now), used_up)
    raise HordeError(*refusal, param="invite")
