"""The running horde as the lifecycle sees it: settings, selected policies, metrics, clock, DB."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

from horde_lite.clock import Clock
from horde_lite.core.modes import MODES_OFF, HordeModes
from horde_lite.core.notify import JobsArrived, Notifier
from horde_lite.core.tasks import TaskSet
from horde_lite.db.engine import SQLITE_BUSY_TIMEOUT_MS, connect_to_read, make_sessionmaker, reads_autocommit
from horde_lite.db.writer_turns import WriterTurns
from horde_lite.filters.cache import FilterCache
from horde_lite.jobs.idle_answers import IdleAnswers
from horde_lite.jobs.pop_waiters import PopWaiters, changed_requests
from horde_lite.metrics import Metrics
from horde_lite.operators.ip_cache import LiveTimeouts
from horde_lite.policies.registry import Policies
from horde_lite.queue.eligibility import Rules
from horde_lite.queue.mirror import QueueMirror
from horde_lite.requests.prices import ModelSizes
from horde_lite.settings import Settings
from horde_lite.webhooks.delivery import WebhookDeliveries

log = logging.getLogger("horde_lite")
T = TypeVar("T")


@dataclass
class Horde:
    settings: Settings
    policies: Policies
    metrics: Metrics
    clock: Clock
    engine: AsyncEngine
    sessionmaker: async_sessionmaker[AsyncSession]
    notifier: Notifier = field(default_factory=lambda: Notifier())
    _detached: TaskSet = field(default_factory=lambda: TaskSet(log), repr=False)
    # The queue and the fleet as the wait estimate reads them (made from the settings unless given).
    mirror: QueueMirror = field(default=None, repr=False)  # type: ignore[assignment]
    # The horde's model sizes, which price every request (read from the settings unless given).
    sizes: ModelSizes = field(default=None, repr=False)  # type: ignore[assignment]
    # The horde's modes this process applies (operators/horde_modes.py keeps them in step with the
    # database's); replaced whole, never changed in place.
    modes: HordeModes = MODES_OFF
    # The live address timeouts as this process last read them (operators/ip_timeouts.py).
    ip_timeouts: LiveTimeouts = field(default_factory=LiveTimeouts, repr=False)
    # This process's compiled copy of the prompt filters (filters/cache.py).
    filters: FilterCache = field(default_factory=FilterCache, repr=False)
    # Requests' webhooks, sent in the background after their submits commit.
    webhooks: WebhookDeliveries = field(init=False, repr=False)
    # This process's waiting pops, woken through the notifier (jobs/pop_waiters.py).
    pop_waiters: PopWaiters = field(init=False, repr=False)
    # Idle pops' answers this process gives again from memory (jobs/idle_answers.py).
    idle_answers: IdleAnswers = field(init=False, repr=False)

    _turns: WriterTurns = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.mirror is None:
            self.mirror = QueueMirror(self.settings)
        if self.sizes is None:
            self.sizes = ModelSizes.from_settings(self.settings.kudos)
        self.webhooks = WebhookDeliveries(self.settings.webhooks, self.metrics)
        sqlite = self.engine.dialect.name == "sqlite"
        self.idle_answers = IdleAnswers(self.settings.pops.idle_answer_seconds, heard=self._heard)
        self.pop_waiters = PopWaiters(
            self.metrics,
            self.settings.pops.wait_poll_seconds,
            changed=lambda last: changed_requests(self.reading, last),
            channel_open=self._channel_open,
            told=self.idle_answers.jobs_arrived,
        )
        self.notifier.on_jobs = self._jobs_arrived
        self._turns = WriterTurns(enabled=sqlite, patience=SQLITE_BUSY_TIMEOUT_MS / 1000)

    def _channel_open(self) -> bool:
        """Another process's wake-ups reach this one now (its LISTEN connection is up)."""
        return self.engine.dialect.name != "sqlite" and self.notifier.listening.is_set()

    def _heard(self) -> Hashable | None:
        """What tells this process of other processes' new jobs now, for the idle answers: its
        LISTEN connection, else the waiting pops' watcher (kept checking while answers are used)."""
        if self._channel_open():
            return ("listen", self.notifier.listens)
        watcher = self.pop_waiters.watched(self.settings.pops.idle_answer_seconds)
        return None if watcher is None else ("watch", watcher)

    def _jobs_arrived(self, arrived: JobsArrived, remote: bool) -> None:
        # The remembered answers first: a woken pop must not be answered from them.
        self.idle_answers.jobs_arrived(arrived.models)
        self.pop_waiters.jobs_arrived(arrived, remote)

    @property
    def autocommit_reads(self) -> bool:
        """`reading()`'s connections autocommit (db/engine.py `reads_autocommit`): one statement
        that may run twice can write there and commits alone."""
        return reads_autocommit(self.engine)

    def rules(self, now: float) -> Rules:
        """The rules under the policies in force now (one read; a call that applies them throughout
        takes `in_force()` instead)."""
        return self.in_force().rules(now)

    def in_force(self) -> InForce:
        """The policies, settings and modes in force now, for one call to apply throughout."""
        return InForce(policies=self.policies, settings=self.settings, modes=self.modes)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """One short transaction: committed when the block ends, rolled back on any error (so a
        refused request leaves nothing behind). Lifecycle entry points open their own. On SQLite
        this process's transactions take turns (db/writer_turns.py)."""
        async with self._turns.turn(), self.sessionmaker() as session, session.begin():
            yield session

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[AsyncSession]:
        """A session that only reads, outside any transaction: each statement reads one snapshot
        of its own. No BEGIN or COMMIT round trip on PostgreSQL, and on SQLite neither the write
        lock nor this process's turn. A reader that finds it must write goes on in `transaction()`;
        the one exception is an idle pop's due check-in on PostgreSQL (`dispatch.look`), a single
        statement that commits at once (`autocommit_reads`)."""
        async with connect_to_read(self.engine) as conn, self.sessionmaker(bind=conn) as session:
            yield session

    async def read_retried(self, read: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """`read` on a connection like `reading()`'s, checked out without the pool's ping: a read
        that may run twice (no writes, no effect before its last statement) saves that round trip.
        A database error ends the connection for good (invalidated, not pooled again) and `read`
        runs once more on a pinged connection, which replaces a lost one. Any error, not only
        those SQLAlchemy takes for a lost connection: between the server's termination message and
        the socket's close, asyncpg fails a statement with one it does not. An error the second run
        meets too is raised. `read` opens a session on the connection when it needs one
        (`sessionmaker(bind=conn)`)."""
        try:
            async with connect_to_read(self.engine, checked=False) as conn:
                try:
                    return await read(conn)
                except DBAPIError:
                    await conn.invalidate()
                    raise
        except DBAPIError as error:
            log.info("a read without the pool's check failed (%s); reading again", type(error.orig).__name__)
        async with connect_to_read(self.engine) as conn:
            return await read(conn)

    def detach(self, work: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        """Run `work` in a task of its own (core/tasks.py): a cancelled caller cannot cut its
        transaction in half. The app waits for these tasks (`drain`) before it closes the database."""
        return self._detached.start(work, what)

    async def drain(self, within: float) -> int:
        """Wait up to `within` seconds for the detached tasks; how many are still running."""
        return await self._detached.wait(within)


@dataclass(frozen=True, slots=True)
class InForce:
    """What one admission or pop applies, taken once at its start (`Horde.in_force`) and passed
    down: the selected policies (speed gate, allowance curve, shadow metrics, the candidates and
    their names), the settings the rules read and the horde's modes. `horde.policies` may be
    swapped by a switch through the database while a call runs; a call that read it twice could
    judge one request by two curves, or claim under one gate and record another."""

    policies: Policies
    settings: Settings
    modes: HordeModes = MODES_OFF

    def rules(self, now: float) -> Rules:
        return Rules.from_settings(self.settings, self.policies.speed_gate, now)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling, as the faces hand it to the lifecycle: the key it presented (None: none, the
    anonymous key's stand-in), its client agent and its address. The lifecycle authenticates it
    inside the entry point's own transaction."""

    apikey: str | None = None
    client_agent: str = ""
    address: str = ""


def transaction_on(target: Horde | AsyncEngine) -> contextlib.AbstractAsyncContextManager[AsyncSession]:
    """A transaction on a running horde, or on a bare engine (the CLI, which starts no horde)."""
    if isinstance(target, Horde):
        return target.transaction()

    @contextlib.asynccontextmanager
    async def one() -> AsyncIterator[AsyncSession]:
        async with make_sessionmaker(target)() as session, session.begin():
            yield session

    return one()
