"""Time as epoch seconds. The app reads it through a Clock so tests can move it forward instead
of sleeping through a lease (a seam for time, not a mock of our code)."""

from __future__ import annotations

import time


class Clock:
    def now(self) -> float:
        return time.time()


class ManualClock(Clock):
    """A clock that starts at real time and only moves when told to (tests, benchmarks)."""

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds
