"""Wake-ups for waiters (the /v1 fronts) when a request changes. A wake-up only says "read the
request again": the database stays the source of truth.

- In one process: each waiter holds an asyncio.Event, set when the transaction that changed its
  request commits (`on_commit`), never before (a waiter woken earlier would read the old rows).
- Across processes on PostgreSQL: the same transaction sends `NOTIFY horde_lite_requests` with
  `<process token>:<request id>`. PostgreSQL delivers it at commit and drops it on rollback. Each
  process LISTENs on one asyncpg connection (`PgListener`, started in the app lifespan) and wakes
  its own waiters; it skips its own notifications, already delivered in process.
- SQLite has no such channel: processes sharing one file see each other's changes at the waiters'
  slow poll (`chat.poll_seconds`), which also covers a PostgreSQL listener that is reconnecting.

Waiting pops (jobs/pop_waiters.py) are woken the same way when jobs may have become available
(`jobs_on_commit`: a request admitted, a job given back): in process after the commit, across
processes by `NOTIFY horde_lite_jobs` on the same LISTEN connection, its payload carrying what the
wake needs (the request's models and its number of jobs), so other processes wake selectively too.
The NOTIFY goes at commit, or earlier with a step's writes, in their statement (`jobs_notice`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from horde_lite.db.rows import After

log = logging.getLogger("horde_lite.notify")

CHANNEL = "horde_lite_requests"
JOBS_CHANNEL = "horde_lite_jobs"
_PENDING = "horde_lite.notify_on_commit"
_PENDING_JOBS = "horde_lite.jobs_on_commit"
_SENT_JOBS = "horde_lite.jobs_sent"  # how many of each notifier's pending jobs were sent already
_NOTIFY = text("SELECT pg_notify(:channel, :payload)")
# The jobs channel's own statement, one for a transaction's every payload (a sweep may give back
# hundreds of jobs in one); its own text, so a statement log tells the two channels apart. A
# textual SELECT, so that a step's writes can be sent as its CTEs (`rows.write_rows`).
_NOTIFY_JOBS = text(
    f"SELECT pg_notify('{JOBS_CHANNEL}', p) FROM unnest(CAST(:payloads AS text[])) AS p"
).columns()
# PostgreSQL refuses a payload of 8000 bytes or more: a longer models list is sent as none (any
# model), which wakes the same number of waiters, only less selectively.
_JOBS_PAYLOAD_MOST = 7000


@dataclass(frozen=True, slots=True)
class JobsArrived:
    """Jobs that may be taken now: `jobs` of request `request_id`, which asks for `models` (empty:
    any model serves it)."""

    request_id: str
    models: tuple[str, ...]
    jobs: int

    def payload(self, token: str) -> str:
        body = json.dumps([self.request_id, self.jobs, list(self.models)], separators=(",", ":"))
        if len(body.encode()) > _JOBS_PAYLOAD_MOST:
            body = json.dumps([self.request_id, self.jobs, []], separators=(",", ":"))
        return f"{token}:{body}"

    @staticmethod
    def of_request(request_id: str, any_model: bool, models: Sequence[str] | None, jobs: int) -> JobsArrived:
        """A request's jobs, naming no model when any model may serve it."""
        return JobsArrived(request_id, () if any_model else tuple(models or ()), jobs)

    @staticmethod
    def parse(body: str) -> JobsArrived | None:
        """A payload's body as `payload` wrote it (None: not one)."""
        try:
            request_id, jobs, models = json.loads(body)
        except (ValueError, TypeError):
            return None
        if not isinstance(request_id, str) or not isinstance(jobs, int) or not isinstance(models, list):
            return None
        return JobsArrived(request_id, tuple(m for m in models if isinstance(m, str)), max(0, jobs))


