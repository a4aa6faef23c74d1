"""SQLite keeps the query planner's statistics itself (horde_lite/db/statistics.py): a fresh file is
analyzed when the server starts, and the periodic `PRAGMA optimize` analyzes the queue once it has
rows, with no operator's step. PostgreSQL leaves them to autovacuum."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from litestar.testing import AsyncTestClient

from horde_lite.app import create_app
from horde_lite.clock import ManualClock
from horde_lite.db import statistics
from tests.conftest import make_settings
from tests.support.horde import ANON, HordeClient


def _analyzed(path: Path) -> dict[str, set[str]]:
    """The tables and indexes `sqlite_stat1` holds statistics for; {} when it does not exist."""
    with sqlite3.connect(path) as conn:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'").fetchone() is None:
            return {}
        found: dict[str, set[str]] = {"": set()}  # "" marks that the table exists
        for table, index in conn.execute("SELECT tbl, idx FROM sqlite_stat1"):
            found.setdefault(table, set()).add(index or "")
        return found


async def test_a_fresh_sqlite_file_has_statistics_after_start_up(tmp_path: Path) -> None:
    path = tmp_path / "fresh.db"  # no file yet: the start-up migrates it
    app = create_app(make_settings(f"sqlite+aiosqlite:///{path}"), run_sweeper=False)
    async with AsyncTestClient(app=app) as http:
        assert (await http.get("/api/v2/status/heartbeat")).status_code == 200
        assert _analyzed(path) != {}


async def test_the_periodic_refresh_analyzes_the_queue_once_it_has_rows(tmp_path: Path) -> None:
    path = tmp_path / "grown.db"
    settings = make_settings(f"sqlite+aiosqlite:///{path}", database={"null_pool": False})  # long-lived
    app = create_app(settings, ManualClock(), run_sweeper=False)
    async with AsyncTestClient(app=app, timeout=30) as http:
        client = HordeClient(http, app.state.horde)
        owner = await client.user("owner")
        assert (await client.pop(owner, "w1", models=["m-7B"])).status_code == 200
        for _ in range(20):
            assert (await client.create(ANON, models=["m-7B"], params={"max_length": 32})).status_code == 202
        job = (await client.pop(owner, "w1", models=["m-7B"])).json()
        assert job["id"] is not None
        before = _analyzed(path)
        assert "queue_entries" not in before  # empty at start-up
        assert "text_requests" not in before
        await statistics.refresh(client.horde)  # what the sweep task runs every REFRESH_SECONDS
        after = _analyzed(path)
        assert "ix_queue_entries_walk" in after["queue_entries"]
        assert "ix_text_requests_queue" in after["text_requests"]
