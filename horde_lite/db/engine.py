"""Engine and session factory for both databases.

SQLite has one writer: every transaction starts with BEGIN IMMEDIATE so two pops never read the
same candidate and then race to claim it, WAL lets readers go on meanwhile, and a busy timeout
makes writers queue instead of failing. PostgreSQL claims rows with FOR UPDATE SKIP LOCKED instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.ext.asyncio import AsyncSession as AsyncSession  # re-export for the layers above
from sqlalchemy.pool import NullPool

from horde_lite.db import statistics

SQLITE_BUSY_TIMEOUT_MS = 30_000
# Connections per process: (kept open, overflow). The totals are as before (SQLAlchemy's default
# for SQLite); more kept open, fewer opened and closed under load.
POOL = {"sqlite": (15, 0), "postgresql": (20, 10)}


# The execution options of a connection that only reads, one statement at a time, outside any
# transaction (`Horde.reading`): autocommit on PostgreSQL (no BEGIN or COMMIT round trip); on
# SQLite, whose connections are in autocommit already (their transactions begin in `_on_begin`),
# the mark that tells `_on_begin` not to begin one, so no write lock is taken.
READ_ONLY = "horde_lite_read_only"


# Set only while `connect_to_read` checks a connection out (see `_check_at_checkout`): "ping" for
# a checked read, "skip" for one whose caller replaces a lost connection itself.
_CHECKOUT_TO_READ: ContextVar[str | None] = ContextVar("horde_lite_checkout_to_read", default=None)


def reads_autocommit(engine: AsyncEngine) -> bool:
    """Whether a reading connection (`connect_to_read`) is in autocommit, so one statement written
    there commits alone: PostgreSQL's. SQLite's writes take the process's turn in a transaction."""
    return engine.dialect.name != "sqlite"


def _reading_options(engine: AsyncEngine) -> dict[str, Any]:
    if not reads_autocommit(engine):
        return {READ_ONLY: True}
    return {READ_ONLY: True, "isolation_level": "AUTOCOMMIT"}


# Each engine with the reading options set, made once: its connections (from the same pool) take
# them as they are checked out, with no call of their own per connection.
_READERS: WeakKeyDictionary[AsyncEngine, AsyncEngine] = WeakKeyDictionary()


def _reader(engine: AsyncEngine) -> AsyncEngine:
    reader = _READERS.get(engine)
    if reader is None:
        reader = _READERS[engine] = engine.execution_options(**_reading_options(engine))
    return reader


@asynccontextmanager
async def connect_to_read(engine: AsyncEngine, *, checked: bool = True) -> AsyncIterator[AsyncConnection]:
    """A connection that reads outside any transaction (`Horde.reading`), closed when the block
    ends. Its checkout pings instead of beginning: a transaction begun there would be rolled back
    when the connection turns to autocommit, a round trip for nothing. Unchecked, it sends nothing
    at checkout: for a caller that invalidates the connection on an error and reads again
    (`Horde.read_retried`)."""
    conn = _reader(engine).connect()
    token = _CHECKOUT_TO_READ.set("ping" if checked else "skip")
    try:
        await conn.start()
    finally:
        _CHECKOUT_TO_READ.reset(token)  # a transaction opened while reading begins at its checkout
    try:
        yield conn
    finally:
        await asyncio.shield(conn.close())  # as `async with engine.connect()` closes it


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def _in_memory(url: str) -> bool:
    return is_sqlite(url) and make_url(url).database in (None, "", ":memory:")


def _default_directory(url: str) -> None:
    """The default SQLite file's directory is created on first use (a configured path's directory
    is the operator's: a missing one is reported at start-up, not guessed at)."""
    from horde_lite.settings import default_database_url

    if url == default_database_url():
        Path(make_url(url).database or "").parent.mkdir(parents=True, exist_ok=True)


def _unnamed_statement() -> str:
    return ""


# Connection arguments for PostgreSQL reached through PgBouncer in transaction pooling mode, where
# consecutive transactions of one connection may run on different server connections, each
# shared with other clients. No named prepared statement may outlive its transaction: asyncpg's
# statement cache is off, and SQLAlchemy's prepared statements are PostgreSQL's unnamed one, which
# asyncpg then parses again in the same message as each execution (so a statement outside a
# transaction never meets a server that has not parsed it), and which the next parse replaces (so
# none pile up on the server connections). SQLAlchemy's own recipe, a unique name per statement,
# leaves most of them prepared on the server connections until those close. No startup
# parameters (`server_settings`): PgBouncer refuses those it does not know.
BEHIND_PGBOUNCER: dict[str, Any] = {
    "statement_cache_size": 0,
    "prepared_statement_cache_size": 0,
    "prepared_statement_name_func": _unnamed_statement,
}


