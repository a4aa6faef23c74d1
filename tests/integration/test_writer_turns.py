"""On SQLite the transactions of one process take turns to write in arrival order, where sqlite3's
busy handler let the newest overtake the oldest; on PostgreSQL they run side by side."""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from horde_lite.core.context import Horde


async def test_transactions_take_turns_in_arrival_order_on_sqlite_only(horde: Horde) -> None:
    entered: list[int] = []
    began, release = asyncio.Event(), asyncio.Event()

    async def transaction(index: int) -> None:
        async with horde.transaction() as session:
            await session.execute(text("SELECT 1"))  # SQLite: BEGIN IMMEDIATE, the write lock
            entered.append(index)
            if index == 0:
                began.set()
                await release.wait()

    first = asyncio.create_task(transaction(0))
    await began.wait()
    later = []
    for index in range(1, 6):
        later.append(asyncio.create_task(transaction(index)))
        await asyncio.sleep(0.05)  # each arrives well after the one before
    if horde.engine.dialect.name == "sqlite":
        assert entered == [0]  # every later one waits for the first's turn
    else:
        assert sorted(entered) == [0, 1, 2, 3, 4, 5]  # nothing waited for the first
    release.set()
    await asyncio.wait_for(asyncio.gather(first, *later), 30)
    assert entered == [0, 1, 2, 3, 4, 5]
