"""Each process's copy of the waiting queue and the fleet, as the wait estimate reads them
(docs/explanation/dispatch.md).

The estimate asks, for a request R, which online workers are eligible for R and how much queued
output ahead of R one of them could take. Read from the database, that meant the eligibility check
against the whole fleet and a walk of the queue up to the horizon, judged row by row: most of a
creation's and a status read's time. Here both live in memory:

- the fleet, one slot per worker, with each worker's facts, threads, speed and check-in;
- the queue: every waiting request with jobs left, by queue order, overall and per model;
- classes of requests: requests with the same facts (but the requester and the context they
  need, which counts only through the fleet's context limits it falls between) get the same
  verdicts from every worker. A class keeps three sets of worker slots as bit masks, judged once
  with the one eligibility check's Python twin (`admits`, `gate_passes`, `is_capable`): A, the
  workers that could take it while a capable worker for it is online; B, while none is; C, the
  capable ones. Online status and maintenance are applied at reading time (they change with the
  clock and the requester), and a class re-judges only the workers that changed since.

So R's eligible workers are `(A if C & online else B) & online & allowed(requester)`, and a
request q ahead competes when the same mask of q meets them: a few integer operations per request
ahead, which a walk does until R or the horizon.

The copy follows the database through the change log (db/change_log.py): before each estimate it
reads what was committed since its last read (one short statement on its own connection, shared
by the estimates that wait at that moment), so it reflects every commit made before the estimate
began, by any process. A worker's check-in is noted in the log only when it jumps (a worker coming
back); the copy re-reads the check-in of a worker it would otherwise take for offline.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
from bisect import bisect_left, insort
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import and_, bindparam, select, true
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from horde_lite.core.tasks import TaskSet
from horde_lite.db import change_log as changes
from horde_lite.db.engine import make_engine
from horde_lite.db.models import TextRequest, Worker
from horde_lite.queue.eligibility import (
    REQUEST_FACT_COLUMNS,
    REQUEST_FACT_JSON,
    WORKER_FACT_COLUMNS,
    WORKER_FACT_JSON,
    RequestFacts,
    Rules,
    WorkerFacts,
    admits,
    fact_columns,
    gate_passes,
    is_capable,
    request_facts_of,
    worker_facts_of,
)
from horde_lite.settings import Settings

log = logging.getLogger("horde_lite.mirror")

ANY_MODEL = ""  # the list of requests that name no model (every worker serves them)
# Past this many models a walk reads the whole queue in order instead of merging per-model lists.
MANY_MODELS = 8
# A class re-judges the workers that changed since it was judged, up to this many; past it, all.
_REJUDGE_MOST = 32
_CHANGES_KEPT = 4096


def bits(mask: int) -> Iterator[int]:
    """The slots set in a mask, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


@dataclass(frozen=True, slots=True)
class Queued:
    """A request as the estimate reads it: its place in the queue, its own remaining output, and
    its facts."""

    id: str
    effective_start: float
    created_at: float
    own_remaining: int
    facts: RequestFacts


@dataclass(frozen=True, slots=True)
class Estimate:
    """R's eligible workers and the competing work ahead of R (docs/explanation/dispatch.md)."""

    eligible_workers: int
    eligible_threads: int
    eligible_speed: float  # tokens per second, unmeasured workers at the assumed speed
    competing_work: int  # tokens
    competing_jobs: int
    competing_requests: int
    own_remaining: int  # R's own queued output (max_length x n_remaining)

    @property
    def estimated_wait(self) -> float | None:
        """Seconds until R starts; None when no worker is eligible (unknown)."""
        if self.eligible_workers == 0 or self.eligible_speed <= 0:
            return None
        return self.competing_work / self.eligible_speed

    @property
    def wait_time(self) -> int:
        """The status route's figure: R's own output included, 0 when unknown."""
        if self.eligible_workers == 0 or self.eligible_speed <= 0:
            return 0
        return int((self.competing_work + self.own_remaining) / self.eligible_speed)


# --- the fleet ---------------------------------------------------------------------------------------


