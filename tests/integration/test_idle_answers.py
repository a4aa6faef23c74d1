"""Idle answers remembered (docs/reference/horde_api.md, "Idle answers remembered"): while something
tells the process of other processes' jobs (its LISTEN connection on PostgreSQL, else the waiting
pops' watcher of the change log, as on SQLite), a known worker's idle poll is answered again from
memory without a statement, until jobs arrive for one of its models (in this process or another),
the horde's modes switch, its check-in falls due or `[pops] idle_answer_seconds` pass. Never for
another key, never across a break in what tells."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import select
from sqlalchemy.engine import make_url

from horde_lite.accounts.workers import CHECK_IN_RESOLUTION
from horde_lite.clock import ManualClock
from horde_lite.db.models import Worker
from horde_lite.operators import horde_modes
from horde_lite.settings import Settings
from tests.conftest import make_settings
from tests.support import prom
from tests.support.apps import app_for
from tests.support.horde import ANON, HordeClient
from tests.support.statements import statements_sent

SECONDS = 5.0  # below the check-in's own interval, so the two ends are told apart
IDLE = {"models": ["m"], "max_length": 64}
PATIENCE = 30.0  # a hang guard, not a speed check


@pytest.fixture
def settings(db_url: str) -> Settings:
    return make_settings(db_url, pops={"idle_answer_seconds": SECONDS, "wait_poll_seconds": WATCH_SECONDS})


WATCH_SECONDS = 0.1  # the watcher's reads of the change log, where no LISTEN connection tells


def postgres_only(client: HordeClient) -> None:
    if client.horde.engine.dialect.name != "postgresql":
        pytest.skip("a LISTEN connection is PostgreSQL's")


def sqlite(client: HordeClient) -> bool:
    return client.horde.engine.dialect.name == "sqlite"


async def ready(client: HordeClient) -> None:
    """Until what tells the process of other processes' jobs is up: the LISTEN connection on
    PostgreSQL; on SQLite the watcher, which the first pop that could be remembered starts, and
    which tells once it has read where the change log stands (`remembered_idle` waits for that)."""
    if not sqlite(client):
        await listening(client)


async def listening(client: HordeClient) -> None:
    """Until the app's LISTEN connection is up (read from here: the app runs on its own loop)."""
    deadline = time.monotonic() + PATIENCE
    while not client.horde.notifier.listening.is_set():
        assert time.monotonic() < deadline, "the listener never connected"
        await asyncio.sleep(0.02)


async def statements_of_pop(client: HordeClient, key: str, name: str = "w1", **body: Any) -> tuple[int, dict]:
    """(statements the pop sent, its answer)."""
    with statements_sent(client.horde.engine) as sent:
        response = await client.pop(key, name, **{**IDLE, **body})
    assert response.status_code == 200, response.text
    return len(sent), response.json()


async def remembered_idle(client: HordeClient, key: str, name: str = "w1") -> dict:
    """Pop until the look has read the worker's idle answer (a first pop creates the worker and
    goes the whole way; on SQLite, pops go to the database until the watcher has read), then see
    it remembered."""
    deadline = time.monotonic() + PATIENCE
    read, answer = await statements_of_pop(client, key, name)
    while True:
        assert answer["id"] is None
        sent, again = await statements_of_pop(client, key, name)
        if sent == 0:
            break
        assert time.monotonic() < deadline, "the idle answer was never remembered"
        read, answer = sent, again
        await asyncio.sleep(WATCH_SECONDS / 2)
    assert read == 1
    assert again == answer
    return answer


def move_to(client: HordeClient, at: float) -> None:
    client.clock.advance(at - client.clock.now())


async def test_an_idle_poll_is_answered_again_without_a_statement(client: HordeClient) -> None:
    key = await client.user("volunteer")
    await client.create(ANON, models=["other"], params={"max_length": 300})  # counted in `skipped`
    await ready(client)
    answer = await remembered_idle(client, key)
    assert answer["skipped"] == {"max_length": 1}
    before = prom.value(await client.metrics(), "horde_pop_remembered_total")
    for _ in range(3):
        assert (await statements_of_pop(client, key))[0] == 0
    assert prom.value(await client.metrics(), "horde_pop_remembered_total") == before + 3


async def test_jobs_for_its_models_end_it_and_jobs_for_others_do_not(client: HordeClient) -> None:
    await ready(client)
    key = await client.user("volunteer")
    await remembered_idle(client, key)
    assert (await client.create(ANON, models=["other"])).status_code == 202
    assert (await statements_of_pop(client, key))[0] == 0
    assert (await client.create(ANON, models=["m"], params={"max_length": 16})).status_code == 202
    assert (await statements_of_pop(client, key))[1]["id"] is not None
    await remembered_idle(client, key)
    assert (await client.create(ANON, params={"max_length": 16})).status_code == 202  # any model
    assert (await statements_of_pop(client, key))[1]["id"] is not None


async def test_a_job_given_back_ends_it(client: HordeClient) -> None:
    await ready(client)
    first, second = await client.user("first"), await client.user("second")
    await client.create(ANON, models=["m"], params={"max_length": 16})
    taken = (await client.pop(first, "w1", **IDLE)).json()
    assert taken["id"] is not None
    await remembered_idle(client, second, "w2")
    client.clock.advance(client.horde.settings.lease.base_seconds + 1)
    await client.sweep()  # the lease lapsed: the job goes back to its request
    assert (await statements_of_pop(client, second, "w2"))[1]["id"] is not None