class Notifier:
    def __init__(self) -> None:
        self._events: dict[str, set[asyncio.Event]] = defaultdict(set)
        # Marks this process's own NOTIFYs, which its listener then skips.
        self.token = uuid.uuid4().hex[:16]
        # Set while a PgListener of this process is listening (tests wait for it).
        self.listening = asyncio.Event()
        # Counts the times it started listening: what was heard before a break is told apart.
        self.listens = 0
        # Told of jobs that may be taken now (the waiting pops' registry): (what, from another process).
        self.on_jobs: Callable[[JobsArrived, bool], None] | None = None

    def subscribe(self, key: str) -> asyncio.Event:
        waiter = asyncio.Event()
        self._events[key].add(waiter)
        return waiter

    def unsubscribe(self, key: str, waiter: asyncio.Event) -> None:
        waiters = self._events.get(key)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._events[key]

    def on_commit(self, session: AsyncSession, key: str, *, remote: bool = True) -> None:
        """Wake `key`'s waiters, here and (`remote`) in every process, when this session's
        transaction commits. `remote=False` for a request nobody waits on (`TextRequest.waited`):
        its NOTIFY would be a round trip on every pop and submit that wakes no one."""
        # The session hooks are registered once, on the Session class (below): a listener added
        # per transaction cost more than the rest of the wake-up (registering, then its clean-up).
        pending: dict[Notifier, dict[str, bool]] = session.info.setdefault(_PENDING, {})
        keys = pending.setdefault(self, {})
        keys[key] = keys.get(key, False) or remote

    def jobs_on_commit(self, session: AsyncSession, arrived: JobsArrived) -> None:
        """Tell the waiting pops, here and in every process, that `arrived.jobs` of the request may
        be taken, when this session's transaction commits."""
        pending: dict[Notifier, list[JobsArrived]] = session.info.setdefault(_PENDING_JOBS, {})
        pending.setdefault(self, []).append(arrived)

    def jobs_notice(self, session: AsyncSession) -> After | None:
        """The jobs this transaction has announced so far (`jobs_on_commit`), as a NOTIFY for the
        caller to send now, with its writes (`rows.write_rows`: one statement on PostgreSQL): the
        commit then sends only what is announced later. PostgreSQL delivers it at commit all the
        same, and drops it on rollback. None when there is nothing to send, or off PostgreSQL; the
        wake-ups in this process still come at commit."""
        if session.get_bind().dialect.name != "postgresql":
            return None
        params = self._unsent_jobs(session.info)
        return None if params is None else After(_NOTIFY_JOBS, params)

    def _unsent_jobs(self, info: dict[Any, Any]) -> dict[str, Any] | None:
        """The NOTIFY's parameters for the jobs this transaction announced and has not sent yet,
        counted as sent from now (None: none)."""
        arrived = info.get(_PENDING_JOBS, {}).get(self, [])
        sent: dict[Notifier, int] = info.setdefault(_SENT_JOBS, {})
        unsent = arrived[sent.get(self, 0) :]
        if not unsent:
            return None
        sent[self] = len(arrived)
        return {"payloads": [one.payload(self.token) for one in unsent]}

    def _publish_jobs(self, session: Session) -> None:
        params = self._unsent_jobs(session.info)
        if params is not None:
            session.execute(_NOTIFY_JOBS, params)

    def jobs_arrived(self, arrived: JobsArrived, *, remote: bool) -> None:
        if self.on_jobs is not None and arrived.jobs > 0:
            self.on_jobs(arrived, remote)

    def received_jobs(self, payload: str) -> None:
        """A jobs notification from the database: tell the waiting pops unless it is our own."""
        token, _, body = payload.partition(":")
        arrived = JobsArrived.parse(body) if token != self.token else None
        if arrived is not None:
            self.jobs_arrived(arrived, remote=True)

    def _publish(self, session: Session, keys: dict[str, bool]) -> None:
        # Inside the committing transaction: delivered to the listeners only if it commits.
        for key in sorted(k for k, remote in keys.items() if remote):
            session.execute(_NOTIFY, {"channel": CHANNEL, "payload": f"{self.token}:{key}"})

    def notify(self, key: str) -> None:
        """Wake `key`'s waiters in this process."""
        for waiter in self._events.get(key, ()):
            waiter.set()

    def notify_all(self) -> None:
        """Wake every waiter (the listener reconnected: it may have missed notifications)."""
        for waiters in self._events.values():
            for waiter in waiters:
                waiter.set()

    def received(self, payload: str) -> None:
        """A notification from the database: wake its request's waiters unless it is our own."""
        token, _, key = payload.partition(":")
        if token != self.token and key:
            self.notify(key)