class Fleet:
    """Workers by slot (a bit in every mask). A slot is never reused until a full reload."""

    def __init__(self, assumed_speed: float) -> None:
        self.assumed_speed = assumed_speed
        self.slot_of: dict[str, int] = {}
        self.facts: list[WorkerFacts | None] = []  # None: gone (deleted, or its row removed)
        self.judging: list[WorkerFacts | None] = []  # the facts with maintenance set aside
        self.threads: list[int] = []
        self.speed: list[float] = []
        self.check_in: list[float] = []
        self.live = 0
        self.maintenance = 0
        self.owner_maintenance: dict[int, int] = {}  # an owner's workers in maintenance
        self.by_model: dict[str, int] = {}
        self.version = 0  # bumped by every change of a worker's facts
        self.changes: list[tuple[int, int]] = []  # (version, slot), oldest first
        self.floor = 0  # changes at or below this version are no longer listed
        self.offline_known: set[int] = set()  # read offline: its next check-in is noted in the log
        self._contexts: dict[bool, dict[int, int]] = {False: {}, True: {}}  # limit -> workers
        self.limits: dict[bool, list[int]] = {False: [], True: []}  # sorted context limits
        self.limits_epoch = 0  # bumped when either list of limits changes
        self.check_in_epoch = 0  # bumped when a check-in is read
        self._online: tuple[int, int, float, float, int] | None = None
        self._aging: tuple[int, int, float] | None = None

    def apply(self, worker_id: str, row: Sequence[Any] | None) -> None:
        """A worker's current row (`WORKER_COLUMNS` after the id), or None when it is gone."""
        slot = self.slot_of.get(worker_id)
        if row is None or row[0] is not None:  # no row, or deleted
            if slot is not None and self.facts[slot] is not None:
                self._forget(slot)
                self._draw_limits()
                self._changed(slot)
            return
        _deleted, threads, *values = row
        facts = worker_facts_of(values)
        if slot is None:
            slot = len(self.facts)
            self.slot_of[worker_id] = slot
            self.facts.append(None)
            self.judging.append(None)
            self.threads.append(0)
            self.speed.append(0.0)
            self.check_in.append(facts.last_check_in)
        self._set_check_in(slot, facts.last_check_in)
        old = self.facts[slot]
        if old is not None and _same(old, facts) and self.threads[slot] == threads:
            return
        self._replace(slot, facts, int(threads))

    def _replace(self, slot: int, facts: WorkerFacts, threads: int) -> None:
        old = self.facts[slot]
        if old is not None:
            self._forget(slot)
        self.facts[slot] = facts
        self.judging[slot] = replace(facts, maintenance=False)
        self.threads[slot] = threads
        self.speed[slot] = float(facts.lease_speed if facts.lease_speed is not None else self.assumed_speed)
        bit = 1 << slot
        self.live |= bit
        for model in facts.models:
            self.by_model[model] = self.by_model.get(model, 0) | bit
        if facts.maintenance:
            self.maintenance |= bit
            self.owner_maintenance[facts.owner_id] = self.owner_maintenance.get(facts.owner_id, 0) | bit
        self._count_limits(facts, +1)
        self._draw_limits()
        self._changed(slot)

    def _forget(self, slot: int) -> None:
        facts = self.facts[slot]
        assert facts is not None
        bit = 1 << slot
        self.live &= ~bit
        for model in facts.models:
            left = self.by_model.get(model, 0) & ~bit
            if left:
                self.by_model[model] = left
            else:
                self.by_model.pop(model, None)
        if facts.maintenance:
            self.maintenance &= ~bit
            left = self.owner_maintenance.get(facts.owner_id, 0) & ~bit
            if left:
                self.owner_maintenance[facts.owner_id] = left
            else:
                self.owner_maintenance.pop(facts.owner_id, None)
        self._count_limits(facts, -1)
        self.facts[slot] = None
        self.judging[slot] = None

    def _count_limits(self, facts: WorkerFacts, step: int) -> None:
        for chat, limit in ((False, facts.max_context_length), (True, facts.chat_max_context_tokens)):
            if limit is not None:
                counts = self._contexts[chat]
                counts[limit] = counts.get(limit, 0) + step

    def _draw_limits(self) -> None:
        """The fleet's context limits; a change draws every class anew (`QueueMirror.judged`)."""
        for chat, counts in self._contexts.items():
            for limit in [limit for limit, n in counts.items() if n <= 0]:
                del counts[limit]
            limits = sorted(counts)
            if limits != self.limits[chat]:
                self.limits[chat] = limits
                self.limits_epoch += 1

    def _changed(self, slot: int) -> None:
        self.version += 1
        self.changes.append((self.version, slot))
        if len(self.changes) > _CHANGES_KEPT:
            cut = len(self.changes) // 2
            self.floor = self.changes[cut - 1][0]
            del self.changes[:cut]
        self._online = None

    def _set_check_in(self, slot: int, at: float) -> None:
        if self.check_in[slot] != at or slot in self.offline_known:
            self.check_in[slot] = at
            self.check_in_epoch += 1
            self._online = None
        self.offline_known.discard(slot)

    def read_check_ins(self, found: dict[str, float], now: float, online_seconds: float) -> None:
        """Check-ins re-read (`aging`): a worker still offline now has its next check-in noted."""
        for worker_id, at in found.items():
            slot = self.slot_of.get(worker_id)
            if slot is None or self.facts[slot] is None:
                continue
            self._set_check_in(slot, at)
            if at < now - online_seconds:
                self.offline_known.add(slot)
                self.check_in_epoch += 1

    def aging(self, now: float, online_seconds: float) -> list[str]:
        """Workers this copy would take for offline at `now` without knowing they are: their
        check-in was read long enough ago that unnoted check-ins may have followed. (None until
        the first check-in read ages: the answer is kept until then.)"""
        cached = self._aging
        if cached is not None and cached[:2] == (self.version, self.check_in_epoch) and now < cached[2]:
            return []
        since = now - online_seconds
        out: list[str] = []
        earliest = math.inf
        for worker_id, slot in self.slot_of.items():
            if self.facts[slot] is None or slot in self.offline_known:
                continue
            at = self.check_in[slot]
            if at < since:
                out.append(worker_id)
            else:
                earliest = min(earliest, at)
        self._aging = None if out else (self.version, self.check_in_epoch, earliest + online_seconds)
        return out

    def changed_since(self, version: int) -> set[int] | None:
        """The slots changed after `version`; None when too many (or no longer listed)."""
        if version < self.floor:
            return None
        at = bisect_left(self.changes, (version + 1, -1))
        if len(self.changes) - at > _REJUDGE_MOST:
            return None
        return {slot for _, slot in self.changes[at:]}

    def online(self, now: float, online_seconds: float) -> int:
        """The live workers online at `now` (cached until the next one would go offline)."""
        cached = self._online
        fresh = cached is not None and cached[:2] == (self.version, self.check_in_epoch)
        if fresh and cached[2] <= now < cached[3]:  # type: ignore[index]
            return cached[4]  # type: ignore[index]
        since = now - online_seconds
        mask = 0
        until = math.inf
        check_in = self.check_in
        for slot in bits(self.live):
            at = check_in[slot]
            if at >= since:
                mask |= 1 << slot
                until = min(until, at + online_seconds)
        # Valid from now until the first online worker's check-in ages out (an offline one comes
        # back only through a read, which clears the cache); not for an earlier time.
        self._online = (self.version, self.check_in_epoch, now, until, mask)
        return mask


