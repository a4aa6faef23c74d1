"""The migration that fixes prices at admission, on SQLite and PostgreSQL: requests already queued
keep the price their holds were placed at; amounts already past the bounds are clamped into them;
and the database's checks are exactly the ones db/bounds.py declares."""

from __future__ import annotations

import asyncio
import math

import pytest
from sqlalchemy import Column, ColumnDefault, column, insert, table, text
from sqlalchemy.exc import IntegrityError

from horde_lite.db import migrate
from horde_lite.db.bounds import BOUNDED_MARK, BOUNDS
from horde_lite.db.engine import make_engine
from horde_lite.db.migrate import _commands
from horde_lite.db.models import TextRequest
from horde_lite.settings import KUDOS_LIMIT
from tests.conftest import is_postgres
from tests.unit.test_queue_entries_migration import _USER, _request, _sql, users_insert

REVISION = "0019_request_prices"


async def _checks(url: str) -> set[str]:
    if is_postgres(url):
        sql = f"SELECT conname FROM pg_constraint WHERE conname LIKE '{BOUNDED_MARK}%'"
    else:
        sql = f"SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE '{BOUNDED_MARK}%'"
    return {str(name) for (name,) in await _sql(url, sql)}


def test_the_database_checks_exactly_the_declared_bounds(db_url: str) -> None:
    installed = asyncio.run(_checks(db_url))
    if is_postgres(db_url):
        assert installed == {b.name for b in BOUNDS}
    else:
        assert installed == {f"{b.name}_{event}" for b in BOUNDS for event in ("insert", "update")}


def _default(c: Column[object]) -> object:
    default = c.default
    assert isinstance(default, ColumnDefault)
    return default.arg(None) if default.is_callable else default.arg  # type: ignore[operator]


async def _seed(url: str) -> None:
    engine = make_engine(url, null_pool=True)
    try:
        async with engine.begin() as conn:
            await conn.execute(users_insert(_USER), {**_USER, "kudos": math.inf})
            named = {**_request("named", left=1, models=["x-12B"]), "max_length": 100, "prompt": "p" * 40}
            # Only the columns the schema before this migration has, with the model's defaults.
            columns = [c for c in TextRequest.__table__.c if c.name not in ("job_price", "price_context")]
            defaults = {c.name: _default(c) for c in columns if c.default is not None}
            before = table("text_requests", *(column(c.name, c.type) for c in columns))
            rows = [{**defaults, **named}, {**defaults, **_request("any", left=1, models=[])}]
            await conn.execute(insert(before), rows)
    finally:
        await engine.dispose()


def test_queued_requests_keep_their_held_price_and_amounts_are_clamped(db_url: str) -> None:
    commands = _commands(db_url)
    try:
        commands.downgrade(f"{REVISION}-1")
        assert asyncio.run(_checks(db_url)) == set()
        asyncio.run(_seed(db_url))
        migrate.upgrade(db_url)
        rows = asyncio.run(_sql(db_url, "SELECT id, job_price, price_context FROM text_requests ORDER BY id"))
        # The rule the holds were placed by (round(max_length x B / 21, 2), 20 with no models) plus
        # the burn; the context the job needs (10 prompt tokens + 100, 1 + 512).
        assert rows == [("any", 21.0, 513), ("named", round(100 * 12 / 21, 2) + 1, 110)]
        assert asyncio.run(_sql(db_url, "SELECT kudos FROM users")) == [(KUDOS_LIMIT,)]
        with pytest.raises(IntegrityError, match=BOUNDED_MARK):
            asyncio.run(_sql(db_url, "UPDATE users SET kudos = 2e12"))
    finally:
        asyncio.run(_wipe(db_url))
        migrate.upgrade(db_url)


async def _wipe(url: str) -> None:
    engine = make_engine(url, null_pool=True)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("DELETE FROM text_requests"))
            await conn.execute(text("DELETE FROM users"))
    finally:
        await engine.dispose()
