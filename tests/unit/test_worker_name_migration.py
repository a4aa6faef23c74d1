"""The migration that keys worker names (horde_lite/db/migrations/versions/0003_*): existing workers
get their name's key, the oldest holder of a key keeps it, and the database refuses a second worker
with the same key, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from horde_lite.db import migrate
from horde_lite.db.engine import make_engine
from horde_lite.db.migrate import _commands

BEFORE = "0002_failed_workers_key_holds"


async def _sql(url: str, *statements: str) -> list[tuple[object, ...]]:
    engine = make_engine(url, null_pool=True)
    try:
        async with engine.begin() as conn:
            rows: list[tuple[object, ...]] = []
            for statement in statements:
                result = await conn.execute(text(statement))
                rows = [tuple(r) for r in result] if result.returns_rows else []
            return rows
    finally:
        await engine.dispose()


def _worker(worker_id: str, name: str, created: float) -> str:
    return (
        "INSERT INTO workers (id, name, owner_id, trusted, models, max_length, max_context_length, threads,"
        " bridge_agent, nsfw, priority_user_ids, chat_features, chat_image_transports, maintenance,"
        " maintenance_msg, paused, last_check_in, created_at, speed_samples, capacity, completed_jobs,"
        " aborted_jobs, faulted_jobs, tokens_generated, kudos_earned) VALUES"
        f" ('{worker_id}', '{name}', 1, false, '[]', 512, 2048, 1, '', false, '[]', '[]', '[]', false, '',"
        f" false, {created}, {created}, '[]', 0, 0, 0, 0, 0, 0)"
    )


def test_existing_names_are_keyed_oldest_first(db_url: str) -> None:
    try:
        _run(db_url)
    finally:
        migrate.upgrade(db_url)  # leave the shared database at the head for the other tests


def _run(db_url: str) -> None:
    asyncio.run(_sql(db_url, "DELETE FROM workers", "DELETE FROM users"))
    _commands(db_url).downgrade(BEFORE)
    asyncio.run(
        _sql(
            db_url,
            "INSERT INTO users (id, username, api_key_hash, kudos, trusted, moderator, anonymous, created_at)"
            " VALUES (1, 'owner', 'h', 0, false, false, false, 0)",
            _worker("a", "Night Owl", 2.0),
            _worker("b", "night  owl ", 1.0),  # older: keeps the key
            _worker("c", "Lark", 3.0),
        )
    )
    migrate.upgrade(db_url)
    rows = asyncio.run(_sql(db_url, "SELECT id, name_key, info, deleted_at FROM workers ORDER BY id"))
    assert rows == [("a", None, "", None), ("b", "night owl", "", None), ("c", "lark", "", None)]
    # Deleted workers (no key) may share a name; two live keys may not.
    asyncio.run(_sql(db_url, _worker("d", "Lark", 4.0)))
    with pytest.raises(IntegrityError):
        asyncio.run(_sql(db_url, "UPDATE workers SET name_key = 'lark' WHERE id = 'd'"))