def _same(a: WorkerFacts, b: WorkerFacts) -> bool:
    """The same facts but for the check-in (which the copy reads at every estimate instead)."""
    return replace(a, last_check_in=0.0) == replace(b, last_check_in=0.0)


# --- classes of requests -------------------------------------------------------------------------------


class Judged:
    """A class's verdicts from every worker, as masks (see the module's docstring).

    C matters only where A and B differ (a worker the speed gate judges by the capable question):
    it is judged, over the whole fleet, only for a class where they do (`c` None until then)."""

    __slots__ = ("a", "b", "c", "facts", "gate", "version")

    def __init__(self, facts: RequestFacts) -> None:
        self.facts = facts
        self.a = self.b = 0
        self.c: int | None = None
        self.version = -1
        self.gate: object = None

    def current(self, fleet: Fleet, rules: Rules) -> Judged:
        """Its masks for the fleet as it is now (re-judging what changed since)."""
        if self.version == fleet.version and self.gate is rules.gate:
            return self
        changed = fleet.changed_since(self.version) if self.gate is rules.gate else None
        if changed is None:  # first judged, too much changed, or another speed gate
            self.a = self.b = 0
            self.c = None
            self._judge(fleet, rules, list(bits(self._candidates(fleet))))
        else:
            keep = ~sum(1 << slot for slot in changed)
            self.a &= keep
            self.b &= keep
            self._judge(fleet, rules, changed)
            if self.c is not None:
                self.c &= keep
                self._judge_capable(fleet, rules, changed)
        if self.c is None and self.a != self.b:
            self.c = 0
            self._judge_capable(fleet, rules, list(bits(self._candidates(fleet))))
        self.version = fleet.version
        self.gate = rules.gate
        return self

    def capable(self, free: int) -> bool:
        """Whether a capable worker for the class is among `free` (online, not in maintenance)."""
        return bool(self.c and self.c & free)

    def _candidates(self, fleet: Fleet) -> int:
        """The workers that serve one of its models (every worker for a request naming none)."""
        if not self.facts.models:
            return fleet.live
        candidates = 0
        for model in self.facts.models:
            candidates |= fleet.by_model.get(model, 0)
        return candidates

    def _judge(self, fleet: Fleet, rules: Rules, slots: Iterable[int]) -> None:
        q = self.facts
        ever = _at_any_time(rules)
        for slot in slots:
            judging = fleet.judging[slot]
            if judging is None or not admits(judging, q, ever):
                continue
            bit = 1 << slot
            if gate_passes(judging, q, rules, True):
                self.a |= bit
            if gate_passes(judging, q, rules, False):
                self.b |= bit

    def _judge_capable(self, fleet: Fleet, rules: Rules, slots: Iterable[int]) -> None:
        q = self.facts
        ever = _at_any_time(rules)
        for slot in slots:
            facts = fleet.facts[slot]
            if facts is not None and is_capable(facts, q, ever):
                self.c = (self.c or 0) | 1 << slot


