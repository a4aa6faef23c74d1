"""The HTTP edges both faces share: CORS, rate limits (each face's 429), a lost database (503, never
500), the 405 `Allow` header, and keys kept out of the logs."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import httpx
import pytest
from litestar import Litestar
from litestar.routes import HTTPRoute
from litestar.testing import AsyncTestClient
from sqlalchemy.engine import make_url

from horde_lite.api.logfilter import RedactKeys, redact
from horde_lite.api.ratelimit import RateLimits
from horde_lite.app import create_app
from horde_lite.clock import ManualClock
from horde_lite.core.context import Horde
from horde_lite.db.engine import make_engine, make_sessionmaker
from horde_lite.demo.server import make_users
from tests.conftest import is_postgres, make_settings
from tests.support.apps import app_for
from tests.support.horde import ANON, HordeClient
from tests.support.server import raw_request, served

BODY = {"prompt": "Hi", "params": {"max_length": 16, "max_context_length": 1024}}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}


@asynccontextmanager
async def app_client(app: Litestar) -> AsyncIterator[HordeClient]:
    async with AsyncTestClient(app=app, timeout=30) as http:
        yield HordeClient(http, app.state.horde)


# --- CORS ------------------------------------------------------------------------------------------


async def test_browser_preflight_and_request_get_cors_headers(client: HordeClient) -> None:
    origin = "https://lite.example.org"
    preflight = await client.http.options(
        "/api/v2/generate/text/async",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "apikey, client-agent, content-type",
        },
    )
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == "*"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    allowed = {h.strip().lower() for h in preflight.headers["access-control-allow-headers"].split(",")}
    assert {"apikey", "client-agent", "content-type"} <= allowed

    v1_preflight = await client.http.options(
        "/v1/chat/completions",
        headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"},
    )  # fmt: skip
    assert v1_preflight.status_code == 204
    assert "authorization" in v1_preflight.headers["access-control-allow-headers"].lower()

    real = await client.http.get("/api/v2/status/heartbeat", headers={"Origin": origin})
    assert real.status_code == 200
    assert real.headers["access-control-allow-origin"] == "*"
    # An error answer carries them too, and exposes Retry-After to the page's JavaScript.
    missing = await client.http.get(
        f"/api/v2/generate/text/status/{uuid.uuid4()}", headers={"Origin": origin}
    )
    assert missing.status_code == 404
    assert missing.headers["access-control-allow-origin"] == "*"
    assert "retry-after" in missing.headers["access-control-expose-headers"].lower()


async def test_cors_origins_narrow_and_empty_turns_cors_off(db_url: str) -> None:
    origin = "https://lite.example.org"
    narrow = create_app(
        make_settings(db_url, http={"cors_origins": [origin]}), ManualClock(), run_sweeper=False
    )
    async with app_client(narrow) as client:
        ok = await client.http.get("/api/v2/status/heartbeat", headers={"Origin": origin})
        assert ok.headers["access-control-allow-origin"] == origin
        other = await client.http.get("/api/v2/status/heartbeat", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers
    off = create_app(make_settings(db_url, http={"cors_origins": []}), ManualClock(), run_sweeper=False)
    async with app_client(off) as client:
        answer = await client.http.get("/api/v2/status/heartbeat", headers={"Origin": origin})
        assert "access-control-allow-origin" not in answer.headers


# --- 405 -------------------------------------------------------------------------------------------


async def test_method_not_allowed_names_the_allowed_methods(client: HordeClient) -> None:
    horde = await client.http.put("/api/v2/generate/text/async", json={})
    assert horde.status_code == 405
    assert horde.json()["rc"] == "MethodNotAllowed"
    assert "POST" in {m.strip() for m in horde.headers["allow"].split(",")}
    v1 = await client.http.delete("/v1/chat/completions")
    assert v1.status_code == 405
    assert v1.json()["error"]["code"] == "method_not_allowed"
    assert "POST" in {m.strip() for m in v1.headers["allow"].split(",")}


# --- rate limits -----------------------------------------------------------------------------------


async def test_rate_limits_per_key_and_address_in_each_face(db_url: str) -> None:
    settings = make_settings(db_url, ratelimit={"create_per_minute": 2, "status_per_minute": 3})
    app = app_for(settings, ManualClock())
    async with app_client(app) as client:
        key = await client.user("alice", kudos=1000)
        other = await client.user("bob", kudos=1000)
        dry = {**BODY, "dry_run": True}
        for _ in range(2):
            assert (await client.create(key, **dry)).status_code == 200
        limited = await client.create(key, **dry)
        assert limited.status_code == 429
        assert limited.json()["rc"] == "RateLimited"
        assert set(limited.json()) == {"message", "rc"}
        assert 1 <= int(limited.headers["retry-after"]) <= 60
        assert limited.headers["ratelimit-limit"] == "2"
        # The same key's /v1 creation shares the create budget; the answer is OpenAI's shape.
        v1 = await client.http.post(
            "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"}
        )
        assert v1.status_code == 429
        assert v1.json()["error"]["type"] == "rate_limit_error"
        assert v1.json()["error"]["code"] == "rate_limit_exceeded"
        assert int(v1.headers["retry-after"]) >= 1
        # Another key from the same address is not affected; nor are routes outside the limits.
        assert (await client.create(other, **dry)).status_code == 200
        assert (await client.http.get("/api/v2/status/heartbeat", headers={"apikey": key})).status_code == 200

        missing = f"/api/v2/generate/text/status/{uuid.uuid4()}"
        for _ in range(3):
            assert (await client.http.get(missing, headers={"apikey": key})).status_code == 404
        status = await client.http.get(missing, headers={"apikey": key})
        assert status.status_code == 429
        assert status.json()["rc"] == "RateLimited"
        assert (await client.http.get(missing, headers={"apikey": other})).status_code == 404


async def test_zero_turns_a_limit_off(db_url: str) -> None:
    off = {"create_per_minute": 0, "status_per_minute": 0, "register_per_hour": 0}
    assert RateLimits(make_settings(db_url, ratelimit=off)).middleware == []
    settings = make_settings(db_url, ratelimit={"create_per_minute": 0, "status_per_minute": 1})
    async with app_client(app_for(settings, ManualClock())) as client:
        for _ in range(5):
            assert (await client.create(ANON, **BODY, dry_run=True)).status_code == 200
        missing = f"/api/v2/generate/text/status/{uuid.uuid4()}"
        assert (await client.http.get(missing)).status_code == 404
        assert (await client.http.get(missing)).status_code == 429


# --- a lost database -------------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@asynccontextmanager
async def unreachable_database(horde: Horde, db_url: str) -> AsyncIterator[None]:
    """Point the running horde at a database that is not there: a closed port, a missing directory."""
    if is_postgres(db_url):
        dead = make_url(db_url).set(host="127.0.0.1", port=_closed_port()).render_as_string(False)
    else:
        dead = f"sqlite+aiosqlite:////nonexistent-{uuid.uuid4().hex}/horde.db"
    engine, sessionmaker = horde.engine, horde.sessionmaker
    horde.engine = make_engine(dead, null_pool=True)
    horde.sessionmaker = make_sessionmaker(horde.engine)
    try:
        yield
    finally:
        await horde.engine.dispose()
        horde.engine, horde.sessionmaker = engine, sessionmaker


async def test_unreachable_database_is_a_retryable_503_on_both_faces(
    client: HordeClient, db_url: str
) -> None:
    async with unreachable_database(client.horde, db_url):
        answer = await client.create(ANON, **BODY)
        assert answer.status_code == 503, answer.text
        assert answer.json() == {
            "message": "The database is unavailable; retry in a few seconds.",
            "rc": "DatabaseUnavailable",
        }
        assert answer.headers["retry-after"] == "5"
        assert answer.headers["x-should-retry"] == "true"
        v1 = await client.http.get("/v1/models")
        assert v1.status_code == 503, v1.text
        assert v1.json()["error"]["code"] == "database_unavailable"
        assert v1.json()["error"]["type"] == "service_unavailable"
    # Nothing was lost: the horde answers again once the database is back.
    assert (await client.create(ANON, **BODY)).status_code == 202


TERMINATE_OTHERS = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = $1 AND pid <> pg_backend_pid()"
)
WAITING_ON_LOCK = "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'"


async def _kill_under_a_call(db_url: str, locked: threading.Event) -> None:
    """Lock `users` so the app's next call waits on it, then terminate that call's connection."""
    url = make_url(db_url)
    admin = await asyncpg.connect(host=url.host, port=url.port or 5432, user=url.username,
                                  password=url.password, database=url.database)  # fmt: skip
    try:
        async with admin.transaction():
            await admin.execute("LOCK TABLE users IN ACCESS EXCLUSIVE MODE")
            locked.set()
            for _ in range(500):
                if await admin.fetchval(WAITING_ON_LOCK, url.database):
                    break
                await asyncio.sleep(0.02)
            assert await admin.fetchval(TERMINATE_OTHERS, url.database) >= 1
    finally:
        await admin.close()


@pytest.mark.postgres_only
async def test_terminated_connections_never_give_a_500(db_url: str) -> None:
    if not is_postgres(db_url):
        pytest.skip("PostgreSQL only: terminates the app's server connections")
    # A pooled engine, as in production (the test settings use none).
    app = app_for(make_settings(db_url, database={"null_pool": False}), ManualClock())
    url = make_url(db_url)
    async with app_client(app) as client:
        # Anonymous calls only: a pooled connection must stay on the app's event loop.
        assert (await client.create(ANON, **BODY)).status_code == 202
        admin = await asyncpg.connect(host=url.host, port=url.port or 5432, user=url.username,
                                      password=url.password, database=url.database)  # fmt: skip
        try:
            # Idle pooled connections killed between calls: the pool's ping replaces them.
            assert await admin.fetchval(TERMINATE_OTHERS, url.database) >= 1
            answer = await client.create(ANON, **BODY)
            assert answer.status_code in (202, 503), answer.text

            # A connection killed under a call: the call is a retryable 503. The test client blocks
            # this event loop while a call runs, so the killing is done from another thread.
            locked = threading.Event()
            killer = threading.Thread(target=asyncio.run, args=(_kill_under_a_call(db_url, locked),))
            killer.start()
            assert locked.wait(10)
            answer = await client.create(ANON, **BODY)
            killer.join(10)
            assert answer.status_code == 503, answer.text
            assert answer.json()["rc"] == "DatabaseUnavailable"
            assert answer.headers["retry-after"] == "5"
            # The pool reconnects: the next call succeeds.
            assert (await client.create(ANON, **BODY)).status_code == 202
        finally:
            await admin.close()


# --- keys in logs ----------------------------------------------------------------------------------


def _is_pytests(handler: logging.Handler) -> bool:
    """pytest's own capturing handlers sit on the root logger during a test."""
    return type(handler).__module__.startswith("_pytest")


