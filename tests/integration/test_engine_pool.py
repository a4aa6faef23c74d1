"""The PostgreSQL pool's check of a connection before use: one the server closed is replaced before
any statement can fail on it, and the check costs a transaction no round trip of its own (its BEGIN
is the check)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import event, text
from sqlalchemy.engine import make_url

from horde_lite.app import create_app
from horde_lite.clock import ManualClock
from horde_lite.core.context import Caller, Horde
from horde_lite.db.engine import connect_to_read, make_engine
from horde_lite.inputs import PopInput
from horde_lite.jobs import dispatch
from horde_lite.jobs.dispatch import Popped
from tests.conftest import is_postgres, make_settings
from tests.support.horde import HordeClient


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
        async with connect_to_read(engine) as conn:  # as `Horde.reading` reads
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


@pytest.mark.postgres_only
async def test_a_transactions_begin_is_the_pools_check_and_a_read_pings(db_url: str) -> None:
    """What each checkout of a pooled connection sends, as asyncpg logs it: a transaction's BEGIN
    is the check (no ping before it), a read outside any transaction pings and never begins, and a
    transaction opened while reading begins at its own checkout."""
    if not is_postgres(db_url):
        pytest.skip("PostgreSQL only: the pool's check of asyncpg connections")
    app = create_app(make_settings(db_url, database={"null_pool": False}), run_sweeper=False)  # pooled
    async with AsyncTestClient(app=app):
        await _what_checkouts_send(app.state.horde)


async def _what_checkouts_send(horde: Horde) -> None:
    sent: list[str] = []

    def log(query: asyncpg.connection.LoggedQuery) -> None:
        sent.append(query.query.strip().rstrip(";").split(" ISOLATION")[0].upper())

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.driver_connection.add_query_logger(log)

    await horde.engine.dispose()  # every connection from here on logs what it sends
    event.listen(horde.engine.sync_engine, "connect", on_connect)
    async with horde.transaction() as first, horde.transaction() as second:  # two new connections,
        await first.execute(text("SELECT 0"))  # used at once: not checked
        await second.execute(text("SELECT 0"))
    await asyncio.sleep(0)
    sent.clear()

    # asyncpg logs what it sends outside prepared statements: BEGIN, COMMIT and the ping (`;`).
    async with horde.transaction() as session:
        await session.execute(text("SELECT 1"))
    await asyncio.sleep(0)  # asyncpg calls its query loggers soon, not at once
    assert sent == ["BEGIN", "COMMIT"]
    sent.clear()
    async with horde.reading() as session:
        await session.execute(text("SELECT 2"))
        async with horde.transaction() as inner:  # the pool's other connection
            await inner.execute(text("SELECT 3"))
    await asyncio.sleep(0)
    assert sent == ["", "BEGIN", "COMMIT"]  # the read's ping, then the inner transaction's BEGIN


@pytest.mark.postgres_only
async def test_an_idle_pop_sends_no_ping_and_reads_again_on_an_ended_connection(
    db_url: str, clock: ManualClock
) -> None:
    """An idle pop's reads (`dispatch.look`) check their connection out without the ping: on one
    the server terminated a moment ago they fail, and run again on a checked connection, so the
    worker gets its answer, never an error, and the dead connection is not pooled again."""
    if not is_postgres(db_url):
        pytest.skip("PostgreSQL only: the pool's check of asyncpg connections")
    app = create_app(make_settings(db_url, database={"null_pool": False}), clock, run_sweeper=False)  # pooled
    url = make_url(db_url)
    admin = await asyncpg.connect(host=url.host, port=url.port or 5432, user=url.username,
                                  password=url.password, database=url.database)  # fmt: skip
    try:
        async with AsyncTestClient(app=app, timeout=30) as http:
            horde: Horde = app.state.horde
            sent: list[str] = []
            pids = await _logged_pool(horde, sent)  # the pool is this loop's from here on
            caller = Caller(apikey=await HordeClient(http, horde).user("owner"))
            body = PopInput(name="idle")
            assert (await dispatch.pop_job(horde, caller, body)).offer is None  # known from here on
            await asyncio.sleep(0)
            sent.clear()
            assert (await dispatch.look(horde, caller, body)) == Popped(offer=None, skipped={})
            await asyncio.sleep(0)  # asyncpg calls its query loggers soon, not at once
            assert "" not in sent  # no ping
            for _ in range(30):  # the window is about a millisecond: try it many times
                for pid in set(pids):
                    await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
                pids.clear()
                assert (await dispatch.look(horde, caller, body)) == Popped(offer=None, skipped={})
    finally:
        await admin.close()


async def _logged_pool(horde: Horde, sent: list[str]) -> list[int]:
    """From here on the pool's new connections log what they send into `sent`, and their backend
    pids are listed in the list returned."""
    pids: list[int] = []

    def log(query: asyncpg.connection.LoggedQuery) -> None:
        sent.append(query.query.strip().rstrip(";").split(" ISOLATION")[0].upper())

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.driver_connection.add_query_logger(log)

    def on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        pids.append(dbapi_connection.driver_connection.get_server_pid())

    await horde.engine.dispose()
    event.listen(horde.engine.sync_engine, "connect", on_connect)
    event.listen(horde.engine.sync_engine, "checkout", on_checkout)
    return pids
