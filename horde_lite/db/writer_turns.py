"""This process's SQLite transactions take turns to write, first come first served.

SQLite has one writer and every app transaction begins IMMEDIATE (db/engine.py), so transactions
queue for the database's lock whatever is done. Left to sqlite3, a waiting transaction sleeps in
the busy handler between tries, 1 ms growing to 100 ms: the lock often lies free while every
waiter sleeps, and a newcomer overtakes the transaction that has waited longest (full job cycles
on SQLite had a p99 of seconds). Here they wait on an asyncio lock instead, which hands the turn on
the moment it is free, in arrival order. Other processes on the same file (and the CLI) still meet
the busy handler; PostgreSQL needs none of this."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from weakref import WeakKeyDictionary

from sqlalchemy import exc

# Set while this task (or a task it started) holds a turn.
_holding: ContextVar[bool] = ContextVar("horde_lite_writer_turn", default=False)


class WriterTurns:
    def __init__(self, enabled: bool, patience: float) -> None:
        self._enabled = enabled
        self._patience = patience  # as long as sqlite3's busy timeout would have waited
        # One lock per event loop: a test harness may run one app on two loops.
        self._locks: WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = WeakKeyDictionary()

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Hold this process's turn to write for the block. A transaction opened while a turn is
        held (nested, or in a task started inside one) does not wait for it, which would never
        end: it meets sqlite3's busy handler, as it would without turns. No turn came within the
        patience: `sqlalchemy.exc.TimeoutError`, answered as an unavailable database (503)."""
        if not self._enabled or _holding.get():
            yield
            return
        lock = self._locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())
        try:
            async with asyncio.timeout(self._patience):
                await lock.acquire()
        except TimeoutError:
            raise exc.TimeoutError(f"no turn to write came within {self._patience:.0f} s") from None
        token = _holding.set(True)
        try:
            yield
        finally:
            _holding.reset(token)
            lock.release()