async def test_its_seconds_and_its_check_in_end_it(client: HordeClient) -> None:
    await ready(client)
    key = await client.user("volunteer")
    await statements_of_pop(client, key)  # created: checked in now
    checked_in = client.clock.now()
    await remembered_idle(client, key)
    client.clock.advance(SECONDS - 0.1)
    assert (await statements_of_pop(client, key))[0] == 0
    client.clock.advance(0.1)  # `idle_answer_seconds` passed: read again, remembered again
    assert (await statements_of_pop(client, key))[0] == 1
    assert (await statements_of_pop(client, key))[0] == 0
    move_to(client, checked_in + CHECK_IN_RESOLUTION - 0.1)
    assert (await statements_of_pop(client, key))[0] == 0  # due at the check-in's interval, not later
    client.clock.advance(0.1)
    with statements_sent(client.horde.engine) as sent:
        assert (await client.pop(key, "w1", **IDLE)).json()["id"] is None
    assert any(s.statement.lstrip().upper().startswith("UPDATE WORKERS") for s in sent)
    async with client.horde.sessionmaker() as session:
        stamped = (await session.execute(select(Worker.last_check_in).where(Worker.name == "w1"))).scalar()
    assert stamped == client.clock.now()
    # Remembered with the check-in on PostgreSQL (one autocommit statement), read once more on
    # SQLite (the check-in went through a transaction).
    assert (await statements_of_pop(client, key))[0] == (1 if sqlite(client) else 0)
    assert (await statements_of_pop(client, key))[0] == 0
    move_to(client, checked_in - 1)  # a clock that moved back reads again
    assert (await statements_of_pop(client, key))[0] >= 1


async def test_a_switch_of_the_horde_modes_ends_it(client: HordeClient) -> None:
    await ready(client)
    key = await client.user("volunteer")
    await remembered_idle(client, key)
    await horde_modes.switch(client.horde, {"raid": True}, "test", "test")
    assert (await statements_of_pop(client, key))[0] >= 1


async def test_another_key_or_declaration_is_never_answered_from_it(client: HordeClient) -> None:
    await ready(client)
    key, other = await client.user("volunteer"), await client.user("other")
    await remembered_idle(client, key)
    wrong = await client.pop("not-a-key-of-anyone", "w1", **IDLE)
    assert wrong.status_code == 401, wrong.text
    taken = await client.pop(other, "w1", **IDLE)  # answered by the database: the name is the first's
    assert taken.status_code == 403, taken.text
    assert (await statements_of_pop(client, key, max_length=128))[0] >= 1  # a new declaration


@asynccontextmanager
async def host(settings: Settings, clock: ManualClock) -> AsyncIterator[HordeClient]:
    """A second server process's app on the same database (its own notifier and listener)."""
    app = app_for(settings, clock)
    async with AsyncTestClient(app=app, timeout=PATIENCE) as http:
        yield HordeClient(http, app.state.horde)


async def test_a_request_admitted_by_another_process_ends_it(client: HordeClient, settings: Settings) -> None:
    """The clock stands still, so only the other process's NOTIFY (PostgreSQL) or this process's
    watcher reading the change log (SQLite: two processes on one file) can end the answer."""
    async with host(settings, client.clock) as other:
        await ready(client)
        await ready(other)
        key = await client.user("volunteer")
        await remembered_idle(client, key)
        created = await other.create(ANON, models=["m"], params={"max_length": 16})
        assert created.status_code == 202, created.text
        deadline = time.monotonic() + PATIENCE
        while (await statements_of_pop(client, key))[1]["id"] is None:  # until it is heard of
            assert time.monotonic() < deadline, "the other process's request never reached the pop"
            await asyncio.sleep(0.02)


@pytest.mark.slow
async def test_a_break_in_the_listener_ends_it_and_nothing_is_remembered_meanwhile(
    client: HordeClient, db_url: str
) -> None:
    """A job admitted by another process while the LISTEN connection is down would not be heard of
    by it: the watcher tells meanwhile, and what either told before is not used after a change."""
    postgres_only(client)
    await listening(client)
    key = await client.user("volunteer")
    await remembered_idle(client, key)
    url = make_url(db_url)
    conn = await asyncpg.connect(
        host=url.host, port=url.port or 5432, user=url.username, database=url.database
    )
    try:
        ended = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = $1 AND (query LIKE 'LISTEN %' OR query = 'SELECT 1')",
            url.database,
        )
    finally:
        await conn.close()
    assert ended >= 1
    deadline = time.monotonic() + PATIENCE
    while client.horde.notifier.listening.is_set():
        assert time.monotonic() < deadline, "the listener never saw its connection end"
        await asyncio.sleep(0.02)
    assert (await statements_of_pop(client, key))[0] >= 1  # heard through the listener: not used
    await remembered_idle(client, key)  # the watcher tells meanwhile
    await listening(client)  # it reconnects (after a few seconds)
    assert (await statements_of_pop(client, key))[0] == 1  # what was heard before the break is not used
    assert (await statements_of_pop(client, key))[0] == 0
