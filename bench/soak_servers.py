"""The soak's server side: a fresh database, users set up as the operator's CLI would, and real
`horde-lite run` processes on loopback ports that can be SIGKILLed and restarted.

Everything is bounded: each start waits at most `START_TIMEOUT` seconds for the heartbeat.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
import msgspec
from sqlalchemy.engine import make_url

from horde_lite.db import migrate
from horde_lite.settings import Settings

START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
LOOPBACK = "127.0.0.1"
REFUSED_DATABASES = {"postgres", "template0", "template1"}


def is_postgres(url: str) -> bool:
    return url.startswith("postgresql")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


async def fresh_bench_database(db: str, pg_url: str, database: str, work: Path, filename: str) -> str:
    """A migrated, empty database for one bench run: `database` recreated on `pg_url`'s server
    (`db` "postgresql"), else a SQLite file `filename` in `work`; its URL."""
    if db == "postgresql":
        url = make_url(pg_url).set(database=database).render_as_string(hide_password=False)
        await fresh_postgres(url)
    else:
        url = f"sqlite+aiosqlite:///{work / filename}"
    await asyncio.to_thread(migrate.upgrade, url)
    return url


async def fresh_postgres(url: str) -> None:
    """Drop and recreate the database the URL names (the soak's own, never a shared one)."""
    parsed = make_url(url)
    name = parsed.database
    if not name or name in REFUSED_DATABASES:
        raise SystemExit(
            f"soak: name a database of its own in --db (got {name!r}); it is dropped and recreated"
        )
    if parsed.host not in (None, "localhost", LOOPBACK, "::1"):
        raise SystemExit(f"soak: loopback PostgreSQL only (got host {parsed.host})")
    where = dict(
        host=parsed.host or LOOPBACK, port=parsed.port or 5432, user=parsed.username, password=parsed.password
    )
    admin = await asyncpg.connect(database="postgres", timeout=10, **where)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()


async def terminate_connections(url: str) -> int:
    """pg_terminate_backend every connection to the soak's database but this one; returns how many."""
    parsed = make_url(url)
    conn = await asyncpg.connect(
        host=parsed.host or LOOPBACK, port=parsed.port or 5432, user=parsed.username,
        password=parsed.password, database="postgres", timeout=10,
    )  # fmt: skip
    try:
        killed = await conn.fetchval(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid()) AS t",
            parsed.database,
        )
        return int(killed or 0)
    finally:
        await conn.close()


# The benches' fleets give one owner many workers and keys, and their requests many pops: the
# per-user limits and the rate limits, which guard a public horde, would measure themselves.
LIMITS_OFF: dict[str, dict[str, object]] = {
    "ratelimit": {"create_per_minute": 0, "status_per_minute": 0},
    "worker": {"max_per_user": 0, "max_per_trusted_user": 0, "owner_failure_limit": 0},
    "sharedkeys": {"max_per_user": 0, "max_per_trusted_user": 0},
}


def server_env(db_url: str, overrides: dict[str, dict[str, object]]) -> dict[str, str]:
    """The servers' environment: the database and short leases, sweeps and expiries; only keys the
    installed settings know are set (an unknown one would stop start-up)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORDE_LITE_")}
    env["HORDE_LITE_DATABASE__URL"] = db_url
    known = {f.name: f.type for f in msgspec.structs.fields(Settings)}
    for table, values in overrides.items():
        if table not in known:
            continue
        fields = {f.name for f in msgspec.structs.fields(known[table])}
        for key, value in values.items():
            if key in fields:
                env[f"HORDE_LITE_{table.upper()}__{key.upper()}"] = (
                    str(value).lower() if isinstance(value, bool) else str(value)
                )
    return env


# How a server process is started: `horde-lite run` (Litestar's run: uvicorn, with uvloop and
# httptools when installed, as litestar[standard] installs them), or the same app under a named
# server stack, to compare them (bench/perf.py --stacks).
STACKS = ("horde-lite", "uvicorn-uvloop-httptools", "uvicorn-asyncio-h11", "granian")
_FACTORY = "horde_lite.app:create_app"


def server_command(port: int, stack: str = "horde-lite", python: str = sys.executable) -> list[str]:
    """`python`: the interpreter (and so the installed packages and entry points) the server runs."""
    where = ["--host", LOOPBACK, "--port", str(port)]
    if stack == "horde-lite":
        cli = Path(python).with_name("horde-lite")
        if cli.exists():
            return [str(cli), "run", *where]
        return [python, "-m", "litestar", "--app", _FACTORY, "run", *where]
    if stack.startswith("uvicorn-"):
        loop, http = stack.split("-")[1:]
        return [
            python,
            "-m",
            "uvicorn",
            "--factory",
            _FACTORY,
            "--loop",
            loop,
            "--http",
            http,
            *where,
        ]
    if stack == "granian":  # not a dependency: `pip install granian` to compare it
        return [python, "-m", "granian", "--interface", "asgi", "--factory", "--loop", "uvloop",
                *where, _FACTORY]  # fmt: skip
    raise ValueError(f"unknown server stack {stack!r}; one of {', '.join(STACKS)}")


@dataclass
class Server:
    """One server process on a fixed port; `incarnation` grows at each kill, so a call can tell that
    the process it was talking to died under it."""

    index: int
    port: int
    workdir: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    incarnation: int = 0
    up: bool = False
    killed_at: float = float("-inf")  # monotonic time of the last SIGKILL
    logs: list[Path] = field(default_factory=list)
    stack: str = "horde-lite"
    python: str = sys.executable
    command: list[str] | None = None  # a command of its own instead of the stack's (bench/cycle_floor.py)

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    async def start(self) -> None:
        log = self.workdir / f"server-{self.index}-{self.incarnation}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            command = self.command or server_command(self.port, self.stack, self.python)
            self.process = subprocess.Popen(  # noqa: ASYNC220 (starting it takes no time)
                command, cwd=self.workdir, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        async with httpx.AsyncClient(timeout=2) as http:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise SystemExit(
                        f"soak: server {self.index} exited at start; see {log}:\n{log.read_text()[-3000:]}"
                    )
                try:
                    if (await http.get(f"{self.base_url}/api/v2/status/heartbeat")).status_code == 200:
                        self.up = True
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.2)
        raise SystemExit(f"soak: server {self.index} did not answer within {START_TIMEOUT:.0f} s; see {log}")

    def kill(self) -> None:
        """SIGKILL the whole process group: no clean-up, no goodbye, as a crash."""
        assert self.process is not None
        self.up = False
        self.incarnation += 1
        self.killed_at = time.monotonic()
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(STOP_TIMEOUT)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.up = False
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(STOP_TIMEOUT)

    def log_lines(self, needle: str) -> list[str]:
        found: list[str] = []
        for log in self.logs:
            if log.exists():
                found += [line for line in log.read_text(errors="replace").splitlines() if needle in line]
        return found
