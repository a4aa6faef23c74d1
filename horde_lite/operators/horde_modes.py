"""The horde's modes in force, shared by every process of the horde through the database.

`horde_modes` holds one row: the three modes and a version that grows by one at each switch that
changes something; `horde_mode_changes` logs every mode switched, on or off, with who switched it
(`name#id`, or `operator` for the CLI) and through what (`api`, `dashboard`, `cli`). A database
with no row yet has every mode off.

Each server process applies the row as policies are applied (operators/policy_state.py's
`PolicyWatcher` calls `apply` at each of its polls, every `[policies] reload_seconds`), and the
process that switched applies it at once. A switch is one transaction under the row's lock, so two
switches at once both count and the version says which came last.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from horde_lite.clock import Clock
from horde_lite.core.context import Horde, transaction_on
from horde_lite.core.modes import MODES_OFF, HordeModes
from horde_lite.db.engine import make_sessionmaker
from horde_lite.db.models import HordeModeChange, HordeModeState

log = logging.getLogger("horde_lite.modes")

Mode = Literal["maintenance", "invite_only", "raid"]
MODES: tuple[Mode, ...] = ("maintenance", "invite_only", "raid")
ROW_ID = 1
OPERATOR = "operator"  # who the CLI's switches are logged as


@dataclass(frozen=True, slots=True)
class ModeChange:
    """One horde_mode_changes row."""

    id: int
    at: float
    mode: str
    enabled: bool
    changed_by: str
    source: str


def _modes(row: HordeModeState | None) -> HordeModes:
    if row is None:
        return MODES_OFF
    return HordeModes(maintenance=row.maintenance, invite_only=row.invite_only, raid=row.raid,
                      version=row.version)  # fmt: skip


async def read(session: AsyncSession) -> HordeModes:
    """The database's modes (all off, version 0, before the first switch)."""
    return _modes(await session.get(HordeModeState, ROW_ID, populate_existing=True))


async def _locked_row(session: AsyncSession, now: float) -> HordeModeState:
    """The row, locked; inserted first (every mode off) unless another process just did."""
    dialect = session.get_bind().dialect.name
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    await session.execute(
        insert(HordeModeState)
        .values(id=ROW_ID, maintenance=False, invite_only=False, raid=False, version=0, changed_at=now)
        .on_conflict_do_nothing(index_elements=["id"])
    )
    query = select(HordeModeState).where(HordeModeState.id == ROW_ID).with_for_update()
    return (await session.execute(query.execution_options(populate_existing=True))).scalar_one()


async def switch(
    target: Horde | AsyncEngine,
    changes: Mapping[Mode, bool],
    changed_by: str,
    source: str,
    *,
    now: float | None = None,
) -> HordeModes:
    """Set the modes named in `changes` for every process of the horde; returns the modes in force
    after it. Who may is the caller's to check (operators/mode_rights.py; the CLI always may). A
    mode set to what it already is writes nothing; any real change bumps the version once and logs
    one row per mode changed. `target` is a running horde (which applies it at once) or an engine
    (the CLI; the servers apply it at their next poll)."""
    if now is None:
        now = target.clock.now() if isinstance(target, Horde) else Clock().now()
    async with transaction_on(target) as session:
        row = await _locked_row(session, now)
        changed = [(mode, on) for mode, on in changes.items() if getattr(row, mode) != on]
        for mode, on in changed:
            setattr(row, mode, on)
            session.add(HordeModeChange(at=now, mode=mode, enabled=on, changed_by=changed_by, source=source))
        if changed:
            row.version, row.changed_at = row.version + 1, now
        modes = _modes(row)
    for mode, on in changed:
        log.warning("horde mode: %s %s by %s (%s), version %d", mode, "on" if on else "off", changed_by,
                    source, modes.version)  # fmt: skip
    if isinstance(target, Horde):
        await apply(target)  # this process at once; the others at their next poll
    return modes


async def apply(horde: Horde) -> bool:
    """One step of the watch: read the database's modes and, when their version differs from the
    ones this process applies, replace `horde.modes` whole. True when it replaced them."""
    async with horde.reading() as session:
        found = await read(session)
    current = horde.modes
    if found.version == current.version:
        return False
    horde.modes = found  # one assignment: a call that read the old modes keeps them to its end
    horde.pop_waiters.wake_all()  # a mode switched off may free jobs for waiting pops
    on = [mode for mode in MODES if getattr(found, mode)]
    log.warning("horde modes in process %d: %s (version %d -> %d)", os.getpid(),
                ", ".join(on) or "none on", current.version, found.version)  # fmt: skip
    return True


async def history(target: Horde | AsyncEngine, limit: int = 50) -> list[ModeChange]:
    """The newest `limit` switches, newest first (read outside a transaction: the dashboard's
    panel asks at every refresh, and must take no writer's turn on SQLite)."""
    query = select(HordeModeChange).order_by(HordeModeChange.id.desc()).limit(limit)
    if isinstance(target, Horde):
        async with target.reading() as session:
            rows = (await session.execute(query)).scalars().all()
    else:
        async with make_sessionmaker(target)() as session:
            rows = (await session.execute(query)).scalars().all()
    return [ModeChange(r.id, r.at, r.mode, r.enabled, r.changed_by, r.source) for r in rows]
