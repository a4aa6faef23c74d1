"""The process's waiting pops, and who to wake when jobs may have become available.

A waiting pop (jobs/long_poll.py) enters the registry before its first try and leaves it when it
answers; it holds no database connection meanwhile. A wake-up (`JobsArrived`: a request's models
and its number of jobs) comes from this process's commits (core/notify.py's `jobs_on_commit`),
from other processes' NOTIFYs on PostgreSQL, or from the watcher below where no channel says.

No thundering herd: a wake-up of n jobs wakes at most n + `MARGIN` waiters whose models match the
request's (a request naming no model matches every waiter), the longest-waiting first. A woken
pop that finds nothing (another took the job, or a rule refuses this worker) hands the wake-up
on to the next matching waiter that has not tried it, while fewer waiters hold it than it has
jobs nobody took yet: a job nobody can take passes each waiter at most once per wake-up, and the
margin's pops, once the jobs are taken, hand nothing on. The counts are this process's, so before
a wake-up for a known request is handed on, one statement asks whether the request still has a
job to hand out: a job taken by another process's worker ends the hand-on there.

The watcher: where no cross-process channel exists (SQLite, whose processes may share one file;
PostgreSQL while this process's listener is down), one task per process, running only while a
pop waits, reads the change log's newest id every `[pops] wait_poll_seconds`; when it moved, one
statement reads the requests changed since that still have a job to hand out, and each wakes
as above. Requests this process itself woke for lately are skipped: their waiters were woken at
commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import bindparam, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.core.notify import JobsArrived
from horde_lite.db import change_log
from horde_lite.db.models import TextRequest
from horde_lite.metrics import Metrics, WakeSource, WokenOutcome, wake_attributes, woken_attributes

log = logging.getLogger("horde_lite.pop_waiters")

# Waiters woken beyond a wake-up's jobs: pops that may find the job taken by a pop already under
# way, or refused by a rule the wake-up cannot see, without waiting for a hand-on.
MARGIN = 2
# Requests changed between two checks of the watcher read at most: past it the check wakes every
# waiter once instead (many changes at once: most waiters may have a job).
WATCH_ROWS = 200
# The watcher's task: it reads the change log every `poll_seconds` of real time.
WATCH_TASK = "horde_lite-pop-watch"


@dataclass(eq=False, slots=True)
class Wake:
    """One wake-up as it passes between waiters."""

    models: frozenset[str]  # empty: any model
    untaken: int  # its jobs not yet taken by a pop it woke
    request_id: str | None = None  # the request whose jobs it announces (None: several or unknown)
    holders: int = 0  # waiters woken by it that have not tried yet
    tried: set[int] = field(default_factory=set)  # waiters it was handed to

    def matches(self, waiter: Waiter) -> bool:
        return not self.models or not self.models.isdisjoint(waiter.models)


@dataclass(eq=False, slots=True)
class Waiter:
    """One waiting pop: the worker's models, and the event a wake-up sets."""

    id: int
    models: frozenset[str]
    event: asyncio.Event = field(default_factory=asyncio.Event)
    wakes: list[Wake] = field(default_factory=list)  # wake-ups it holds, not yet tried
    found_nothing: bool = False  # its first try found no job: it waits (and is counted so)

    async def wait(self, seconds: float, gone: asyncio.Event) -> bool:
        """Wait until woken (True), `gone` is set or `seconds` pass (False)."""
        if not self.event.is_set() and not gone.is_set() and seconds > 0:
            woken = asyncio.ensure_future(self.event.wait())
            left = asyncio.ensure_future(gone.wait())
            try:
                await asyncio.wait({woken, left}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
                left.cancel()
        if gone.is_set() or not self.event.is_set():
            return False
        self.event.clear()
        return True


# The watcher's read: (the change log's newest id, the requests changed since the id given).
ChangedRequests = Callable[[int | None], Awaitable[tuple[int, list[JobsArrived] | None]]]


class PopWaiters:
    """The registry of this process's waiting pops (held on the `Horde`, as the notifier is)."""

    def __init__(
        self,
        metrics: Metrics,
        poll_seconds: float,
        changed: ChangedRequests | None = None,
        channel_open: Callable[[], bool] = lambda: False,
        told: Callable[[Sequence[str]], None] = lambda models: None,
    ) -> None:
        self.metrics = metrics
        self.poll_seconds = poll_seconds
        self._changed = changed  # the watcher's read (None: no watcher)
        self._channel_open = channel_open  # a cross-process channel tells this process now
        self._told = told  # what the watcher found, for the idle answers: a request's models (none: any)
        self._waiters: dict[int, Waiter] = {}  # in the order they entered: the longest-waiting first
        self._ids = itertools.count(1)
        self._watcher: asyncio.Task[None] | None = None
        self._watching = asyncio.Event()  # the watcher has read where the change log stands
        self._watches = 0  # watchers started: one started anew may have missed changes meanwhile
        self._read_failed = False  # the watcher's last read failed: it tells nothing now
        self._kept_until = -math.inf  # monotonic: the idle answers want the watcher until then
        self._woke_lately: dict[str, float] = {}  # request id -> when this process woke for it
        self._counted = 0

    def __len__(self) -> int:
        """The pops waiting now: entered, and their first try found nothing."""
        return self._counted

    # --- a waiting pop's side -----------------------------------------------------------------

    def enter(self, models: Iterable[str]) -> Waiter:
        waiter = Waiter(next(self._ids), frozenset(models))
        self._waiters[waiter.id] = waiter
        self._start_watcher()
        return waiter

    def _start_watcher(self) -> None:
        if self._changed is not None and (self._watcher is None or self._watcher.done()):
            self._watches += 1
            self._read_failed = False
            self._watching = asyncio.Event()
            self._watcher = asyncio.create_task(self._watch(), name=WATCH_TASK)

    def watched(self, seconds: float) -> int | None:
        """For the idle answers, where no channel tells: keep the watcher checking the change log
        for `seconds` more (starting it when it is not running). Which watcher tells this process
        of other processes' new jobs now, once it has read where the change log stands and while its
        reads succeed, else None (nothing tells yet: nothing may be remembered)."""
        if self._changed is None:
            return None
        self._kept_until = max(self._kept_until, time.monotonic() + seconds)
        self._start_watcher()
        if not self._watching.is_set() or self._read_failed:
            return None
        return self._watches

    async def watching(self) -> None:
        """Return once the watcher has read where the change log stands: a pop's first try after
        it cannot miss a job the watcher would then not see as new."""
        if self._changed is not None:
            await self._watching.wait()

    def waits(self, waiter: Waiter) -> None:
        """The pop's first try found nothing: from now on it waits."""
        if not waiter.found_nothing:
            waiter.found_nothing = True
            self._counted += 1
            self.metrics.pops_waiting.add(1)

    def tried(self, waiter: Waiter, jobs: int) -> list[Wake]:
        """A woken waiter's new try took `jobs` jobs (0: found nothing): settle the wake-ups it held;
        with nothing found, each is handed on (`_hand_on`), except those of a known request, which
        are returned: the caller asks the database whether the request still has a job
        (`still_open`), then hands them on through `hand_on_open`."""
        self.metrics.pops_woken.add(1, woken_attributes(_outcome(jobs)))
        wakes, waiter.wakes = waiter.wakes, []
        for wake in wakes:
            wake.holders -= 1
            taken = min(jobs, wake.untaken)
            wake.untaken -= taken
            jobs -= taken
        pending: list[Wake] = []
        for wake in wakes:
            if wake.untaken <= wake.holders:
                continue
            if wake.request_id is None:
                self._hand_on(wake)
            else:
                pending.append(wake)
        return pending

    async def still_open(
        self,
        reading: Callable[[], contextlib.AbstractAsyncContextManager[AsyncSession]],
        wakes: Sequence[Wake],
    ) -> set[str]:
        """Which of the wake-ups' requests still have a job to hand out (`reading`: the horde's
        read-only session). A failed read counts them open: a hand-on costs a pop, never a job."""
        ids = sorted({wake.request_id for wake in wakes if wake.request_id is not None})
        try:
            async with reading() as session:
                return set((await session.execute(_OPEN, {"ids": ids})).scalars())
        except Exception as e:
            log.warning("waiting pops: could not check whether a request still has a job: %s", e)
            return set(ids)

    def hand_on_open(self, wakes: Sequence[Wake], open_ids: set[str]) -> None:
        """Hand on the wake-ups whose request still has a job; the others end here."""
        for wake in wakes:
            if wake.request_id in open_ids:
                self._hand_on(wake)
            else:
                wake.untaken = 0

    def leave(self, waiter: Waiter) -> None:
        """The pop answers (or its client left): wake-ups it holds untried go on to others."""
        if self._waiters.pop(waiter.id, None) is None:
            return
        if waiter.found_nothing:
            self._counted -= 1
            self.metrics.pops_waiting.add(-1)
        wakes, waiter.wakes = waiter.wakes, []
        for wake in wakes:
            wake.holders -= 1
            self._hand_on(wake)

    # --- wake-ups -------------------------------------------------------------------------------

    def jobs_arrived(self, arrived: JobsArrived, remote: bool) -> None:
        """`Notifier.on_jobs`: wake for `arrived`, from this process's commit or another's NOTIFY."""
        if not remote and self._watcher is not None and not self._watcher.done():
            # Only the watcher reads it, and prunes it at each check.
            self._woke_lately[arrived.request_id] = time.monotonic()
        self.wake(arrived.models, arrived.jobs, "remote" if remote else "local", arrived.request_id)

    def wake(
        self, models: Sequence[str], jobs: int, source: WakeSource, request_id: str | None = None
    ) -> None:
        if not self._waiters or jobs <= 0:
            return
        wake = Wake(frozenset(models), untaken=jobs, request_id=request_id)
        self._hand(wake, jobs + MARGIN, source)

    def wake_all(self, source: WakeSource = "switch") -> None:
        """Wake every waiter once (the horde's policies or modes changed: any may have a job now)."""
        wake = Wake(frozenset(), untaken=0)  # nothing to hand on: everyone tries
        self._hand(wake, len(self._waiters), source)

    def _hand_on(self, wake: Wake) -> None:
        if wake.untaken > wake.holders:
            self._hand(wake, wake.untaken - wake.holders, "handed")

    def _hand(self, wake: Wake, most: int, source: WakeSource) -> None:
        """Hand `wake` to up to `most` matching waiters that have not tried it, the idle first
        (one already woken tries again after its try under way only when no idle one is left)."""
        chosen: list[Waiter] = []
        busy: list[Waiter] = []
        for waiter in self._waiters.values():
            if len(chosen) >= most:
                break
            if waiter.id in wake.tried or not wake.matches(waiter):
                continue
            (busy if waiter.event.is_set() or waiter.wakes else chosen).append(waiter)
        chosen += busy[: most - len(chosen)]
        for waiter in chosen:
            wake.tried.add(waiter.id)
            wake.holders += 1
            waiter.wakes.append(wake)
            waiter.event.set()
        if chosen:
            self.metrics.pop_wakeups.add(len(chosen), wake_attributes(source))

    # --- the watcher ------------------------------------------------------------------------------

    async def _watch(self) -> None:
        assert self._changed is not None
        last: int | None = None
        first = True
        while self._waiters or time.monotonic() < self._kept_until:
            if not first:
                await asyncio.sleep(self.poll_seconds)
            horizon = time.monotonic() - 2 * self.poll_seconds - 1
            self._woke_lately = {k: at for k, at in self._woke_lately.items() if at >= horizon}
            if self._channel_open():
                last = None  # the channel tells; a later fallback starts from its own first read
            else:
                try:
                    last, arrived = await self._changed(last)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # the database is busy or away: the pops' bounds still end them
                    self._read_failed = True
                    log.warning("waiting pops: the check for new jobs failed: %s", e)
                else:
                    self._read_failed = False
                    self._wake_changed(arrived)
            if first:
                first = False
                self._watching.set()
        self._woke_lately.clear()

    def _wake_changed(self, arrived: list[JobsArrived] | None) -> None:
        if arrived is None:
            self._told(())
            self.wake_all("poll")
            return
        for one in arrived:
            if one.request_id not in self._woke_lately:
                self._told(one.models)
                self.wake(one.models, one.jobs, "poll", one.request_id)

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None


def _outcome(jobs: int) -> WokenOutcome:
    return "job" if jobs else "empty"


# A request with a job to hand out, as the watcher and the hand-on read it.
_HAS_JOB = (TextRequest.state == "waiting", TextRequest.n_remaining > 0)
_OPEN = select(TextRequest.id).where(TextRequest.id.in_(bindparam("ids", expanding=True)), *_HAS_JOB)
_NEWEST = select(func.max(change_log.change_log.c.id))
_CHANGED = (
    select(TextRequest.id, TextRequest.any_model, TextRequest.models, TextRequest.n_remaining)
    .where(
        TextRequest.id.in_(
            select(change_log.change_log.c.ref).where(
                change_log.change_log.c.kind == change_log.REQUEST,
                change_log.change_log.c.id > bindparam("after"),
                change_log.change_log.c.id <= bindparam("newest"),
            )
        ),
        *_HAS_JOB,
    )
    .limit(WATCH_ROWS + 1)
)


async def changed_requests(
    reading: Callable[[], contextlib.AbstractAsyncContextManager[AsyncSession]], last: int | None
) -> tuple[int, list[JobsArrived] | None]:
    """The watcher's check: the change log's newest id and, when it moved past `last`, the requests
    changed since that have a job to hand out (None: more than `WATCH_ROWS`). `reading`: the
    horde's read-only session (`Horde.reading`)."""
    async with reading() as session:
        newest = (await session.execute(_NEWEST)).scalar() or 0  # an empty log: nothing yet
        if last is None or newest <= last:
            return newest, []
        rows = (await session.execute(_CHANGED, {"after": last, "newest": newest})).all()
    if len(rows) > WATCH_ROWS:
        return newest, None
    return newest, [
        JobsArrived.of_request(rid, any_model, models, int(left)) for rid, any_model, models, left in rows
    ]
