"""The PostgreSQL pool's check of a connection before use: a live connection is handed out with no
round trip; one the server closed is replaced before any statement can fail on it."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from horde_lite.db.engine import make_engine, reading_options
from tests.conftest import is_postgres


@pytest.mark.postgres_only
async def test_a_pooled_connection_the_server_ended_is_replaced_even_at_once(db_url: str) -> None:
    """The pool checks each connection before handing it out: one the server terminated a moment
    ago is replaced, whether the driver has seen its end yet or not. (Without the check, a call in
    the millisecond between the server's termination message and the socket's close got asyncpg's
    "another operation is in progress" and a 503.)"""
    if not is_postgres(db_url):
        pytest.skip("PostgreSQL only: the pool's check of asyncpg connections")
    engine = make_engine(db_url)  # pooled, as in production
    url = make_url(db_url)
    admin = await asyncpg.connect(host=url.host, port=url.port or 5432, user=url.username,
                                  password=url.password, database=url.database)  # fmt: skip
    try:
        for _ in range(30):  # the window is about a millisecond: try it many times
            async with engine.connect() as conn:
                pid = await conn.scalar(text("SELECT pg_backend_pid()"))
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
            async with engine.begin() as conn:  # at once: no error, a new connection
                assert await conn.scalar(text("SELECT pg_backend_pid()")) != pid
    finally:
        await admin.close()
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
