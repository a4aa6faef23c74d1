"""The demo's horde: the database migrated and its users written straight into it (what
`horde-lite database upgrade` and `horde-lite users create` do), then `horde-lite run` as a child
process on a free loopback port."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from horde_lite.accounts import kudos as ledger
from horde_lite.accounts.users import create_user
from horde_lite.clock import Clock
from horde_lite.db import migrate
from horde_lite.db.engine import make_engine, make_sessionmaker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def migrate_database(url: str) -> None:
    await asyncio.to_thread(migrate.upgrade, url)  # it runs its own event loop


async def make_users(
    url: str, names: dict[str, float], moderators: tuple[str, ...] = (), *, migrated: bool = False
) -> dict[str, str]:
    """Create each user with its kudos (trusted, so their workers count as trusted; `moderators`
    may read the operator routes), migrating the database first unless it is `migrated`; name -> key."""
    if not migrated:
        await migrate_database(url)
    engine = make_engine(url, null_pool=True)
    keys: dict[str, str] = {}
    try:
        async with make_sessionmaker(engine)() as session, session.begin():
            now = Clock().now()
            for name, kudos in names.items():
                user, key = await create_user(session, name, now, trusted=True, moderator=name in moderators)
                if kudos:
                    await ledger.record(session, user.id, kudos, "grant", "demo", now)
                keys[name] = key
    finally:
        await engine.dispose()
    return keys


def _spawn(database_url: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HORDE_LITE_DATABASE__URL": database_url}
    with log.open("wb") as out:
        # Its own session: Ctrl-C reaches the demo, which stops the fleet before the server.
        return subprocess.Popen(
            [sys.executable, "-m", "horde_lite", "run", "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def _tail(log: Path) -> str:
    return f"(log: {log})\n" + log.read_text(errors="replace")[-2000:]


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    @classmethod
    async def start(
        cls,
        database_url: str,
        log: Path,
        patience: float = 60.0,
        waiting: Callable[[float], None] = lambda seconds: None,
        port: int | None = None,
    ) -> Server:
        """Spawn the server and wait until it answers; `waiting(seconds so far)` is called about
        once a second meanwhile."""
        port = port or free_port()
        process = _spawn(database_url, port, log)
        server = cls(process, f"http://127.0.0.1:{port}", log)
        started = time.monotonic()
        deadline = started + patience
        told = 0
        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                if int(time.monotonic() - started) > told:
                    told = int(time.monotonic() - started)
                    waiting(time.monotonic() - started)
                if process.poll() is not None:
                    raise RuntimeError(f"the server exited early:\n{_tail(log)}")
                try:
                    if (await http.get(f"{server.url}/api/v2/status/heartbeat")).status_code == 200:
                        return server
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    server.stop()
                    raise RuntimeError(f"the server did not answer within {patience:g} s (log: {log})")
                await asyncio.sleep(0.2)

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
