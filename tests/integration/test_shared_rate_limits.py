"""Rate limits counted in a shared store (`[ratelimit] store`): two apps (or two server processes)
on one database, or on one Redis, share one budget per key and address, on both faces; the window
starts again when it ends; the store never holds a usable key, and ended windows are purged; a store
that cannot be reached is a 503, never a 500 and never a call let through uncounted."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient
from redis import Redis
from redis.exceptions import RedisError
from sqlalchemy import select

from horde_lite.app import create_app
from horde_lite.clock import ManualClock
from horde_lite.db.models import RateCount
from tests.conftest import is_postgres, make_settings
from tests.integration.test_http_edges import unreachable_database
from tests.support.horde import ANON, HordeClient
from tests.support.server import served

DRY = {"prompt": "Hi", "params": {"max_length": 16, "max_context_length": 1024}, "dry_run": True}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}
REGISTER = "/api/v2/register"
REDIS_URL = os.environ.get("HORDE_LITE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def redis_url() -> str:
    """The test Redis; its tests are skipped when none answers, unless HORDE_LITE_REQUIRE_REDIS=1
    (CI), which fails them instead."""
    try:
        with Redis.from_url(REDIS_URL, socket_connect_timeout=2) as client:
            client.ping()
    except (RedisError, OSError) as exc:
        if os.environ.get("HORDE_LITE_REQUIRE_REDIS") == "1":
            pytest.fail(f"Redis is required (HORDE_LITE_REQUIRE_REDIS) but unreachable at {REDIS_URL}: {exc}")
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    return REDIS_URL


@pytest.fixture
def namespace(redis_url: str) -> Any:
    """A key prefix of this test's own in the shared Redis, emptied afterwards."""
    prefix = f"horde_lite_test_{uuid.uuid4().hex[:12]}"
    yield prefix
    with Redis.from_url(redis_url) as client:
        for name in client.scan_iter(f"{prefix}:*"):
            client.delete(name)


@asynccontextmanager
async def apps(db_url: str, clock: ManualClock, count: int = 2, **ratelimit: object) -> AsyncIterator[Any]:
    """`count` apps on one database with the same `[ratelimit]`, each over its own test client."""
    settings = make_settings(db_url, ratelimit=ratelimit)
    async with AsyncExitStack() as stack:
        clients = []
        for _ in range(count):
            app = create_app(settings, clock, run_sweeper=False)
            http = await stack.enter_async_context(AsyncTestClient(app=app, timeout=30))
            clients.append(HordeClient(http, app.state.horde))
        yield clients


def assert_limited_on_both_faces(horde_face: httpx.Response, v1_face: httpx.Response) -> None:
    assert horde_face.status_code == 429, horde_face.text
    assert horde_face.json() == {"rc": "RateLimited", "message": horde_face.json()["message"]}
    assert int(horde_face.headers["retry-after"]) >= 1
    assert horde_face.headers["ratelimit-remaining"] == "0"
    assert v1_face.status_code == 429, v1_face.text
    assert v1_face.json()["error"]["code"] == "rate_limit_exceeded"
    assert v1_face.json()["error"]["type"] == "rate_limit_error"


async def chat(client: HordeClient, key: str) -> httpx.Response:
    return await client.http.post(
        "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"}
    )


async def rows(client: HordeClient) -> list[RateCount]:
    async with client.horde.reading() as session:
        return list((await session.execute(select(RateCount))).scalars())


# --- the database ----------------------------------------------------------------------------------


async def test_two_apps_on_one_database_share_one_budget(db_url: str, clock: ManualClock) -> None:
    async with apps(db_url, clock, store="database", create_per_minute=4, status_per_minute=2) as (one, two):
        key = await one.user("alice", kudos=1000)
        other = await one.user("bob", kudos=1000)
        remaining = []
        for client in (one, two, one, two):
            answer = await client.create(key, **DRY)
            assert answer.status_code == 200, answer.text
            assert answer.headers["ratelimit-limit"] == "4"
            remaining.append(answer.headers["ratelimit-remaining"])
        assert remaining == ["3", "2", "1", "0"]
        assert_limited_on_both_faces(await one.create(key, **DRY), await chat(two, key))
        assert (await two.create(other, **DRY)).status_code == 200  # another key has its own budget

        missing = f"/api/v2/generate/text/status/{uuid.uuid4()}"
        assert (await one.http.get(missing, headers={"apikey": key})).status_code == 404
        assert (await two.http.get(missing, headers={"apikey": key})).status_code == 404
        limited = await one.http.get(missing, headers={"apikey": key})
        assert limited.status_code == 429
        assert limited.json()["rc"] == "RateLimited"

        # The window began with the first call and lasts a minute of the horde's clock.
        clock.advance(59)
        assert (await two.create(key, **DRY)).status_code == 429
        clock.advance(2)
        again = await two.create(key, **DRY)
        assert again.status_code == 200, again.text
        assert again.headers["ratelimit-remaining"] == "3"
        assert (await chat(one, key)).status_code != 429
        assert (await one.http.get(missing, headers={"apikey": key})).status_code == 404