def test_redact_masks_keys_in_paths_headers_and_queries() -> None:
    shared = str(uuid.uuid4())
    request_id = str(uuid.uuid4())
    user_key = "AbCdEfGhIjKlMnOpQrStUv"
    line = (
        f'127.0.0.1:5 - "GET /api/v2/sharedkeys/{shared} HTTP/1.1" 200 request={request_id} '
        f"headers=[(b'apikey', b'{user_key}'), (b'authorization', b'Bearer {user_key}')] "
        f"{{'apikey': '{user_key}'}} /api/v2/x?apikey={user_key}&a=1 /sharedkeys/{user_key}"
    )
    masked = redact(line)
    assert shared not in masked
    assert user_key not in masked
    assert request_id in masked  # ids stay: they are how an operator follows a request
    assert "/api/v2/sharedkeys/*** HTTP/1.1" in masked


def test_uvicorn_access_line_keeps_its_arguments() -> None:
    shared = str(uuid.uuid4())
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "GET", f"/api/v2/sharedkeys/{shared}", "1.1", 200), None,
    )  # fmt: skip
    assert RedactKeys().filter(record)
    assert record.args == ("127.0.0.1:5", "GET", "/api/v2/sharedkeys/***", "1.1", 200)


async def test_keys_never_reach_the_logs(
    client: HordeClient, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    key = await client.user("alice", kudos=1000)
    shared = str(uuid.uuid4())
    # Every handler the app logs through masks keys (and uvicorn's loggers go through them too).
    for name in ("", "litestar", "uvicorn.access", "uvicorn.error"):
        handlers = [h for h in logging.getLogger(name).handlers if not _is_pytests(h)]
        assert handlers, name
        assert all(any(isinstance(f, RedactKeys) for f in h.filters) for h in handlers), name
    caplog.set_level(logging.INFO)
    # The app logs the path of a call the database could not serve: here it carries a shared key.
    async with unreachable_database(client.horde, db_url):
        answer = await client.http.get(f"/api/v2/sharedkeys/{shared}", headers={"apikey": key})
    assert answer.status_code == 503
    assert any("database unavailable on GET /api/v2/sharedkeys/***" in r.getMessage() for r in caplog.records)
    # An error logged with a key in its message, arguments and traceback.
    log = logging.getLogger("horde_lite.errors")
    try:
        raise RuntimeError(f"boom apikey={key} at /api/v2/sharedkeys/{shared}")
    except RuntimeError:
        log.exception("unhandled error on GET /api/v2/sharedkeys/%s apikey: %s", shared, key)
    logging.getLogger("uvicorn.access").info(
        '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", f"/api/v2/sharedkeys/{shared}", "1.1", 404
    )
    text = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert "unhandled error" in text
    assert shared not in text
    assert key not in text


def _spellings(key: str) -> list[str]:
    """The shared key's path as a client may spell it: each one reaches the key's route, or is
    close enough that an operator would not expect the key in clear in the log either."""
    encoded = "".join(f"%{ord(c):02X}" for c in key)
    return [
        f"/api/v2/sharedkeys/{key}",
        f"/api/v2/sharedkeys//{key}",
        f"/api/v2//sharedkeys/{key}",
        f"//api/v2/sharedkeys/{key}",
        f"/api/v2/sharedkeys/{key}/",
        f"/api/v2/sharedkeys/{key}//",
        f"/api/v2/sharedkeys%2F{key}",
        f"/api/v2/sharedkeys%2f{key}",
        f"/api/v2/sharedkeys/%2F{key}",
        f"/api/v2/%73haredkeys/{key}",
        f"/api/v2/%73%68%61%72%65%64%6B%65%79%73/{key}",
        f"/api/v2/SharedKeys/{key}",
        f"/api/v2/./sharedkeys/{key}",
        f"/api/v2/sharedkeys/./{key}",
        f"/api/v2/x/../sharedkeys/{key}",
        f"/api/v2/sharedkeys/{key}/..",
        f"/api/v2/sharedkeys/{encoded}",
        f"/api/v2/sharedkeys/{key.upper()}",
        f"/api/v2/sharedkeys/{key}?x=1",
        f"/api/v2/sharedkeys/{key};x",
        f"/api/v2/sharedkeys\\{key}",
        f"/api/v2/sharedkeys/{key}%20",
    ]


@pytest.mark.slow
async def test_a_shared_key_never_reaches_the_access_log_in_clear(db_url: str, tmp_path: Path) -> None:
    """A real server's access log (uvicorn's, as an operator reads it) for every spelling of a shared
    key's path: each line is there, none with the key, in any case or encoding."""
    keys = await make_users(db_url, {"owner": 100, "other": 0})
    overrides: dict[str, dict[str, object]] = {"lease": {"sweep_seconds": 0}, "database": {"null_pool": True}}
    with served(db_url, overrides, tmp_path) as server:
        async with httpx.AsyncClient(base_url=server.base, timeout=30) as http:
            created = await http.post(
                "/api/v2/sharedkeys", json={"kudos": 10}, headers={"apikey": keys["owner"]}
            )
        assert created.status_code == 200, created.text
        shared = created.json()["id"]
        spellings = _spellings(shared)
        reached = 0
        for target in spellings:
            for method in ("GET", "DELETE"):
                headers = {"apikey": keys["other"]} if method == "DELETE" else {}  # refused: not its key
                status, body = await asyncio.to_thread(raw_request, server.port, target, method, headers)
                assert status < 500, (target, status, body[:300])
                reached += method == "GET" and status == 200
        assert reached >= 8, "the spellings no longer reach the key's route: the test walks nothing"
        await asyncio.sleep(0.5)  # the access log goes through a queue listener
        log = server.log.read_text()
    accessed = [line for line in log.splitlines() if "uvicorn.access" in line and "HTTP/1.1" in line]
    assert len(accessed) >= 2 * len(spellings), log[-3000:]
    hidden = shared.lower().replace("-", "")
    for line in accessed:
        for token in (shared, shared.upper(), shared[1:], shared.upper()[1:]):
            assert token not in line, line
        assert hidden not in re.sub(r"[^0-9a-f]", "", line.lower().replace("%", "")), line


async def test_options_allows_every_method_of_every_path(client: HordeClient) -> None:
    """Every route of the app, several handlers on one path included (GET, PATCH and DELETE on a
    shared key): `Allow` lists what the path's handlers serve, as the 405 answer does."""
    walked = 0
    for route in client.http.app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        expected = {m for handler in route.route_handlers for m in handler.http_methods} | {"OPTIONS"}
        path = re.sub(r"\{[^}]+\}", "x", route.path)
        answer = await client.http.options(path)
        assert answer.status_code == 204, (path, answer.status_code, answer.text)
        assert {m.strip() for m in answer.headers["allow"].split(",")} == expected, (
            route.path,
            answer.headers,
        )
        walked += 1
        if "GET" not in expected:  # a method the path lacks: its 405 names the same methods
            refused = await client.http.get(path)
            if refused.status_code == 405:
                assert {m.strip() for m in refused.headers["allow"].split(",")} == expected, route.path
    assert walked >= 30, walked
    shared = await client.http.options("/api/v2/sharedkeys/x")
    assert {"GET", "PATCH", "DELETE"} <= set(shared.headers["allow"].replace(" ", "").split(","))