@event.listens_for(Session, "before_commit")
def _publish_pending(session: Session) -> None:
    pending: dict[Notifier, dict[str, bool]] | None = session.info.get(_PENDING)
    jobs: dict[Notifier, list[JobsArrived]] | None = session.info.get(_PENDING_JOBS)
    if (pending or jobs) and session.get_bind().dialect.name == "postgresql":
        for notifier, keys in (pending or {}).items():
            notifier._publish(session, keys)
        for notifier in jobs or {}:
            notifier._publish_jobs(session)


@event.listens_for(Session, "after_commit")
def _wake_pending(session: Session) -> None:
    pending: dict[Notifier, dict[str, bool]] | None = session.info.pop(_PENDING, None)
    for notifier, keys in (pending or {}).items():
        for key in keys:
            notifier.notify(key)
    jobs: dict[Notifier, list[JobsArrived]] | None = session.info.pop(_PENDING_JOBS, None)
    session.info.pop(_SENT_JOBS, None)
    for notifier, arrived in (jobs or {}).items():
        for one in arrived:
            notifier.jobs_arrived(one, remote=False)


@event.listens_for(Session, "after_rollback")
def _drop_pending(session: Session) -> None:
    session.info.pop(_PENDING, None)
    session.info.pop(_PENDING_JOBS, None)
    session.info.pop(_SENT_JOBS, None)


class PgListener:
    """This process's one LISTEN connection, on both channels. It reconnects after a failure (waking
    every waiter, which may have missed a notification meanwhile) and checks the connection while
    idle."""

    def __init__(self, notifier: Notifier, url: str, *, check_seconds: float = 30.0) -> None:
        self.notifier = notifier
        self.connect_args: dict[str, Any] = make_url(url).translate_connect_args(username="user")
        self.check_seconds = check_seconds
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="horde_lite-listen")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _on_notification(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        self.notifier.received(payload)

    def _on_jobs(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        self.notifier.received_jobs(payload)

    async def _run(self) -> None:
        while True:
            try:
                await self._listen_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the slow poll covers the gap; try again shortly
                log.warning("LISTEN connection failed, retrying in 5 s: %s", e)
            await asyncio.sleep(5)

    async def _listen_once(self) -> None:
        conn: asyncpg.Connection = await asyncpg.connect(**self.connect_args)
        lost = asyncio.Event()
        try:
            conn.add_termination_listener(lambda _c: lost.set())
            await conn.add_listener(CHANNEL, self._on_notification)
            await conn.add_listener(JOBS_CHANNEL, self._on_jobs)
            self.notifier.listens += 1
            self.notifier.listening.set()
            self.notifier.notify_all()
            while not lost.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(lost.wait(), self.check_seconds)
                if not lost.is_set():
                    await conn.execute("SELECT 1")  # raises on a dead connection
        finally:
            self.notifier.listening.clear()
            with contextlib.suppress(Exception):
                await asyncio.shield(conn.close(timeout=2))


def start_listener(notifier: Notifier, url: str | None) -> PgListener | None:
    """Start the cross-process listener on a PostgreSQL URL (`DatabaseSettings.listener_url`: never
    through PgBouncer in transaction mode, which would lend the LISTEN a server connection for one
    statement only). None on SQLite or without a URL."""
    if url is None or not make_url(url).get_backend_name().startswith("postgresql"):
        return None
    listener = PgListener(notifier, url)
    listener.start()
    return listener
