"""Kudos: an append-only ledger and upfront holds (prices and rewards: requests/prices.py).

Every change of a balance is a `kudos_events` row written in the same transaction as the change it
pays for; `users.kudos` is their sum, moved only here.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import bindparam, exists, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key

from horde_lite.db.models import KudosEvent, KudosHold, SharedKey, TextRequest, User
from horde_lite.db.rows import Write, write_rows
from horde_lite.settings import KudosSettings


def hold_key(request_id: str) -> str:
    return f"upfront:{request_id}"


def account_floor(user: User, settings: KudosSettings) -> float:
    return settings.anonymous_floor if user.anonymous else settings.registered_floor


# Built once: building a statement costs more in Python than its round trip (a creation reads one).
_USER_HOLDS = select(func.coalesce(func.sum(KudosHold.remaining), 0.0)).where(
    KudosHold.user_id == bindparam("user_id"), KudosHold.active.is_(True), KudosHold.reserves_user.is_(True)
)
_KEY_HOLDS = select(func.coalesce(func.sum(KudosHold.remaining), 0.0)).where(
    KudosHold.shared_key_hash == bindparam("key_hash"), KudosHold.active.is_(True)
)


async def active_holds(session: AsyncSession, user_id: int) -> float:
    """What the user's funded requests still reserve of its kudos."""
    return float((await session.execute(_USER_HOLDS, {"user_id": user_id})).scalar_one())


async def shared_key_reserved(session: AsyncSession, key_hash: str) -> float:
    """What the key's unfinished requests, free and funded, still reserve of its budget."""
    return float((await session.execute(_KEY_HOLDS, {"key_hash": key_hash})).scalar_one())


async def lock_shared_key(session: AsyncSession, shared: SharedKey) -> None:
    """Lock the key's row (after the owner's users row: docs/explanation/locking.md) so that
    concurrent requests through one key read its budget one at a time."""
    await session.refresh(shared, with_for_update=True)


async def spendable(session: AsyncSession, user: User, settings: KudosSettings) -> float:
    return user.kudos - account_floor(user, settings) - await active_holds(session, user.id)


async def record(session: AsyncSession, user_id: int, amount: float, kind: str, ref: str, now: float) -> None:
    """Move the materialised balance, then append its ledger event, atomically in SQL.

    The UPDATE comes first so the users row is locked before the ledger row's foreign key takes
    its weaker share lock: an insert first, then the update, is a lock upgrade that deadlocks
    against a creation holding `FOR UPDATE` on the same user (PostgreSQL). Moving several balances
    in one transaction goes through `record_all`, which takes the rows in ascending id order."""
    await record_all(session, [(user_id, amount, kind)], ref, now)


async def record_all(
    session: AsyncSession, entries: list[tuple[int, float, str]], ref: str, now: float
) -> None:
    """Several (user id, amount, kind) moves in one transaction (a charge, a transfer): the users
    rows are updated in ascending id order, the ledger rows are inserted after all of them."""
    await write_rows(session, await _moved(session, entries, ref, now))


_events = KudosEvent.__table__


async def _moved(
    session: AsyncSession, entries: list[tuple[int, float, str]], ref: str, now: float
) -> list[Write]:
    """Move the balances of (user id, amount, kind) `entries` in ascending id order; their ledger
    rows, which the caller must write in this transaction, after the moves."""
    ordered = sorted(entries, key=lambda e: e[0])
    await _move(session, [(user_id, amount) for user_id, amount, _kind in ordered])
    return [
        Write(_events, {"user_id": user_id, "amount": amount, "kind": kind, "ref": ref, "created_at": now})  # type: ignore[arg-type]
        for user_id, amount, kind in ordered
    ]


_users = User.__table__
_MOVE = (
    update(_users)
    .where(_users.c.id == bindparam("user_id"))
    .values(kudos=_users.c.kudos + bindparam("amount"))
)


async def _move(session: AsyncSession, moves: list[tuple[int, float]]) -> None:
    """Add each amount to its user's balance in SQL, in the order given, in one statement (one
    round trip for a job's two moves); a user already loaded in the session sees its new balance,
    as the ORM's own update would have shown it."""
    await session.execute(_MOVE, [{"user_id": user_id, "amount": amount} for user_id, amount in moves])
    for user_id, amount in moves:
        user = session.identity_map.get(identity_key(User, user_id))
        if user is not None and "kudos" in user.__dict__:
            set_committed_value(user, "kudos", user.kudos + amount)


