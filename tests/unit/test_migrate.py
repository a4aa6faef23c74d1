"""The applied revision as start-up and the CLI read it (Alembic's MigrationContext), a database
ahead of the code, and a check that waits for no writer."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest
from alembic.util import CommandError

from horde_lite.db import migrate


@pytest.fixture
def sqlite_file(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "horde.db"
    url = f"sqlite+aiosqlite:///{path}"
    migrate.upgrade(url)
    return path, url


def test_a_fresh_database_has_no_revision(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}"
    assert asyncio.run(migrate.current(url)) is None
    assert migrate.is_behind(url)


def test_a_database_ahead_of_the_code_is_refused(sqlite_file: tuple[Path, str]) -> None:
    path, url = sqlite_file
    with sqlite3.connect(path) as conn:
        conn.execute(f"UPDATE {migrate.VERSION_TABLE} SET version_num = '9999_from_the_future'")
    assert asyncio.run(migrate.current(url)) == "9999_from_the_future"
    assert migrate.is_behind(url)  # not a head: start-up tries to upgrade, which Alembic refuses
    with pytest.raises(CommandError, match="9999_from_the_future"):
        migrate.upgrade(url)


def test_the_revision_is_read_while_a_writer_holds_the_sqlite_lock(sqlite_file: tuple[Path, str]) -> None:
    path, url = sqlite_file
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        assert asyncio.run(migrate.current(url)) in migrate.heads()
        assert time.monotonic() - started < 5  # the busy timeout is 30 s
    finally:
        writer.execute("ROLLBACK")
        writer.close()
