"""In-process wake-ups for waiters (the chat front) when a request changes. The database stays the
source of truth: waiters also poll, so several server processes on one PostgreSQL still work."""

from __future__ import annotations

import asyncio
from collections import defaultdict


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

    def notify(self, key: str) -> None:
        for event in self._events.get(key, ()):
            event.set()

    async def wait(self, key: str, seconds: float) -> None:
        """Return when `key` is notified or after `seconds`, whichever comes first."""
        event = self.subscribe(key)
        try:
            await asyncio.wait_for(event.wait(), seconds)
        except TimeoutError:
            pass
        finally:
            self.unsubscribe(key, event)
