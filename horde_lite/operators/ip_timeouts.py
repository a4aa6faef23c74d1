"""Address timeouts: a moderator shuts an address or a network out of request creation and of every
worker call for some hours (upstream's `/operations/ipaddr`), or blocks the address a worker last
popped from for some days (`/operations/block_worker_ipaddr/{id}`).

One table (`ip_timeouts`) holds every timeout, shared by every process; what a timeout covers is
`ip_rule.timed_network`. Setting a network that has a timeout replaces it (its new length counts
from now, as upstream's). A timeout ends by itself at `expires_at` (the horde's clock); expired rows
are dropped by the next change. Each process checks callers against its own copy (`ip_cache`),
read again every `[policies] reload_seconds` by a poll the first due check starts, and at once
after a change this process made.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, delete, func, or_, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.accounts.users import display_name
from horde_lite.accounts.workers import last_address
from horde_lite.core.context import Horde
from horde_lite.core.errors import HordeError
from horde_lite.db.models import IpTimeout, User
from horde_lite.operators.ip_rule import (
    MOST_DAYS,
    MOST_HOURS,
    Network,
    asked_network,
    refusal,
    shown,
    timed_network,
)
from horde_lite.rc import Rc

log = logging.getLogger("horde_lite.ip_timeouts")
# The poll task's name (tests tell its timed reads from a call's own statements by it).
POLL_TASK = "reading the address timeouts"

HOUR = 3600.0
DAY = 86400.0
# Live timeouts the horde holds at most: a listing answers all of them, and each process reads them
# all at each poll (bench/ip_timeouts.py: a few milliseconds for this many; a network covers more).
MOST_LIVE = 2_000

_LIVE = select(IpTimeout.network, IpTimeout.expires_at).where(IpTimeout.expires_at > bindparam("now"))


@dataclass(frozen=True, slots=True)
class Timeout:
    """A live timeout as listings show it."""

    ipaddr: str  # a single IPv4 address bare, else a CIDR
    seconds: int  # left, rounded up
    expires_at: float
    created_at: float
    created_by: str | None  # "name#id"; None: open operator pages, or a deleted moderator
    worker_id: str | None  # set by a worker block


@functools.lru_cache(maxsize=4 * MOST_LIVE)
def _network(text: str) -> Network:
    """A stored network (canonical CIDR text), parsed once per process."""
    return ipaddress.ip_network(text)


# --- the check ---------------------------------------------------------------------------------


async def check(horde: Horde, address: str) -> None:
    """Refuse a caller whose address a live timeout covers (`TimeoutIP`, 403). Reads no database:
    the process's copy, polled again when due, in the background (a check never waits for a poll
    but the first, which every check waits for until a copy is installed)."""
    cache = horde.ip_timeouts
    if cache.due():
        ticket = cache.begin(horde.settings.policies.reload_seconds)
        cache.loading = horde.detach(_poll(horde, ticket), POLL_TASK)
    if not cache.loaded and cache.loading is not None:
        await asyncio.shield(cache.loading)
    left = cache.seconds_left(address, horde.clock.now())
    if left > 0:
        raise refusal(math.ceil(left))


async def _poll(horde: Horde, ticket: int | None = None) -> None:
    """`reload`, whose failure leaves the copy as it was: a change is committed whether or not this
    process could read it back, and the next due check polls again."""
    try:
        await reload(horde, ticket)
    except Exception as exc:  # the database may be away
        log.warning("reading the address timeouts failed, keeping this process's copy: %s", exc)


async def reload(horde: Horde, ticket: int | None = None) -> None:
    """Read the live timeouts into this process's copy (a change made here, at once)."""
    cache = horde.ip_timeouts
    if ticket is None:
        ticket = cache.begin(horde.settings.policies.reload_seconds)
    async with horde.reading() as session:
        rows = (await session.execute(_LIVE, {"now": horde.clock.now()})).all()
    cache.replace(ticket, [(_network(network), expires_at) for network, expires_at in rows])


# --- the moderators' changes --------------------------------------------------------------------


def _bounded(value: int, most: int, what: str) -> None:
    """The struct bounds these already; the dashboard's form and the CLI come through here too."""
    if not 1 <= value <= most:
        raise HordeError(Rc.BadRequest, f"A timeout lasts 1 to {most} {what}.", param=what)