_EVER: dict[int, tuple[Rules, Rules]] = {}


def _at_any_time(rules: Rules) -> Rules:
    """The rules with every worker taken as online (the copy applies online status itself)."""
    cached = _EVER.get(id(rules.gate))
    if cached is not None and cached[0] == replace(rules, now=cached[0].now):
        return cached[1]
    ever = replace(rules, online_seconds=math.inf)
    _EVER[id(rules.gate)] = (rules, ever)
    return ever


class Raw:
    """Requests with exactly the same facts but the requester: the queue's entries point here."""

    __slots__ = ("epoch", "facts", "judged", "key", "need", "refs")

    def __init__(self, key: tuple[Any, ...], facts: RequestFacts, need: int) -> None:
        self.key = key
        self.facts = facts
        self.need = need  # the context it needs, compared with the workers' context limits
        self.refs = 0
        self.epoch = -1
        self.judged: Judged | None = None


def raw_key(q: RequestFacts) -> tuple[tuple[Any, ...], int]:
    """A request's class key (facts but the requester) and the context it needs."""
    need = q.prompt_tokens + q.max_length if q.is_chat else q.max_context_length
    key = (bool(q.is_chat), q.max_length, need, q.models, q.required_features, q.required_transports,
           q.worker_allow, q.worker_deny, bool(q.trusted_workers), bool(q.slow_workers), bool(q.nsfw),
           q.failed_workers, q.failed_owners)  # fmt: skip
    return key, need


# --- the copy ----------------------------------------------------------------------------------------

# A queue entry: (effective_start, created_at, user_id, raw class id, max_length, n_remaining,
# expires_at, models). Plain values only, so the collector never has to walk them.
_START, _CREATED, _USER, _RAW, _LENGTH, _LEFT, _EXPIRES, _MODELS = range(8)


