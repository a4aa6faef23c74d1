"""The statements an engine sends while a block runs, as tests that count or inspect them need."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

_CONTROL = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE")


@dataclass(frozen=True, slots=True)
class Sent:
    statement: str
    options: Mapping[str, Any]  # the connection's execution options when it was sent

    @property
    def control(self) -> bool:
        """A transaction's own statement (BEGIN, COMMIT, a savepoint), not the work's."""
        return self.statement.lstrip().upper().startswith(_CONTROL)


# The app's timer-driven task, which reads the policies and modes every `[policies] reload_seconds`
# of real time, whenever that falls: never part of what a test does.
_WATCHES = frozenset({"horde_lite-policy-watch"})


def _from_a_watch() -> bool:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop: a synchronous caller
        return False
    return task is not None and task.get_name() in _WATCHES


@contextmanager
def statements_sent(engine: AsyncEngine) -> Iterator[list[Sent]]:
    """Every statement `engine` sends while the block runs, in order, but the policy watch's."""
    sent: list[Sent] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not _from_a_watch():
            sent.append(Sent(statement, conn.get_execution_options()))

    target = engine.sync_engine
    event.listen(target, "before_cursor_execute", note)
    try:
        yield sent
    finally:
        event.remove(target, "before_cursor_execute", note)
