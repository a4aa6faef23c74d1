"""The rehearsal's stack (bench/rehearsal_stack.py): PgBouncer in transaction pooling mode in front
of a throwaway PostgreSQL server that is restarted under it, and HAProxy's health checks taking a
SIGKILLed host out of rotation and back in once it is restarted. Skipped without pgbouncer or
haproxy, failed instead when HORDE_LITE_REQUIRE_PGBOUNCER is set (CI installs both)."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from bench.rehearsal_stack import HEARTBEAT, SERVED_BY, Proxy, missing_binaries, pgbouncer_for
from bench.soak_servers import LOOPBACK, Server, free_port, server_env
from tests.support.pgbouncer import Bouncer, skip_or_fail
from tests.support.postgres import ThrowawayServer


@pytest.fixture(autouse=True)
def _stack_installed() -> None:
    missing = missing_binaries()
    if missing:
        skip_or_fail(f"the rehearsal's stack needs {', '.join(missing)}")


@pytest.fixture
def throwaway() -> Iterator[ThrowawayServer]:
    pg = ThrowawayServer.create()
    if isinstance(pg, str):
        skip_or_fail(pg)
    yield pg
    pg.stop()


async def _backend_through(bouncer: Bouncer) -> int:
    """The PostgreSQL backend serving a fresh connection through PgBouncer (retried while the
    server comes back)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            # No prepared statements: PgBouncer's transaction mode may hand each one another backend.
            conn = await asyncpg.connect(host=LOOPBACK, port=bouncer.port, user="postgres",
                                         database="postgres", statement_cache_size=0, timeout=5)  # fmt: skip
            try:
                return int(await conn.fetchval("SELECT pg_backend_pid()"))
            finally:
                await conn.close()
        except (OSError, asyncpg.PostgresError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def _postmaster_pid(pg: ThrowawayServer) -> int:
    return int(Path(pg.data, "postmaster.pid").read_text().splitlines()[0])


@pytest.mark.postgres_only  # a throwaway PostgreSQL server behind PgBouncer
async def test_pgbouncer_serves_again_after_a_fast_restart_of_postgres(throwaway: ThrowawayServer) -> None:
    pg = throwaway
    bouncer = pgbouncer_for(pg)
    try:
        await asyncio.to_thread(pg.start)
        await asyncio.to_thread(bouncer.start)
        ini = bouncer.ini.read_text()
        assert "pool_mode = transaction" in ini
        assert "server_login_retry = 1" in ini
        before, postmaster = await _backend_through(bouncer), _postmaster_pid(pg)

        await asyncio.to_thread(pg.restart)

        assert _postmaster_pid(pg) != postmaster  # a real restart: a new server process
        after = await _backend_through(bouncer)
        assert after != before
    finally:
        await asyncio.to_thread(bouncer.stop)
        await asyncio.to_thread(pg.stop)
    assert not await asyncio.to_thread(os.path.exists, pg.root)
    assert not await asyncio.to_thread(os.path.exists, bouncer.root)


@pytest.mark.slow
async def test_the_proxy_drops_a_killed_host_and_takes_it_back(sqlite_template: Path, tmp_path: Path) -> None:
    path = tmp_path / "horde_lite.db"
    shutil.copy(sqlite_template, path)
    env = server_env(f"sqlite+aiosqlite:///{path}", {})
    servers = [Server(i, free_port(), tmp_path, env) for i in range(2)]
    proxy = Proxy(servers, tmp_path)
    try:
        await asyncio.gather(*(s.start() for s in servers))
        await proxy.start()
        assert await proxy.states() == {"host0": "UP", "host1": "UP"}
        async with httpx.AsyncClient(base_url=proxy.base_url, timeout=10) as http:
            served = [(await http.get(HEARTBEAT)).headers[SERVED_BY] for _ in range(4)]
            assert sorted(set(served)) == ["host0", "host1"]  # round robin

            servers[1].kill()
            assert await proxy.wait_state(servers[1], "DOWN", 10) is not None
            answers = [await http.get(HEARTBEAT) for _ in range(4)]
            assert [(r.status_code, r.headers[SERVED_BY]) for r in answers] == [(200, "host0")] * 4

            await servers[1].start()
            assert await proxy.wait_state(servers[1], "UP", 10) is not None
            served = [(await http.get(HEARTBEAT)).headers[SERVED_BY] for _ in range(4)]
            assert sorted(set(served)) == ["host0", "host1"]
    finally:
        proxy.stop()
        for server in servers:
            server.stop()