class QueueMirror:
    """See the module's docstring. One per process (`Horde.mirror`)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._engine: AsyncEngine | None = None
        self._conn: AsyncConnection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # where the copy reads (the app's)
        self._tasks = TaskSet(log, logging.DEBUG)  # a caller that left has its read end anyway
        self._lock = asyncio.Lock()
        self._asked = 0  # sync requests so far
        self._served = 0  # every request up to this one is covered by a finished sync
        self._cursor: changes.Cursor | None = None  # None: load everything first
        self._read_at = 0.0  # monotonic time of the last read
        self._now = -math.inf  # the clock at the last read
        self._reset()

    def _reset(self) -> None:
        self.fleet = Fleet(self.settings.speed.assumed_tokens_per_second)
        self.entries: dict[str, tuple[Any, ...]] = {}
        self.lists: dict[str, list[tuple[float, float, str]]] = {}
        self.everything: list[tuple[float, float, str]] = []
        self._raw_ids: dict[tuple[Any, ...], int] = {}
        self.raws: dict[int, Raw] = {}
        self._next_raw = 0
        self._judged: dict[tuple[Any, ...], Judged] = {}
        self._judged_epoch = -1

    # --- reading the database ------------------------------------------------------------------

    def catch_up(self, now: float) -> asyncio.Task[None]:
        """Start catching up with every commit made before this call (by any process), at clock
        `now`; `current` waits for it. A caller may start it early and do its own reads meanwhile.

        The read runs in a task of its own: a caller cancelled meanwhile (its client left) must
        not cut it off halfway, with the connection in mid-statement."""
        self._asked += 1
        self._loop = self._loop or asyncio.get_running_loop()
        return self._tasks.start(self._sync(self._asked, now), "mirror catch-up")

    async def current(self, now: float, started: asyncio.Task[None] | None = None) -> QueueMirror:
        """The copy, caught up (by `started`, from `catch_up`, or now)."""
        await asyncio.shield(started or self.catch_up(now))
        return self

    async def _sync(self, ticket: int, now: float) -> None:
        async with self._lock:
            if self._served < ticket:
                covers = self._asked  # the asks up to here began before this read
                await self._catch_up(now)
                self._served = covers
            aging = self.fleet.aging(now, self.settings.worker.online_seconds)
            if aging:
                await self._read_check_ins(aging, now)

    @asynccontextmanager
    async def _connected(self) -> AsyncIterator[AsyncConnection]:
        """The copy's connection: kept open, in the event loop that first read (the app's; a
        connection is never used across loops), or one per read under `[database] null_pool`, as
        the app's own engine does then. A failed read drops it; the next read opens another."""
        if self._engine is None:
            url, pgbouncer = self.settings.database.reader
            null_pool = self.settings.database.null_pool
            self._engine = make_engine(url, null_pool=null_pool, reader=True, pgbouncer=pgbouncer)
        try:
            if self.settings.database.null_pool:
                async with self._engine.connect() as conn:
                    yield conn
                return
            if self._conn is None:
                self._conn = await self._engine.connect()
            yield self._conn
        except Exception:
            await self._drop_connection()
            raise

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except Exception:  # already broken
                log.debug("closing a broken mirror connection failed", exc_info=True)

    async def _catch_up(self, now: float) -> None:
        stale = time.monotonic() - self._read_at > changes.KEEP_SECONDS / 2
        # A clock moved back (tests) may bring workers back online that no note announces.
        reload = self._cursor is None or stale or now < self._now
        for attempt in (1, 2):  # a connection dropped since the last read is opened once more
            try:
                async with self._connected() as conn:
                    if reload:
                        await self._load(conn)
                    else:
                        await self._read_changes(conn)
                break
            except Exception:
                if attempt == 2:
                    self._cursor = None  # reload next time: what was applied may be partial
                    raise
        self._read_at = time.monotonic()
        self._now = max(self._now, now) if not reload else now

    async def _load(self, conn: AsyncConnection) -> None:
        """Everything, in one snapshot, and the cursor that snapshot leaves."""
        dialect = conn.dialect.name
        self._cursor = None  # until the load is whole
        self._reset()
        if dialect == "postgresql":
            conn = await conn.execution_options(isolation_level="REPEATABLE READ")
            try:
                async with conn.begin():
                    snap, last = (await conn.execute(_load_cursor(dialect))).one()
                    workers = (await conn.execute(_LOAD_WORKERS)).all()
                    requests = (await conn.execute(_LOAD_QUEUE)).all()
            finally:
                await conn.execution_options(isolation_level="AUTOCOMMIT")
        else:
            await conn.exec_driver_sql("BEGIN")
            try:
                snap, last = (await conn.execute(_load_cursor(dialect))).one()
                workers = (await conn.execute(_LOAD_WORKERS)).all()
                requests = (await conn.execute(_LOAD_QUEUE)).all()
            finally:
                await conn.exec_driver_sql("COMMIT")
        for row in workers:
            self.fleet.apply(row[0], row[1:])
        loaded = [(row[0], row[1:]) for row in requests]
        self._apply_requests(loaded, bulk=True)
        self._cursor = changes.advance(changes.Cursor(int(last)), snap, [])
        log.info("mirror loaded: %d workers, %d waiting requests", len(workers), len(self.entries))

    async def _read_changes(self, conn: AsyncConnection) -> None:
        assert self._cursor is not None
        dialect = conn.dialect.name
        statement = _changes_statement(dialect)
        rows = (await conn.execute(statement, changes.values(self._cursor, dialect))).all()
        snap = rows[0][0] if rows else None
        ids: list[int] = []
        workers: dict[str, Sequence[Any] | None] = {}
        requests: dict[str, Sequence[Any] | None] = {}
        for row in rows:
            if row[1] is None:  # the snapshot's row when nothing changed
                continue
            ids.append(int(row[1]))
            kind, ref = row[2], row[3]
            if kind == changes.WORKER:
                worker = row[_W_AT : _W_AT + _W_WIDTH]
                workers[ref] = None if worker[0] is None else worker[1:]
            else:
                request = row[_R_AT : _R_AT + _R_WIDTH]
                requests[ref] = None if request[0] is None else request[1:]
        for ref, worker_row in workers.items():  # each changed row once, as it is now
            self.fleet.apply(ref, worker_row)
        self._apply_requests(list(requests.items()), bulk=False)
        self._cursor = changes.advance(self._cursor, snap, ids)

    async def _read_check_ins(self, worker_ids: list[str], now: float) -> None:
        for attempt in (1, 2):
            try:
                async with self._connected() as conn:
                    rows = (await conn.execute(_CHECK_INS, {"ids": worker_ids})).all()
                break
            except Exception:
                if attempt == 2:
                    raise
        found = {row[0]: float(row[1]) for row in rows}
        self.fleet.read_check_ins(found, now, self.settings.worker.online_seconds)

    @property
    def engine(self) -> AsyncEngine | None:
        """The copy's own engine (one connection), once it has read."""
        return self._engine

    async def close(self) -> None:
        """At shutdown, after the reads under way. Called from another event loop than the reads'
        (a test harness runs an app's lifespan in a thread of its own), it leaves the copy's
        connection and reads to their loop: nothing of asyncio crosses loops."""
        if self._loop is not None and self._loop is not asyncio.get_running_loop():
            return
        await self._tasks.wait(10)
        async with self._lock:
            await self._drop_connection()
            if self._engine is not None:
                await self._engine.dispose()
                self._engine = None

    def summary(self, now: float) -> dict[str, Any]:
        """What the copy holds, comparable with another copy's (a fresh load's, in tests)."""
        online = self.fleet.online(now, self.settings.worker.online_seconds)
        workers = {}
        for worker_id, slot in self.fleet.slot_of.items():
            facts = self.fleet.facts[slot]
            if facts is not None:
                workers[worker_id] = (
                    replace(facts, last_check_in=0.0),
                    self.fleet.threads[slot],
                    bool(online >> slot & 1),
                )
        queue = {rid: (*e[:_RAW], self.raws[e[_RAW]].key, *e[_RAW + 1 :]) for rid, e in self.entries.items()}
        return {"workers": workers, "queue": queue, "order": list(self.everything)}

    # --- keeping the queue ---------------------------------------------------------------------

    def _apply_requests(self, rows: list[tuple[str, Sequence[Any] | None]], *, bulk: bool) -> None:
        """Requests' current rows (`_REQUEST_COLUMNS` after the id; None: gone)."""
        if bulk:
            for request_id, row in rows:
                self._put(request_id, row, sort=False)
            self.everything.sort()
            for keys in self.lists.values():
                keys.sort()
            return
        for request_id, row in rows:
            self._put(request_id, row, sort=True)

    def _put(self, request_id: str, row: Sequence[Any] | None, *, sort: bool) -> None:
        old = self.entries.get(request_id)
        waiting = row is not None and row[0] == "waiting" and row[1] > 0
        if not waiting:
            if old is not None:
                self._remove(request_id, old)
            return
        assert row is not None
        _state, left, expires, start, created, *values = row
        facts = request_facts_of(values)
        raw = self._raw(facts)
        models = tuple(sorted(facts.models))
        entry = (start, created, facts.user_id, raw, facts.max_length, left, expires, models)
        if old is not None:
            if old[_START] == start and old[_CREATED] == created and old[_MODELS] == models:
                self._release_raw(old[_RAW])
                self.entries[request_id] = entry
                return
            self._remove(request_id, old)
        self.entries[request_id] = entry
        key = (start, created, request_id)
        for model in models or (ANY_MODEL,):
            keys = self.lists.setdefault(model, [])
            if sort:
                insort(keys, key)
            else:
                keys.append(key)
        if sort:
            insort(self.everything, key)
        else:
            self.everything.append(key)

    def _remove(self, request_id: str, entry: tuple[Any, ...]) -> None:
        del self.entries[request_id]
        key = (entry[_START], entry[_CREATED], request_id)
        for model in entry[_MODELS] or (ANY_MODEL,):
            keys = self.lists.get(model)
            if keys is not None:
                _discard(keys, key)
                if not keys:
                    del self.lists[model]
        _discard(self.everything, key)
        self._release_raw(entry[_RAW])

    def _raw(self, facts: RequestFacts) -> int:
        key, need = raw_key(facts)
        raw_id = self._raw_ids.get(key)
        if raw_id is None:
            raw_id = self._next_raw
            self._next_raw += 1
            self._raw_ids[key] = raw_id
            self.raws[raw_id] = Raw(key, replace(facts, user_id=0), need)
        self.raws[raw_id].refs += 1
        return raw_id

    def _release_raw(self, raw_id: int) -> None:
        raw = self.raws[raw_id]
        raw.refs -= 1
        if raw.refs <= 0:
            del self.raws[raw_id]
            del self._raw_ids[raw.key]

    def judged(self, raw: Raw, rules: Rules) -> Judged:
        """The class's verdicts, current with the fleet."""
        fleet = self.fleet
        if self._judged_epoch != fleet.limits_epoch or len(self._judged) > 4 * len(self.raws) + 1024:
            self._judged.clear()  # the context limits moved: the classes are drawn anew
            self._judged_epoch = fleet.limits_epoch
        if raw.epoch != self._judged_epoch or raw.judged is None:
            key = raw.key
            need = bisect_left(fleet.limits[bool(raw.facts.is_chat)], raw.need)
            judged_key = (*key[:2], need, *key[3:])
            found = self._judged.get(judged_key)
            if found is None:
                found = self._judged[judged_key] = Judged(raw.facts)
            raw.judged = found
            raw.epoch = self._judged_epoch
        return raw.judged.current(fleet, rules)

    # --- the estimate ----------------------------------------------------------------------------

    def estimate(self, r: Queued, rules: Rules) -> Estimate:
        """R's eligible workers and the work ahead of R that one of them could take, up to the
        horizon (`Rules.horizon_seconds` of their combined speed): see the module's docstring."""
        fleet = self.fleet
        online_seconds = rules.online_seconds
        online = fleet.online(rules.now, online_seconds)
        free = online & ~fleet.maintenance  # online, not in maintenance
        owners = fleet.owner_maintenance

        facts = r.facts
        key, need = raw_key(facts)
        raw_id = self._raw_ids.get(key)
        own = self.raws[raw_id] if raw_id is not None else Raw(key, replace(facts, user_id=0), need)
        mine = self.judged(own, rules)
        eligible = (mine.a if mine.capable(free) else mine.b) & (free | owners.get(facts.user_id, 0) & online)
        if not eligible:
            return Estimate(0, 0, 0.0, 0, 0, 0, r.own_remaining)
        threads = 0
        speed = 0.0
        models: set[str] = set()
        for slot in bits(eligible):
            threads += fleet.threads[slot]
            speed += fleet.speed[slot]
            worker = fleet.facts[slot]
            assert worker is not None
            models |= worker.models
        horizon = speed * rules.horizon_seconds
        by_user = bool(eligible & fleet.maintenance)  # a worker in maintenance takes its owner's
        verdicts: dict[Any, bool] = {}
        raws = self.raws
        entries = self.entries
        now = rules.now
        before = (r.effective_start, r.created_at)
        work = jobs = requests = 0
        last = None
        for start, created, request_id in self._walk(models):
            if (start, created) >= before:
                break
            if request_id == last:  # a request for two of the models, met twice in a row
                continue
            last = request_id
            entry = entries[request_id]
            if entry[_EXPIRES] <= now:
                continue
            raw_id = entry[_RAW]
            verdict_key = (raw_id, entry[_USER]) if by_user else raw_id
            verdict = verdicts.get(verdict_key)
            if verdict is None:
                q = self.judged(raws[raw_id], rules)
                takers = (q.a if q.capable(free) else q.b) & (free | owners.get(entry[_USER], 0) & online)
                verdict = verdicts[verdict_key] = bool(takers & eligible)
            if not verdict:
                continue
            left = entry[_LEFT]
            work += entry[_LENGTH] * left
            jobs += left
            requests += 1
            if work >= horizon:
                break
        return Estimate(eligible.bit_count(), threads, speed, work, jobs, requests, r.own_remaining)

    def _walk(self, models: set[str]) -> Iterator[tuple[float, float, str]]:
        """The queue in order, or only its requests for `models` or for any model."""
        if len(models) >= MANY_MODELS:
            return iter(self.everything)
        lists = [self.lists[m] for m in (*models, ANY_MODEL) if m in self.lists]
        if len(lists) == 1:
            return iter(lists[0])
        return heapq.merge(*lists)


