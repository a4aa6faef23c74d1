"""The rehearsal's stack (bench/rehearsal_stack.py): PgBouncer in transaction pooling mode in front
of a throwaway PostgreSQL server that is restarted under it, and HAProxy's health checks taking a
SIGKILLed host out of rotation and back in once it is restarted."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import asyncpg
import httpx
import pytest

from bench.rehearsal_stack import HAPROXY, HEARTBEAT, PGBOUNCER, SERVED_BY, PgBouncer, Proxy
from bench.soak_servers import LOOPBACK, Server, free_port, server_env
from tests.support.postgres import ThrowawayServer

pytestmark = pytest.mark.skipif(
    not (os.access(PGBOUNCER, os.X_OK) and os.access(HAPROXY, os.X_OK)),
    reason=f"needs {PGBOUNCER} and {HAPROXY} (Debian's pgbouncer and haproxy packages)",
)


async def _backend_through(bouncer: PgBouncer) -> int:
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


async def test_pgbouncer_serves_again_after_a_fast_restart_of_postgres() -> None:
    pg = ThrowawayServer.create()
    if isinstance(pg, str):
        pytest.skip(pg)
    bouncer = PgBouncer(pg)
    try:
        await asyncio.to_thread(pg.start)
        await bouncer.start()
        assert "pool_mode = transaction" in (bouncer.directory / "pgbouncer.ini").read_text()
        before, postmaster = await _backend_through(bouncer), _postmaster_pid(pg)

        await asyncio.to_thread(pg.restart)

        assert _postmaster_pid(pg) != postmaster  # a real restart: a new server process
        after = await _backend_through(bouncer)
        assert after != before
    finally:
        bouncer.stop()
        await asyncio.to_thread(pg.stop)
    assert not await asyncio.to_thread(os.path.exists, pg.root)


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
