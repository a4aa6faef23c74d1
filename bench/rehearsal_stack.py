"""The rehearsal's infrastructure: PgBouncer in front of a throwaway PostgreSQL server and HAProxy in
front of the `horde-lite run` processes, each started from a generated configuration in a temp
directory, on loopback ports, and stopped by the rehearsal (bench/rehearsal.py). PgBouncer is
tests/support/pgbouncer.py's, with the rehearsal's settings.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.soak_servers import LOOPBACK, STOP_TIMEOUT, Server, free_port
from tests.support.pgbouncer import Bouncer, find_pgbouncer
from tests.support.postgres import ThrowawayServer

HAPROXY = "/usr/sbin/haproxy"
# PgBouncer's server connections: the hosts' pools share them.
PGBOUNCER_POOL = 40
START_TIMEOUT = 30.0
HEARTBEAT = "/api/v2/status/heartbeat"
# Longer than any call the load makes: a /v1 call waiting for its answer, a waiting pop (20 s).
PROXY_TIMEOUT_SECONDS = 90
SERVED_BY = "X-Served-By"


async def wait_for_port(port: int, process: subprocess.Popen[bytes], what: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"rehearsal: {what} exited at start; see {log}:\n{_tail(log)}")
        try:
            _, writer = await asyncio.open_connection(LOOPBACK, port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise SystemExit(f"rehearsal: {what} did not listen within {START_TIMEOUT:.0f} s; see {log}")


def missing_binaries() -> list[str]:
    """The stack's programs not installed, each with its Debian package."""
    missing = [] if find_pgbouncer() else ["pgbouncer (apt-get install pgbouncer)"]
    if not os.access(HAPROXY, os.X_OK):
        missing.append(f"{HAPROXY} (apt-get install haproxy)")
    return missing


def pgbouncer_for(postgres: ThrowawayServer) -> Bouncer:
    """PgBouncer in front of `postgres` (not started), set as docs/reference/operators.md advises:
    after a failed login (the server restarting) it tries again in a second, not PgBouncer's
    default 15."""
    return Bouncer(postgres.url(), pool_size=PGBOUNCER_POOL, login_retry=1)


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"


def _stop(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(STOP_TIMEOUT)


@dataclass
class Proxy:
    """HAProxy round robin over the servers, with health checks; an endpoint of the soak's `Cluster`
    (`killed_at`: the last SIGKILL of a server behind it, which explains the proxy's 502s)."""

    servers: list[Server]
    directory: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    up: bool = True
    incarnation: int = 0
    killed_at: float = float("-inf")

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def socket(self) -> Path:
        return self.directory / "haproxy.sock"

    def config(self) -> str:
        t = PROXY_TIMEOUT_SECONDS
        lines = [
            "global",
            "    maxconn 4000",
            f"    stats socket {self.socket} mode 600 level admin",
            "defaults",
            "    mode http",
            "    timeout connect 2s",
            f"    timeout client {t}s",
            f"    timeout server {t}s",
            "    timeout http-request 10s",
            "    timeout http-keep-alive 10s",
            # A connection refused by a dead server is tried again, on another server.
            "    retries 3",
            "    option redispatch",
            # A new server connection per call: never one the server is closing (uvicorn's keep-alive).
            "    option http-server-close",
            "frontend horde",
            f"    bind {LOOPBACK}:{self.port}",
            "    default_backend hosts",
            "backend hosts",
            "    balance roundrobin",
            f"    option httpchk GET {HEARTBEAT}",
            "    http-check expect status 200",
            "    default-server inter 500ms fall 2 rise 2",
            f"    http-response set-header {SERVED_BY} %s",
        ]
        lines += [f"    server host{s.index} {LOOPBACK}:{s.port} check" for s in self.servers]
        return "\n".join(lines) + "\n"

    async def start(self) -> None:
        cfg = self.directory / "haproxy.cfg"
        cfg.write_text(self.config())
        log = self.directory / "haproxy.log"
        with log.open("wb") as out:
            self.process = subprocess.Popen(  # noqa: ASYNC220 (starting it takes no time)
                [HAPROXY, "-db", "-f", str(cfg)], stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        await wait_for_port(self.port, self.process, "haproxy", log)
        deadline = time.monotonic() + START_TIMEOUT
        while set((await self.states()).values()) != {"UP"}:
            if time.monotonic() > deadline:
                raise SystemExit(f"rehearsal: haproxy never saw every server up: {await self.states()}")
            await asyncio.sleep(0.1)

    async def states(self) -> dict[str, str]:
        """Each server's state as the health checks see it ("UP", "DOWN", "UP 1/2", ...)."""
        reader, writer = await asyncio.open_unix_connection(str(self.socket))
        try:
            writer.write(b"show stat\n")
            await writer.drain()
            text = (await reader.read()).decode()
        finally:
            writer.close()
        states: dict[str, str] = {}
        for line in text.splitlines():
            cols = line.split(",")
            if len(cols) > 17 and cols[0] == "hosts" and cols[1].startswith("host"):
                states[cols[1]] = cols[17]
        return states

    async def wait_state(self, server: Server, state: str, limit: float) -> float | None:
        """Seconds until the proxy sees `server` in `state`; None if not within `limit`."""
        start = time.monotonic()
        while time.monotonic() - start < limit:
            if (await self.states()).get(f"host{server.index}") == state:
                return time.monotonic() - start
            await asyncio.sleep(0.05)
        return None

    def stop(self) -> None:
        _stop(self.process)
