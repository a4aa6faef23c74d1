"""Engine and session factory for both databases.

SQLite has one writer: every transaction starts with BEGIN IMMEDIATE so two pops never read the
same candidate and then race to claim it, WAL lets readers go on meanwhile, and a busy timeout
makes writers queue instead of failing. PostgreSQL claims rows with FOR UPDATE SKIP LOCKED instead.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.ext.asyncio import AsyncSession as AsyncSession  # re-export for the layers above
from sqlalchemy.pool import NullPool

SQLITE_BUSY_TIMEOUT_MS = 30_000


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def make_engine(url: str, echo: bool = False, *, null_pool: bool = False) -> AsyncEngine:
    kwargs: dict[str, Any] = {"echo": echo}
    if is_sqlite(url):
        kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
    if null_pool:
        kwargs["poolclass"] = NullPool
    elif not is_sqlite(url):
        kwargs.update(pool_size=10, max_overflow=20, pool_pre_ping=True)
    if not is_sqlite(url):
        # The eligibility subqueries make the planner's cost estimates large, which trips JIT
        # compilation (jit_above_cost) on every wait estimate: seconds of LLVM work for a query
        # that runs in milliseconds (bench/README.md). Short OLTP queries never gain from JIT.
        kwargs["connect_args"] = {"server_settings": {"jit": "off"}}
    engine = create_async_engine(url, **kwargs)
    if is_sqlite(url):
        _sqlite_pragmas(engine)
    return engine


def _sqlite_pragmas(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the sqlite3 module, decide when transactions begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)
