"""One app started on several databases in turn (`HordeLitePlugin.serve`, as the suite's `app_for`
does): each start-up serves the database, policies and clock it was last given, with rate-limit
counts of its own, and an app that is running is never handed out twice. Both databases."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from horde_lite.app import built_from
from horde_lite.clock import ManualClock
from horde_lite.db import migrate
from tests.conftest import make_settings, truncate_pg
from tests.support.apps import app_for
from tests.support.horde import ANON, HordeClient

LIMITED = {"ratelimit": {"create_per_minute": 1, "status_per_minute": 0}}
DRY = {"prompt": "hi", "params": {"max_length": 16}, "dry_run": True}


async def _second_database(db_url: str, tmp_path: Path, template: Path | None) -> str:
    """Another empty, migrated database of the same kind as `db_url`."""
    if template is not None:
        path = tmp_path / "second.db"
        shutil.copy(template, path)
        return f"sqlite+aiosqlite:///{path}"
    await truncate_pg(db_url)  # the same PostgreSQL test database, emptied: as good as another
    return db_url


async def test_a_reused_app_serves_the_database_clock_and_policies_it_was_last_given(
    db_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    template = request.getfixturevalue("sqlite_template") if db_url.startswith("sqlite") else None
    first = make_settings(db_url, policies={"speed_gate": "off"}, **LIMITED)
    app = app_for(first, ManualClock())
    async with AsyncTestClient(app=app, timeout=30) as http:
        client = HordeClient(http, app.state.horde)
        alice = await client.user("alice")
        assert (await http.get("/api/v2/find_user", headers={"apikey": alice})).status_code == 200
        assert app.state.horde.policies.names["speed_gate"] == "off"
        assert (await client.create(ANON, **DRY)).status_code == 200
        assert (await client.create(ANON, **DRY)).status_code == 429  # one a minute

    second_url = await _second_database(db_url, tmp_path, template)
    clock = ManualClock()
    clock.advance(3600)
    second = make_settings(second_url, policies={"speed_gate": "enforce_all"}, **LIMITED)
    assert built_from(second) == built_from(first)
    reused = app_for(second, clock)
    assert reused is app
    async with AsyncTestClient(app=reused, timeout=30) as http:
        horde = reused.state.horde
        assert horde.clock is clock
        assert horde.settings.database.url == second_url
        assert horde.policies.names["speed_gate"] == "enforce_all"
        client = HordeClient(http, horde)
        unknown = await http.get("/api/v2/find_user", headers={"apikey": alice})
        assert unknown.status_code == 401, unknown.text  # the first database's user is not here
        # The first start-up's count is not this one's: the anonymous caller has its minute again.
        assert (await client.create(ANON, **DRY)).status_code == 200
        assert (await client.create(ANON, **DRY)).status_code == 429


async def test_a_running_app_is_not_handed_out_again(db_url: str) -> None:
    settings = make_settings(db_url)
    app = app_for(settings, ManualClock())
    async with AsyncTestClient(app=app, timeout=30):
        other = app_for(settings, ManualClock())
        assert other is not app
    assert app_for(settings, ManualClock()) is app  # stopped: shared again


def test_heads_are_read_once_and_match_the_scripts() -> None:
    from alembic.script import ScriptDirectory

    assert migrate.heads() is migrate.heads()
    assert migrate.heads() == set(ScriptDirectory(str(migrate.MIGRATIONS)).get_heads())