def _discard(keys: list[tuple[float, float, str]], key: tuple[float, float, str]) -> None:
    at = bisect_left(keys, key)
    if at < len(keys) and keys[at] == key:
        del keys[at]


# --- statements (built once) ------------------------------------------------------------------------


# Read after the id, in this order (`QueueMirror._put`, `Fleet.apply`).
_REQUEST_COLUMNS = [
    TextRequest.state,
    TextRequest.n_remaining,
    TextRequest.expires_at,
    TextRequest.effective_start,
    TextRequest.created_at,
    *fact_columns(TextRequest, REQUEST_FACT_COLUMNS, REQUEST_FACT_JSON),
]
_WORKER_COLUMNS = [
    Worker.deleted_at,
    Worker.threads,
    *fact_columns(Worker, WORKER_FACT_COLUMNS, WORKER_FACT_JSON),
]
# What the change log's triggers must note: a change of any column the copy reads (compared with
# the installed triggers by tests/integration/test_queue_triggers.py).
NOTED_REQUEST_COLUMNS = tuple(c.name for c in _REQUEST_COLUMNS)
NOTED_WORKER_COLUMNS = tuple(c.name for c in _WORKER_COLUMNS if c.name != "id")  # an id never changes
_R_WIDTH = 1 + len(_REQUEST_COLUMNS)
_W_WIDTH = 1 + len(_WORKER_COLUMNS)
_R_AT = 4  # (snapshot, log id, kind, ref, request id, request columns..., worker id, worker columns...)
_W_AT = _R_AT + _R_WIDTH

