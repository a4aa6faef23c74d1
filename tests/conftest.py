"""One suite, two databases: every test that takes `db_url` (directly or through `app`/`client`)
runs once on a fresh SQLite file and once on PostgreSQL (tests/support/postgres.py finds or starts
a server; CI makes it mandatory). `--sqlite-only` (`scripts/test --quick`) deselects the PostgreSQL
half: the `postgresql` case of `db_url`, the tests marked `postgres_only` and those taking `pg_url`;
no PostgreSQL server is then looked for."""

from __future__ import annotations

import asyncio
import faulthandler
import os
import shutil
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy.engine import make_url

from horde_lite.clock import ManualClock
from horde_lite.core.context import Horde
from horde_lite.db import migrate, statistics
from horde_lite.db.engine import make_engine
from horde_lite.db.models import Base
from horde_lite.settings import Settings
from tests.support.apps import app_for
from tests.support.horde import HordeClient
from tests.support.model_server import model_server  # noqa: F401 (the session's model server)
from tests.support.postgres import PostgresTarget, require_postgres, resolve_postgres

# Each test run gets its own database on the server, dropped when the run ends, so two runs against
# one PostgreSQL never collide. HORDE_LITE_TEST_PG_DB names a fixed one instead (kept afterwards).
_FIXED_PG_DB = os.environ.get("HORDE_LITE_TEST_PG_DB")
if _FIXED_PG_DB and os.environ.get("PYTEST_XDIST_WORKER"):  # one database per xdist worker
    _FIXED_PG_DB = f"{_FIXED_PG_DB}_{os.environ['PYTEST_XDIST_WORKER']}"
PG_TEST_DB = _FIXED_PG_DB or f"horde_lite_tests_{os.getpid()}_{uuid.uuid4().hex[:8]}"
_pg: PostgresTarget | None = None
_pg_created: str | None = None  # the base server URL, once this run has created PG_TEST_DB


def _postgres() -> PostgresTarget:
    global _pg
    if _pg is None:
        _pg = resolve_postgres()
    return _pg


SQLITE_ONLY = "--sqlite-only"
# The tests that use this fixture drive Chromium; they get the `browser` marker (`-m "not browser"`).
BROWSER_FIXTURE = "browser"
_data_home: str | None = None  # this process's stand-in for the user's data directory


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        SQLITE_ONLY,
        action="store_true",
        help="horde_lite: run the SQLite half only (deselect every test that needs PostgreSQL)",
    )


def _sqlite_only(config: pytest.Config) -> bool:
    return bool(config.getoption(SQLITE_ONLY))


def _needs_postgres(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("db_url") == "postgresql":
        return True
    marked = item.get_closest_marker("postgres_only") is not None
    return marked or "pg_url" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if BROWSER_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
    if not _sqlite_only(config):
        return
    kept = [item for item in items if not _needs_postgres(item)]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if _needs_postgres(item)])
        items[:] = kept


def pytest_configure(config: pytest.Config) -> None:
    # The default database lives in the user's data directory: a test (or a CLI it starts) that
    # falls back to it must never touch the real one. pytest_unconfigure removes it.
    global _data_home
    _data_home = tempfile.mkdtemp(prefix="horde-lite-test-data-")
    os.environ["XDG_DATA_HOME"] = _data_home


def pytest_report_header(config: pytest.Config) -> str:
    if _sqlite_only(config):
        return "horde_lite: SQLite only (--sqlite-only): the PostgreSQL half is deselected"
    target = _postgres()
    if target.url is None:
        verdict = "FAILING (required)" if require_postgres() else "SKIPPING the PostgreSQL half"
        return f"horde_lite: PostgreSQL unavailable, {verdict}: {target.reason}"
    return f"horde_lite: PostgreSQL: {target.reason}"


def pytest_unconfigure(config: pytest.Config) -> None:
    if _data_home is not None:
        shutil.rmtree(_data_home, ignore_errors=True)
    if _pg_created is not None and not _FIXED_PG_DB:
        asyncio.run(_drop_pg_database(_pg_created))
    if _pg is not None:
        _pg.stop()


async def _admin_connection(base_url: str, database: str | None = None) -> asyncpg.Connection:
    url = make_url(base_url)
    return await asyncpg.connect(
        host=url.host, port=url.port or 5432, user=url.username, password=url.password,
        database=database or url.database,
    )  # fmt: skip