async def _set(
    session: AsyncSession,
    network: Network,
    expires_at: float,
    now: float,
    by: int | None,
    worker_id: str | None,
) -> None:
    """Insert the network's timeout or replace the one it has, dropping the expired ones; refused
    past `MOST_LIVE` live timeouts (replacing one is always allowed)."""
    await session.execute(delete(IpTimeout).where(IpTimeout.expires_at <= now))
    text = str(network)
    live = (await session.execute(select(func.count()).select_from(IpTimeout))).scalar_one()
    if live >= MOST_LIVE and await session.get(IpTimeout, text) is None:
        raise HordeError(
            Rc.BadRequest, f"The horde holds {MOST_LIVE} live timeouts already; lift some first."
        )
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    values: dict[str, Any] = {
        "expires_at": expires_at,
        "created_at": now,
        "created_by": by,
        "worker_id": worker_id,
    }
    statement = insert(IpTimeout).values(network=text, **values)
    await session.execute(statement.on_conflict_do_update(index_elements=["network"], set_=values))


async def add(horde: Horde, ipaddr: str, hours: int, by: int | None = None) -> Network:
    """POST /operations/ipaddr: time out an address or CIDR for `hours` (1 to 720) from now; the
    network it covers (`ip_rule.timed_network`)."""
    network = timed_network(ipaddr)
    _bounded(hours, MOST_HOURS, "hours")
    now = horde.clock.now()
    async with horde.transaction() as session:
        await _set(session, network, now + hours * HOUR, now, by, None)
    await _poll(horde)
    log.info("address timeout: %s for %d hours (moderator %s)", network, hours, by)
    return network


async def lift(horde: Horde, ipaddr: str) -> bool:
    """DELETE /operations/ipaddr: lift the timeout of what `ipaddr` covers (the network a POST of it
    made); whether there was one. Lifting what has none changes nothing (upstream answers OK)."""
    network = timed_network(ipaddr)
    async with horde.transaction() as session:
        result = await session.execute(delete(IpTimeout).where(IpTimeout.network == str(network)))
    await _poll(horde)
    return bool(getattr(result, "rowcount", 0))


async def block_worker(horde: Horde, worker_id: str, days: int, by: int | None = None) -> Network:
    """PUT /operations/block_worker_ipaddr/{id}: time out the address the worker last popped from
    (an IPv6 address's /64) for `days` (1 to 30)."""
    _bounded(days, MOST_DAYS, "days")
    now = horde.clock.now()
    async with horde.transaction() as session:
        found_id, address = await last_address(session, worker_id)
        if address is None:
            raise HordeError(Rc.BadRequest, f"Worker {found_id} has not popped from an IP address yet.")
        network = timed_network(address)
        await _set(session, network, now + days * DAY, now, by, found_id)
    await _poll(horde)
    log.info("worker block: %s (worker %s) for %d days (moderator %s)", network, found_id, days, by)
    return network


async def unblock_worker(horde: Horde, worker_id: str) -> int:
    """DELETE /operations/block_worker_ipaddr/{id}: lift the timeouts its blocks made and the one of
    its last address; how many were lifted."""
    async with horde.transaction() as session:
        found_id, address = await last_address(session, worker_id)
        which = IpTimeout.worker_id == found_id
        if address is not None:
            which = or_(which, IpTimeout.network == str(timed_network(address)))
        result = await session.execute(delete(IpTimeout).where(which))
    await _poll(horde)
    return int(getattr(result, "rowcount", 0) or 0)


# --- the listings ---------------------------------------------------------------------------------


async def _listed(horde: Horde) -> list[tuple[Network, Timeout]]:
    now = horde.clock.now()
    query = (
        select(IpTimeout, User)
        .outerjoin(User, User.id == IpTimeout.created_by)
        .where(IpTimeout.expires_at > now)
        .order_by(IpTimeout.created_at.desc(), IpTimeout.network)
    )
    async with horde.reading() as session:
        rows = (await session.execute(query)).tuples().all()
    listed = []
    for row, user in rows:
        network = _network(row.network)
        timeout = Timeout(
            ipaddr=shown(network),
            seconds=math.ceil(row.expires_at - now),
            expires_at=row.expires_at,
            created_at=row.created_at,
            created_by=display_name(user) if user is not None else None,
            worker_id=row.worker_id,
        )
        listed.append((network, timeout))
    return listed


async def live(horde: Horde) -> list[Timeout]:
    """Every live timeout, the newest first."""
    return [timeout for _, timeout in await _listed(horde)]


async def matching(horde: Horde, ipaddr: str) -> list[Timeout]:
    """GET /operations/ipaddr/{ipaddr}: the live timeouts covering the address, or overlapping the
    network, `ipaddr` names (as given, not widened)."""
    asked = asked_network(ipaddr)
    return [timeout for network, timeout in await _listed(horde) if network.overlaps(asked)]
