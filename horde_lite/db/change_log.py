"""The change log: one row per change to a request or a worker that the wait estimate reads, written
by the database's own triggers (migrations 0009, 0010 and 0020), so no code path can forget one.

Each process keeps the waiting queue and the fleet in memory (queue/mirror.py) and catches up
by reading the rows written since it last read. Rows arrive in the order their transactions commit
only on SQLite (one writer at a time); on PostgreSQL a transaction running when a reader reads may
commit rows with smaller ids later, so a reader also re-asks for the rows of the transactions that
were running at its last read (`Cursor.in_flight`, from `pg_current_snapshot()`), which makes the
catch-up exact without waiting or guessing.

A worker's check-in is noted only when it moves back or jumps by more than `CHECK_IN_NOTED_JUMP`
(a worker coming back online; the number is the triggers', and `[worker] online_seconds` must exceed
it): readers re-read the check-in of a worker they would otherwise take for offline.

The table is not in the model set: nothing but the triggers writes it, and a bulk delete of the
model tables (a test's wipe) must not take the rows that record it. Rows older than
`KEEP_SECONDS` are pruned by the sweep; a reader that fell further behind reloads everything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    any_,
    bindparam,
    cast,
    delete,
    func,
    literal,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ColumnElement

change_log = Table(
    "change_log",
    MetaData(),
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
    Column("kind", String(1), nullable=False),  # REQUEST or WORKER
    Column("ref", String(36), nullable=False),  # the row's id
    Column("xid", BigInteger(), nullable=True),  # PostgreSQL: the transaction that wrote it
    Column("at", Float(), nullable=False),  # wall-clock seconds (pruning)
)
REQUEST, WORKER = "r", "w"
# How long rows are kept; a reader whose last read is older than half of it reloads instead.
KEEP_SECONDS = 600.0

# Seconds; the triggers' own number (migration 0010), repeated here for the code that relies on it.
CHECK_IN_NOTED_JUMP = 20.0


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a reader stands: every row up to `last_id` is read, but those of the transactions
    `in_flight` (PostgreSQL), which were running at the last read and may still add rows below it."""

    last_id: int
    in_flight: tuple[int, ...] = ()


def snapshot(dialect: str) -> ColumnElement[Any]:
    """The reading statement's own snapshot as text (`xmin:xmax:xip,...`; NULL on SQLite)."""
    if dialect == "postgresql":
        return cast(func.pg_current_snapshot(), String)
    return literal(None, String)


def after(cursor_dialect: str) -> ColumnElement[bool]:
    """The rows a reader at a cursor has not read (bound parameters `last_id`, `in_flight`)."""
    newer = change_log.c.id > bindparam("last_id", type_=BigInteger)
    if cursor_dialect != "postgresql":
        return newer
    return or_(newer, change_log.c.xid == any_(bindparam("in_flight", type_=ARRAY(BigInteger))))


def values(cursor: Cursor, dialect: str) -> dict[str, Any]:
    out: dict[str, Any] = {"last_id": cursor.last_id}
    if dialect == "postgresql":
        out["in_flight"] = list(cursor.in_flight)
    return out


def advance(cursor: Cursor, snap: str | None, ids: list[int]) -> Cursor:
    """The cursor after a read that returned rows `ids` under snapshot `snap`."""
    last = max([cursor.last_id, *ids])
    if not snap:
        return Cursor(last)
    running = snap.split(":")[2]
    return Cursor(last, tuple(int(x) for x in running.split(",")) if running else ())


async def prune(session: AsyncSession, keep: float = KEEP_SECONDS) -> int:
    """Delete the rows older than `keep` wall-clock seconds; how many."""
    result = await session.execute(delete(change_log).where(change_log.c.at < time.time() - keep))
    return int(getattr(result, "rowcount", 0) or 0)


def newest() -> Any:
    """The newest row's id (0 for none): where a reader that has just loaded everything starts."""
    return select(func.coalesce(func.max(change_log.c.id), 0))