async def test_concurrent_calls_on_two_apps_admit_exactly_the_limit(db_url: str, clock: ManualClock) -> None:
    async with apps(db_url, clock, store="database", status_per_minute=10) as (one, two):
        missing = f"/api/v2/generate/text/status/{uuid.uuid4()}"
        answers = await asyncio.gather(*(client.http.get(missing) for client in (one, two) * 15))
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [404] * 10 + [429] * 20
        (row,) = await rows(one)
        assert row.hits == 30  # refused calls count too: a client gains nothing by insisting


async def test_auto_shares_on_postgresql_and_counts_per_process_on_sqlite(
    db_url: str, clock: ManualClock
) -> None:
    async with apps(db_url, clock, create_per_minute=2) as (one, two):
        admitted = [(await client.create(ANON, **DRY)).status_code for client in (one, one, two, two)]
    if is_postgres(db_url):
        assert admitted == [200, 200, 429, 429]
    else:  # each process counts on its own: the documented slack of the memory store
        assert admitted == [200, 200, 200, 200]


async def test_registrations_share_one_budget_per_address(db_url: str, clock: ManualClock) -> None:
    async with apps(db_url, clock, store="database", register_per_hour=2) as (one, two):
        # Registration is closed: each call is refused, and counted all the same.
        first = await one.http.post(REGISTER, json={"username": "one"})
        assert first.status_code not in (429, 500), first.text
        second = await two.http.post(REGISTER, json={"username": "two"}, headers={"apikey": "made-up-key"})
        assert second.status_code not in (429, 500), second.text
        over = await one.http.post(REGISTER, json={"username": "three"}, headers={"apikey": "another"})
        assert over.status_code == 429
        assert over.json()["rc"] == "RateLimited"
        assert (await two.http.post("/register", data={"username": "four"})).status_code == 429
        clock.advance(3601)
        assert (await two.http.post(REGISTER, json={"username": "five"})).status_code not in (429, 500)


async def test_the_store_holds_no_key_and_a_huge_key_takes_no_more_room(
    db_url: str, clock: ManualClock
) -> None:
    async with apps(db_url, clock, count=1, store="database", create_per_minute=1) as (one,):
        key = await one.user("alice", kudos=1000)
        huge = "k" * 60_000
        assert (await one.create(key, **DRY)).status_code == 200
        first = await one.create(huge, **DRY)
        assert first.status_code not in (429, 500), first.text
        second = await one.create(huge, **DRY)
        assert second.status_code == 429, second.text  # the huge key is counted like any other
        counted = await rows(one)
        assert len(counted) == 2
        for row in counted:
            assert row.key.startswith("ratelimit_create:")
            assert len(row.key) <= 64
            assert key[:8] not in row.key
            assert "kkkk" not in row.key
            assert row.hits >= 1


async def test_ended_windows_are_purged(db_url: str, clock: ManualClock) -> None:
    async with apps(db_url, clock, count=1, store="database", status_per_minute=5) as (one,):
        app = one.http.app
        missing = f"/api/v2/generate/text/status/{uuid.uuid4()}"
        for i in range(60):  # one-off callers from many addresses: one row each
            transport = httpx.ASGITransport(app=app, client=(f"10.9.{i // 200}.{i % 200 + 1}", 4000))
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
                assert (await http.get(missing)).status_code == 404
        assert len(await rows(one)) == 60
        clock.advance(30)  # within the purge interval and the windows: nothing goes
        assert (await one.http.get(missing)).status_code == 404
        assert len(await rows(one)) == 61
        clock.advance(300)  # every window has ended: the next counted call purges them
        assert (await one.http.get(missing)).status_code == 404
        assert [row.hits for row in await rows(one)] == [1]