async def _drop_pg_database(base_url: str) -> None:
    conn = await _admin_connection(base_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{PG_TEST_DB}" WITH (FORCE)')
    finally:
        await conn.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _sqlite_only(terminalreporter.config):
        terminalreporter.write_line(
            "NOTE: SQLite only (--sqlite-only); the PostgreSQL half did not run", yellow=True
        )
        return
    target = _postgres()
    if target.url is None and not require_postgres():
        terminalreporter.write_line(
            f"NOTE: the PostgreSQL half of the suite was SKIPPED: {target.reason}", yellow=True, bold=True
        )


async def _reset_pg_database(base_url: str) -> str:
    """A dedicated database on the server, emptied once per session; returns its async URL."""
    global _pg_created
    url = make_url(base_url)
    conn = await _admin_connection(base_url)
    try:
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", PG_TEST_DB):
            await conn.execute(f'CREATE DATABASE "{PG_TEST_DB}"')
        _pg_created = base_url
    finally:
        await conn.close()
    conn = await _admin_connection(base_url, PG_TEST_DB)
    try:
        await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    finally:
        await conn.close()
    return url.set(database=PG_TEST_DB).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pg_url() -> str:
    target = _postgres()
    if target.url is None:
        if require_postgres():
            pytest.fail(
                f"PostgreSQL is required (HORDE_LITE_REQUIRE_POSTGRES) but unavailable: {target.reason}"
            )
        pytest.skip(f"PostgreSQL half skipped: {target.reason}")
    url = asyncio.run(_reset_pg_database(target.url))
    migrate.upgrade(url)
    return url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    url = f"sqlite+aiosqlite:///{path}"
    migrate.upgrade(url)
    asyncio.run(_analyzed(url))  # as a served file is, so no test's start-up analyzes its copy
    return path


async def _analyzed(url: str) -> None:
    engine = make_engine(url, null_pool=True)
    try:
        await statistics.at_start(engine)
    finally:
        await engine.dispose()


async def truncate_pg(url: str) -> None:
    """Empty every table of a migrated PostgreSQL test database (ids restart)."""
    parsed = make_url(url)
    conn = await asyncpg.connect(
        host=parsed.host, port=parsed.port or 5432, user=parsed.username, password=parsed.password,
        database=parsed.database,
    )  # fmt: skip
    try:
        # DELETE with triggers and foreign keys off (replica role) and the sequences restarted: the
        # same empty database as TRUNCATE ... RESTART IDENTITY, several times faster on small tables.
        # Only these tables' own sequences restart (the change log, outside the models, keeps its ids).
        names = [t.name for t in Base.metadata.sorted_tables]
        deletes = "; ".join(f'DELETE FROM "{name}"' for name in names)
        listed = ", ".join(f"'{name}'" for name in names)
        await conn.execute(
            f"SET session_replication_role = replica; {deletes}; SET session_replication_role = DEFAULT;"
            " SELECT setval(s.oid::regclass, 1, false) FROM pg_class s"
            " JOIN pg_depend d ON d.objid = s.oid AND d.deptype IN ('a', 'i')"
            f" JOIN pg_class t ON t.oid = d.refobjid WHERE s.relkind = 'S' AND t.relname IN ({listed})"
        )
    finally:
        await conn.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database of each kind, fresh for every test."""
    if request.param == "sqlite":
        path = tmp_path / "horde_lite.db"
        shutil.copy(request.getfixturevalue("sqlite_template"), path)
        return f"sqlite+aiosqlite:///{path}"
    url = request.getfixturevalue("pg_url")
    asyncio.run(truncate_pg(url))
    return url


def is_postgres(url: str) -> bool:
    return url.startswith("postgresql")


# Test settings: the sweep does not run by itself (tests call it, after moving the clock). The
# per-user limits and the owner failure rule are off, as tests give one user many workers and
# faults; tests/integration/test_owner_limits.py turns them on (make_settings).
TEST_OVERRIDES: dict[str, dict[str, object]] = {
    "database": {"null_pool": True},
    "lease": {"sweep_seconds": 0},
    "chat": {"grace_seconds": 2},
    "worker": {"max_per_user": 0, "max_per_trusted_user": 0, "owner_failure_limit": 0},
    "sharedkeys": {"max_per_user": 0, "max_per_trusted_user": 0},
    # The clock stands still in a test: a remembered idle answer would outlive every change a test
    # makes but a job's arrival. tests/integration/test_idle_answers.py turns them on.
    "pops": {"idle_answer_seconds": 0},
}


def make_settings(db_url: str, **tables: dict[str, object]) -> Settings:
    """Settings for a test: the defaults, the test overrides, then `tables` (e.g. allowance={...})."""
    data: dict[str, dict[str, object]] = {k: dict(v) for k, v in TEST_OVERRIDES.items()}
    for table, values in tables.items():
        data.setdefault(table, {}).update(values)
    data.setdefault("database", {})["url"] = db_url
    return msgspec.convert(data, Settings)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def settings(db_url: str) -> Settings:
    return make_settings(db_url)


@pytest.fixture
def app(settings: Settings, clock: ManualClock) -> Litestar:
    return app_for(settings, clock)


@pytest.fixture
async def client(app: Litestar) -> AsyncIterator[HordeClient]:
    async with AsyncTestClient(app=app, timeout=30) as http:
        yield HordeClient(http, app.state.horde)


@pytest.fixture
def horde(client: HordeClient) -> Horde:
    return client.horde


# A hung test fails after the `timeout` ini setting (pytest-timeout) with every asyncio task's stack
# and every thread's: a hang in this suite is an await that never returns, which a thread dump
# alone would show only as the event loop's `select`.
@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: object) -> bool | None:
    seconds = getattr(settings, "timeout", 0)
    if not seconds or threading.current_thread() is not threading.main_thread():
        return None

    def expired(signum: int, frame: object) -> None:
        print(f"\n+++ {item.nodeid} still running after {seconds} s +++", file=sys.stderr)
        loop = asyncio._get_running_loop()
        for task in asyncio.all_tasks(loop) if loop is not None else ():
            print(f"--- {task!r}", file=sys.stderr)
            task.print_stack(file=sys.stderr)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        pytest.fail(f"timed out after {seconds} s (stacks in the captured stderr)", pytrace=False)

    signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> bool | None:
    if threading.current_thread() is threading.main_thread():
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    return True
