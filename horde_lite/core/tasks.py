"""Work that runs in a task of its own: a caller cancelled while it waits (its client gone, the
server stopping) cannot cut it off halfway, with a transaction or a connection in mid-statement.
Failures are logged, since the caller may be gone; a stopping app waits for what is still running."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any


class TaskSet:
    def __init__(self, log: logging.Logger, level: int = logging.WARNING) -> None:
        self._log = log
        self._level = level
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            self._log.log(self._level, "%s failed: %r", task.get_name(), error)

    async def wait(self, within: float) -> int:
        """Wait up to `within` seconds for the tasks of the running event loop (a test harness may
        run an app in two); how many are still running."""
        loop = asyncio.get_running_loop()
        if running := {task for task in self._tasks if task.get_loop() is loop}:
            await asyncio.wait(running, timeout=within)
        return sum(1 for task in self._tasks if task.get_loop() is loop)
