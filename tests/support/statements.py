"""The statements an engine sends while a block runs, as tests that count or inspect them need."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from horde_lite.jobs import pop_waiters
from horde_lite.operators import policy_state
from horde_lite.operators.ip_timeouts import POLL_TASK

_CONTROL = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE")


@dataclass(frozen=True, slots=True)
class Sent:
    statement: str
    options: Mapping[str, Any]  # the connection's execution options when it was sent

    @property
    def control(self) -> bool:
        """A transaction's own statement (BEGIN, COMMIT, a savepoint), not the work's."""
        return self.statement.lstrip().upper().startswith(_CONTROL)


# The app's timer-driven reads, in tasks of their own: the policy watch (every `[policies]
# reload_seconds` of real time), the address timeouts' poll (started by a call's check once its
# copy is that old, run beside the call) and the waiting pops' watcher (every `[pops]
# wait_poll_seconds`, while pops wait or idle answers are remembered without a channel). They fall
# whenever the real clock says, never as part of what a test does.
_TIMED = frozenset({policy_state.WATCH_TASK, POLL_TASK, pop_waiters.WATCH_TASK})


def _timed() -> bool:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop: a synchronous caller
        return False
    return task is not None and task.get_name() in _TIMED


@contextmanager
def statements_sent(engine: AsyncEngine, *, timed: bool = False) -> Iterator[list[Sent]]:
    """Every statement `engine` sends while the block runs, in order; the timed background reads'
    only with `timed` (a test of those reads)."""
    sent: list[Sent] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if timed or not _timed():
            sent.append(Sent(statement, conn.get_execution_options()))

    target = engine.sync_engine
    event.listen(target, "before_cursor_execute", note)
    try:
        yield sent
    finally:
        event.remove(target, "before_cursor_execute", note)