_LOAD_WORKERS = select(Worker.id, *_WORKER_COLUMNS).where(Worker.deleted_at.is_(None))
_LOAD_QUEUE = select(TextRequest.id, *_REQUEST_COLUMNS).where(
    TextRequest.state == "waiting", TextRequest.n_remaining > 0
)
_CHECK_INS = select(Worker.id, Worker.last_check_in).where(Worker.id.in_(bindparam("ids", expanding=True)))
_CHANGES: dict[str, Any] = {}


def _load_cursor(dialect: str) -> Any:
    """The load's snapshot and the newest note it sees: where its catch-ups start."""
    return select(changes.snapshot(dialect), changes.newest().scalar_subquery())


def _changes_statement(dialect: str) -> Any:
    """What changed since the cursor, each changed row read as it is now, with the statement's
    snapshot: one round trip (a row of NULLs but the snapshot when nothing changed). Each changed
    row is read by its primary key: on PostgreSQL through a lateral subquery, since a plain join
    let the planner hash the whole fleet for a note or two."""
    built = _CHANGES.get(dialect)
    if built is not None:
        return built
    log_ = changes.change_log
    noted = select(log_.c.kind, log_.c.ref, log_.c.id).where(changes.after(dialect)).subquery("noted")
    snap = select(changes.snapshot(dialect).label("snap")).subquery("snap")
    r, w = TextRequest, Worker
    request_of = and_(noted.c.kind == changes.REQUEST, r.id == noted.c.ref)
    worker_of = and_(noted.c.kind == changes.WORKER, w.id == noted.c.ref)
    if dialect == "postgresql":
        # The LIMIT keeps the planner from flattening each lateral subquery back into a join.
        request = select(r.id, *_REQUEST_COLUMNS).where(request_of).limit(1).lateral("request")
        worker = select(w.id.label("worker_id"), *_WORKER_COLUMNS).where(worker_of).limit(1).lateral("worker")
        built = (
            select(snap.c.snap, noted.c.id, noted.c.kind, noted.c.ref, *request.c, *worker.c)
            .select_from(snap)
            .outerjoin(noted, true())
            .outerjoin(request, true())
            .outerjoin(worker, true())
        )
    else:  # SQLite looks each row up by its primary key by itself
        built = (
            select(snap.c.snap, noted.c.id, noted.c.kind, noted.c.ref, r.id, *_REQUEST_COLUMNS)
            .add_columns(w.id, *_WORKER_COLUMNS)
            .select_from(snap)
            .outerjoin(noted, true())
            .outerjoin(r, request_of)
            .outerjoin(w, worker_of)
        )
    built = built.order_by(noted.c.id)
    _CHANGES[dialect] = built
    return built