def make_engine(
    url: str, echo: bool = False, *, null_pool: bool = False, reader: bool = False, pgbouncer: bool = False
) -> AsyncEngine:
    """The app's engine; `reader`: one connection for a process's copy of the queue and the fleet
    (queue/mirror.py), which only reads, each statement on its own (autocommit): on SQLite it
    must not take the write lock that the transaction waiting on it holds. `pgbouncer`: the URL
    reaches PostgreSQL through PgBouncer in transaction mode (`BEHIND_PGBOUNCER`)."""
    kwargs: dict[str, Any] = {"echo": echo}
    _default_directory(url)
    if is_sqlite(url):
        kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
    if null_pool:
        kwargs["poolclass"] = NullPool
    elif not _in_memory(url):  # an in-memory SQLite database keeps SQLAlchemy's one-connection pool
        # Connections kept open cover the concurrent transactions of a busy process: an overflow
        # connection is closed when returned, so under steady load a small pool opened and closed
        # one per few requests (asyncpg's connect and statement preparation, SQLite's pragmas).
        size, overflow = (1, 0) if reader else POOL["sqlite" if is_sqlite(url) else "postgresql"]
        kwargs.update(pool_size=size, max_overflow=overflow)
        if not is_sqlite(url):
            kwargs["pool_pre_ping"] = True
    if pgbouncer and not is_sqlite(url):
        kwargs["connect_args"] = dict(BEHIND_PGBOUNCER)
    elif not is_sqlite(url):
        # The eligibility subqueries make the planner's cost estimates large, which trips JIT
        # compilation (jit_above_cost) on every wait estimate: seconds of LLVM work for a query
        # that runs in milliseconds (bench/README.md). Short OLTP queries never gain from JIT.
        # PgBouncer refuses startup parameters it does not know: behind it, the database's own
        # setting does this (docs/reference/operators.md, "PgBouncer").
        kwargs["connect_args"] = {"server_settings": {"jit": "off"}}
    if reader:
        kwargs["isolation_level"] = "AUTOCOMMIT"
    engine = create_async_engine(url, **kwargs)
    if is_sqlite(url):
        _sqlite_pragmas(engine, begin_immediate=not reader)
    elif engine.dialect.driver == "asyncpg":
        engine.dialect.do_ping = _check_at_checkout  # type: ignore[method-assign]
    return engine


def _check_at_checkout(dbapi_connection: Any) -> bool:
    """The pool's check of a connection before use (`pool_pre_ping`), in the round trip the
    connection's user sends first anyway: a transaction's BEGIN, or `;` for a read
    outside any transaction. SQLAlchemy's own asyncpg ping sends BEGIN, `;` and ROLLBACK, three
    round trips. Behind PgBouncer the ping checks PgBouncer and whichever server connection it
    lends for that round trip, and the transaction's BEGIN is sent through it as usual. A failure
    is raised as the adapter raises it, so the pool sees a lost connection and replaces it. The
    driver's own view is not enough: between the server's termination message and the socket's
    close asyncpg calls a connection neither closed nor usable."""
    reading = _CHECKOUT_TO_READ.get()
    if not (dbapi_connection.autocommit or dbapi_connection._started or reading):
        # The adapter's lazy BEGIN, sent now: its first statement finds the transaction started.
        dbapi_connection.await_(dbapi_connection._start_transaction())
        return True
    if reading == "skip":
        return True
    try:
        dbapi_connection.await_(dbapi_connection.driver_connection.fetchrow(";"))
    except Exception as error:
        dbapi_connection._handle_exception(error)
    return True


def _sqlite_pragmas(engine: AsyncEngine, *, begin_immediate: bool = True) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the sqlite3 module, decide when transactions begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        if begin_immediate:  # the pool's connections keep the planner's statistics (db/statistics.py)
            for pragma in statistics.ON_OPEN:
                cursor.execute(pragma)
        cursor.close()

    if not begin_immediate:
        return

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        if not conn.get_execution_options().get(READ_ONLY):
            conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)