def new_hold(
    user_id: int,
    request_id: str,
    amount: float,
    now: float,
    *,
    shared_key_hash: str | None = None,
    reserves_user: bool = True,
) -> KudosHold:
    """The hold that reserves `amount` for a request, for admission to insert with the request: of
    the user's kudos (a funded request) and, for a request made through a shared key, of that key's
    budget (free requests too)."""
    return KudosHold(
        key=hold_key(request_id),
        user_id=user_id,
        request_id=request_id,
        amount=amount,
        remaining=amount,
        active=True,
        created_at=now,
        shared_key_hash=shared_key_hash,
        reserves_user=reserves_user,
    )


# Whether the request has a hold, as a column of a statement reading text_requests. A hold is only
# ever placed by admission, in the transaction that inserts its request, so a reader that sees none
# will never see one: it tells the session (`note_holdless`), whose hold statements for that request
# then need not run (a free request's submit is a round trip shorter). A hold seen may be released
# meanwhile: the statements run and find it inactive, as they would have anyway.
HAS_HOLD = exists().where(KudosHold.request_id == TextRequest.id).label("has_hold")
_HOLDLESS = "horde_lite.holdless_requests"  # session.info key: requests known to have no hold


def note_holdless(session: AsyncSession, request_id: str) -> None:
    session.info.setdefault(_HOLDLESS, set()).add(request_id)


def _known_holdless(session: AsyncSession, request_id: str) -> bool:
    return request_id in session.info.get(_HOLDLESS, ())


async def consume_hold(session: AsyncSession, request_id: str, charged: float) -> None:
    """A charged job uses up that much of its request's hold (never below zero)."""
    if _known_holdless(session, request_id):
        return
    hold = await session.get(KudosHold, hold_key(request_id))
    if hold is not None and hold.active:
        hold.remaining = max(0.0, round(hold.remaining - charged, 2))


_holds = KudosHold.__table__
_RELEASE = (
    update(_holds)
    .where(_holds.c.key == bindparam("hold"), _holds.c.active.is_(True))
    .values(active=False, remaining=0.0)
)


async def release_hold(session: AsyncSession, request_id: str) -> None:
    """The request's hold reserves nothing any more: a Core statement, built once (the ORM's own
    update costs more in Python than its round trip). A hold the session has loaded (consumed in this
    transaction) is written first and then told its new values, as the ORM's update would: its
    pending change is never written over the release. Holds are placed with Core inserts
    (`new_hold`, inserted by admission's Core insert), so none is ever pending in the session."""
    if _known_holdless(session, request_id):
        return
    key = hold_key(request_id)
    held = identity_key(KudosHold, key)
    if held in session.identity_map:
        await session.flush()
    await session.execute(_RELEASE, {"hold": key})
    hold = session.identity_map.get(held)
    if hold is not None and hold.active:
        set_committed_value(hold, "active", False)
        set_committed_value(hold, "remaining", 0.0)


@dataclass(frozen=True, slots=True)
class Charge:
    amount: float  # what the requester paid
    ledger: list[Write]  # the job's ledger rows: the caller writes them in this transaction


async def charge_job(
    session: AsyncSession,
    *,
    requester_id: int,
    shared_key_hash: str | None,
    worker_owner_id: int,
    request_id: str,
    generation_id: str,
    reward: float,
    now: float,
) -> Charge:
    """Settle one job: the owner earns `reward`, the requester pays `reward + 1`. The balances move
    here; the ledger rows are returned for the caller to write with its other writes of the
    settlement (`rows.write_rows`: one statement on PostgreSQL). The caller then takes the charge
    from the request's hold (`consume_hold`) unless the request ended and released it."""
    charge = round(reward + 1, 2)
    # The lock order of docs/explanation/locking.md: users rows in ascending id (two submits paying
    # each other's users in opposite directions cannot deadlock), then the shared key; the hold
    # comes after (the caller); the ledger rows are inserted after the balances.
    moves = [(worker_owner_id, reward, "reward"), (requester_id, -charge, "charge")]
    ledger = await _moved(session, moves, generation_id, now)
    if shared_key_hash is not None:
        await session.execute(
            update(SharedKey)
            .where(SharedKey.key_hash == shared_key_hash)
            .values(utilized=SharedKey.utilized + charge)
        )
    return Charge(charge, ledger)
