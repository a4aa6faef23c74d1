"""In-process wake-ups for waiters (the chat front) when a request changes. The database stays the
source of truth: waiters also poll, so several server processes on one PostgreSQL still work."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

_PENDING = "horde_lite.notify_on_commit"


class Notifier:
    def __init__(self) -> None:
        self._events: dict[str, set[asyncio.Event]] = defaultdict(set)

    def subscribe(self, key: str) -> asyncio.Event:
        event = asyncio.Event()
        self._events[key].add(event)
        return event

    def unsubscribe(self, key: str, event: asyncio.Event) -> None:
        waiters = self._events.get(key)
        if waiters is not None:
            waiters.discard(event)
            if not waiters:
                del self._events[key]

    def on_commit(self, session: AsyncSession, key: str) -> None:
        """Wake `key`'s waiters when this session's transaction commits, not before: a waiter woken
        earlier would read the rows as they were and sleep again."""
        pending: set[str] = session.info.setdefault(_PENDING, set())
        if not pending:
            event.listen(session.sync_session, "after_commit", self._flush, once=True)
            event.listen(session.sync_session, "after_rollback", self._drop, once=True)
        pending.add(key)

    def _flush(self, session: Session) -> None:
        for key in session.info.pop(_PENDING, set()):
            self.notify(key)

    def _drop(self, session: Session) -> None:
        session.info.pop(_PENDING, None)

    def notify(self, key: str) -> None:
        for waiter in self._events.get(key, ()):
            waiter.set()

    async def wait(self, key: str, seconds: float) -> None:
        """Return when `key` is notified or after `seconds`, whichever comes first."""
        waiter = self.subscribe(key)
        try:
            await asyncio.wait_for(waiter.wait(), seconds)
        except TimeoutError:
            pass
        finally:
            self.unsubscribe(key, waiter)