async def test_an_unreachable_database_is_a_503_on_both_faces(db_url: str, clock: ManualClock) -> None:
    async with apps(db_url, clock, count=1, store="database") as (one,):
        async with unreachable_database(one.horde, db_url):
            horde_face = await one.create(ANON, **DRY)
            assert horde_face.status_code == 503, horde_face.text
            assert horde_face.json()["rc"] == "DatabaseUnavailable"
            assert horde_face.headers["retry-after"] == "5"
            v1_face = await chat(one, ANON)
            assert v1_face.status_code == 503, v1_face.text
            assert v1_face.json()["error"]["code"] == "database_unavailable"
        # Nothing was counted or lost: the budget is whole once the database is back.
        answer = await one.create(ANON, **DRY)
        assert answer.status_code == 200, answer.text
        assert answer.headers["ratelimit-remaining"] == "59"


@pytest.mark.slow
def test_two_server_processes_share_one_budget(db_url: str, tmp_path: Path) -> None:
    overrides: dict[str, dict[str, object]] = {"ratelimit": {"store": "database", "create_per_minute": 3}}
    with served(db_url, overrides, tmp_path) as first, served(db_url, overrides, tmp_path) as second:
        statuses = []
        for base in (first.base, second.base, first.base, second.base, first.base):
            answer = httpx.post(f"{base}/api/v2/generate/text/async", json=DRY, headers={"apikey": ANON})
            statuses.append(answer.status_code)
        assert statuses == [200, 200, 200, 429, 429]
        v1 = httpx.post(f"{second.base}/v1/chat/completions", json=CHAT)
        assert v1.status_code == 429
        assert v1.json()["error"]["code"] == "rate_limit_exceeded"


# --- Redis -----------------------------------------------------------------------------------------


async def test_two_apps_on_one_redis_share_one_budget(
    db_url: str, clock: ManualClock, redis_url: str, namespace: str
) -> None:
    async with apps(
        db_url, clock, store=redis_url, redis_namespace=namespace, create_per_minute=3, register_per_hour=1
    ) as (one, two):
        key = await one.user("alice", kudos=1000)
        remaining = []
        for client in (one, two, one):
            answer = await client.create(key, **DRY)
            assert answer.status_code == 200, answer.text
            remaining.append(answer.headers["ratelimit-remaining"])
        assert remaining == ["2", "1", "0"]
        assert_limited_on_both_faces(await two.create(key, **DRY), await chat(one, key))

        assert (await one.http.post(REGISTER, json={"username": "x"})).status_code not in (429, 500)
        assert (await two.http.post(REGISTER, json={"username": "y"})).status_code == 429

        with Redis.from_url(redis_url) as store:
            names = [name.decode() for name in store.scan_iter(f"{namespace}:*")]
            assert sorted(n.split(":")[1] for n in names) == ["ratelimit_create", "ratelimit_register"]
            for name in names:
                assert key[:8] not in name
                assert 0 < store.ttl(name) <= 3600
            # The windows end (as Redis's expiry ends them): the budget is whole again.
            store.delete(*names)
        again = await one.create(key, **DRY)
        assert again.status_code == 200, again.text
        assert again.headers["ratelimit-remaining"] == "2"


async def test_an_unreachable_redis_is_a_503_on_both_faces(
    db_url: str, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logger = logging.getLogger("horde_lite.ratelimit")
    async with apps(db_url, clock, count=1, store=f"redis://127.0.0.1:{port}/0") as (one,):
        logger.addHandler(caplog.handler)  # the app's start-up set the logging up anew, caplog's aside
        horde_face = await one.create(ANON, **DRY)
        assert horde_face.status_code == 503, horde_face.text
        assert horde_face.json()["rc"] == "DatabaseUnavailable"
        assert horde_face.headers["x-should-retry"] == "true"
        v1_face = await chat(one, ANON)
        assert v1_face.status_code == 503, v1_face.text
        assert v1_face.json()["error"]["code"] == "database_unavailable"
        page = await one.http.post("/register", data={"username": "x"})
        assert page.status_code == 503, page.text
        # Calls no limit counts are answered as ever.
        assert (await one.http.get("/api/v2/status/heartbeat")).status_code == 200
    logger.removeHandler(caplog.handler)
    assert any("rate limit store unavailable" in r.getMessage() for r in caplog.records)
