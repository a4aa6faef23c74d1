"""The migration that leaves the allowance to the admission records
(horde_lite/db/migrations/versions/0008_*): requests keep every other column through it, and going
back restores each request's allowance and outcome from its record, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

from sqlalchemy import insert, text

from horde_lite.db import migrate
from horde_lite.db.engine import make_engine
from horde_lite.db.migrate import _commands
from horde_lite.db.models import AdmissionRecord, TextRequest
from tests.unit.test_queue_entries_migration import users_insert

BEFORE = "0007_requests_waited_on"


async def _sql(url: str, statement: str) -> list[tuple[object, ...]]:
    engine = make_engine(url, null_pool=True)
    try:
        async with engine.begin() as conn:
            result = await conn.execute(text(statement))
            return [tuple(r) for r in result] if result.returns_rows else []
    finally:
        await engine.dispose()


def _request(request_id: str) -> dict[str, object]:
    return {"id": request_id, "user_id": 1, "requester_kind": "registered", "state": "waiting",
            "is_chat": False, "prompt": "p", "params": {}, "max_length": 512, "max_context_length": 2048,
            "effective_start": 1.0, "created_at": 1.0, "expires_at": 100.0,
            "requested_max_length": 512}  # fmt: skip


def _record(request_id: str, allowance: int, outcome: str) -> dict[str, object]:
    return {"at": 1.0, "request_id": request_id, "requester_kind": "registered", "is_chat": False,
            "requested_max_length": 512, "n": 1, "allowance": allowance, "outcome": outcome,
            "allowance_curve": "estimated_wait"}  # fmt: skip


ROW = {"id": 1, "username": "u", "api_key_hash": "h", "kudos": 0.0, "trusted": False, "moderator": False,
       "anonymous": False, "created_at": 0.0}  # fmt: skip


async def _seed(url: str) -> None:
    engine = make_engine(url, null_pool=True)
    try:
        async with engine.begin() as conn:
            await conn.execute(users_insert(ROW), ROW)
            await conn.execute(insert(TextRequest.__table__), [_request("a"), _request("b"), _request("c")])
            await conn.execute(
                insert(AdmissionRecord.__table__),
                [_record("a", 4096, "free"), _record("b", 1024, "downgraded")],
            )
    finally:
        await engine.dispose()


def test_allowance_comes_back_from_the_records(db_url: str) -> None:
    try:
        asyncio.run(_seed(db_url))
        _commands(db_url).downgrade(BEFORE)
        rows = asyncio.run(
            _sql(db_url, "SELECT id, free_allowance, allowance_outcome FROM text_requests ORDER BY id")
        )
        # "c" has no record (admitted before records were kept): no allowance, the old default.
        assert rows == [("a", 4096, "free"), ("b", 1024, "downgraded"), ("c", None, "free")]
        migrate.upgrade(db_url)
        rows = asyncio.run(
            _sql(db_url, "SELECT id, max_length, requested_max_length FROM text_requests ORDER BY id")
        )
        assert rows == [("a", 512, 512), ("b", 512, 512), ("c", 512, 512)]
        columns = asyncio.run(_sql(db_url, "SELECT * FROM text_requests WHERE id = 'a'"))
        assert len(columns[0]) == len(TextRequest.__table__.columns)  # both columns are gone again
    finally:
        migrate.upgrade(db_url)  # leave the shared database at the head for the other tests
