"""The query planner's statistics, kept without an operator's step.

SQLite keeps none unless something runs ANALYZE: without them, at a hundred thousand queued
requests the planner picks the wrong index for a pop's reads. horde_lite follows SQLite's advice for
long-lived connections: each connection of the app's pool opens with `PRAGMA optimize=0x10002`
(`ON_OPEN`), the process analyzes a file that was never analyzed when it starts (`at_start`), and
`PRAGMA optimize` runs every `REFRESH_SECONDS` beside the lease sweep (`refresh`): it re-analyzes a
table only when its size has moved far from its statistics (or it has none), else it costs a few
page reads. On SQLite before 3.46, `optimize` looks only at the tables the connection has
queried, which on the pool's long-lived connections are the hot ones.

PostgreSQL needs none of this: autovacuum analyzes its tables as they change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

if TYPE_CHECKING:
    from horde_lite.core.context import Horde

# The statements each connection of the app's pool runs when it opens. Not on the reader of the
# process's copy of the queue: a transaction holding the write lock can wait on that connection.
# No `analysis_limit`: a sampled ANALYZE caps each index's rows per key at the sample's size, and
# the queue's index then looks selective where it is not (worse plans than no statistics at all);
# a whole ANALYZE reads each index once, and runs only when a table's size moved far.
ON_OPEN = ("PRAGMA optimize=0x10002",)
# How often `refresh` runs. Its check is a few page reads when nothing moved, so it runs often
# enough to follow a queue that grows by thousands of requests within minutes.
REFRESH_SECONDS = 600.0

_ANALYZED = text("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sqlite_stat1'")


async def at_start(engine: AsyncEngine) -> None:
    """Once per process, after the migrations: a SQLite file never analyzed (new, or made before
    horde_lite kept statistics) is analyzed now, so its first queries have statistics to read."""
    if engine.dialect.name != "sqlite":
        return
    async with engine.begin() as conn:
        if (await conn.execute(_ANALYZED)).first() is None:
            await conn.execute(text("ANALYZE"))


async def refresh(horde: Horde) -> None:
    """SQLite's periodic `PRAGMA optimize`, in a transaction of its own (a writer turn: an
    ANALYZE writes `sqlite_stat1`)."""
    if horde.engine.dialect.name != "sqlite":
        return
    async with horde.transaction() as session:
        await session.execute(text("PRAGMA optimize"))
