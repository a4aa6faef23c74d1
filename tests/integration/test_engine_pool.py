"""The PostgreSQL pool's check of a connection before use: a live connection is handed out with no
round trip; one the server closed is replaced before any statement can fail on it."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from horde_lite.db.engine import make_engine, reading_options
from tests.conftest import is_postgres


@pytest.mark.postgres_only
async def test_a_pooled_connection_is_handed_out_without_a_ping_and_replaced_once_closed(db_url: str) -> None:
    if not is_postgres(db_url):
        pytest.skip("PostgreSQL only: the pool's check of asyncpg connections")
    engine = make_engine(db_url)  # pooled, as in production
    try:
        async with engine.connect() as conn:
            pooled = (await conn.get_raw_connection()).driver_connection
            pid = await conn.scalar(text("SELECT pg_backend_pid()"))
        queries: list[str] = []
        pooled.add_query_logger(lambda record: queries.append(record.query.strip()))
        async with engine.begin() as conn:
            assert (await conn.get_raw_connection()).driver_connection is pooled
            assert await conn.scalar(text("SELECT 1")) == 1
        assert "BEGIN;" in queries, queries  # the logger sees this connection's queries
        assert not {";", ""} & set(queries), queries  # and no ping among them

        url = make_url(db_url)
        admin = await asyncpg.connect(host=url.host, port=url.port or 5432, user=url.username,
                                      password=url.password, database=url.database)  # fmt: skip
        try:
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        finally:
            await admin.close()
        for _ in range(500):  # asyncpg sees the server's end of it about a millisecond later
            if pooled.is_closed():
                break
            await asyncio.sleep(0.01)
        assert pooled.is_closed()
        async with engine.begin() as conn:  # no error: the pool replaced the closed connection
            assert await conn.scalar(text("SELECT pg_backend_pid()")) != pid
    finally:
        await engine.dispose()


async def test_a_connection_that_read_outside_a_transaction_returns_to_the_pool_as_it_came(
    db_url: str,
) -> None:
    """`Horde.reading`'s autocommit (PostgreSQL) or its mark (SQLite) must not outlive its use: the
    next transaction on the same pooled connection is a real one, whose write a rollback undoes."""
    engine = make_engine(db_url)  # pooled, as in production
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE pool_probe (n INTEGER)"))
        async with engine.connect() as conn:
            await conn.execution_options(**reading_options(engine))
            first = (await conn.get_raw_connection()).driver_connection
            assert await conn.scalar(text("SELECT count(*) FROM pool_probe")) == 0
        async with engine.connect() as conn:
            assert (await conn.get_raw_connection()).driver_connection is first  # the same one
            transaction = await conn.begin()
            await conn.execute(text("INSERT INTO pool_probe VALUES (1)"))
            await transaction.rollback()
        async with engine.connect() as conn:
            assert await conn.scalar(text("SELECT count(*) FROM pool_probe")) == 0
    finally:
        async with engine.begin() as conn:
            await conn.execute(text("DROP TABLE IF EXISTS pool_probe"))
        await engine.dispose()
