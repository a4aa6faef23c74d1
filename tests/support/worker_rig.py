"""The worker tests' rig (no tests here): the real horde_lite app served by uvicorn on a free
loopback port, the fake backend, a proxy in between the worker and the horde, users, and real
`Worker`s running as tasks in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

from horde_lite.app import create_app
from horde_lite.demo.server import make_users
from horde_lite.worker.backends.openai import OpenAIBackend
from horde_lite.worker.config import WorkerConfig
from horde_lite.worker.runner import Worker
from tests.conftest import make_settings
from tests.support.fake_backend import FakeBackend, Served
from tests.support.horde_proxy import HordeProxy

MODEL = "test/chat-7B"
PATIENCE = 30.0  # a hang guard, not a speed check


async def request_status(http: httpx.AsyncClient, request_id: str) -> dict[str, Any]:
    """The horde API's status of a request (`http`: a client on the horde's base URL)."""
    response = await http.get(f"/api/v2/generate/text/status/{request_id}")
    assert response.status_code == 200, response.text
    return response.json()


async def until_done(
    http: httpx.AsyncClient, request_id: str, context: Callable[[], str] = str
) -> dict[str, Any]:
    """The request's status once it is done or faulted; `context()` is added to a timeout's message."""
    deadline = time.monotonic() + PATIENCE
    while not ((status := await request_status(http, request_id))["done"] or status["faulted"]):
        assert time.monotonic() < deadline, f"request {request_id} never finished: {status} {context()}"
        await asyncio.sleep(0.05)
    return status


async def leave_after_first_content(stream: Any) -> str:
    """Read an openai chat stream until its first content, then close it: a client that leaves
    mid-stream. Returns what it saw."""
    seen = ""
    async for chunk in stream:
        seen += (chunk.choices[0].delta.content or "") if chunk.choices else ""
        if seen:
            break
    await stream.close()
    return seen


@dataclass
class Rig:
    horde_url: str
    proxy: HordeProxy
    proxy_url: str
    backend: FakeBackend
    backend_url: str
    key: str
    http: httpx.AsyncClient

    def worker(self, name: str, *, backend_url: str | None = None, **overrides: Any) -> Worker:
        config = WorkerConfig(
            horde=self.proxy_url, key=self.key, name=name, models=[MODEL], progress_interval=0.1,
            drain_seconds=5.0, handle_signals=False, **overrides,
        )  # fmt: skip
        return Worker(config, OpenAIBackend(backend_url or self.backend_url, timeout=10.0))

    def openai(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.horde_url}/v1", api_key=self.key, max_retries=0)

    async def status(self, request_id: str) -> dict[str, Any]:
        return await request_status(self.http, request_id)

    async def until_done(self, request_id: str) -> dict[str, Any]:
        return await until_done(self.http, request_id)

    async def online(self, name: str) -> None:
        """Wait for the worker's first pop (a /v1 request for a model nobody serves is a 404)."""
        deadline = time.monotonic() + PATIENCE
        while await self.worker_record(name) is None:
            assert time.monotonic() < deadline, f"{name} never popped"
            await asyncio.sleep(0.05)

    async def worker_record(self, name: str) -> dict[str, Any] | None:
        workers = (await self.http.get("/api/v2/workers")).json()
        return next((w for w in workers if w["name"] == name), None)


async def until(condition: Callable[[], bool]) -> None:
    """Wait for something another task or thread does (a hang guard, not a speed check)."""
    deadline = time.monotonic() + PATIENCE
    while not condition():  # set by other threads: no asyncio.Event to wait on
        assert time.monotonic() < deadline, "waited too long"
        await asyncio.sleep(0.05)


@contextmanager
def served_horde(db_url: str) -> Iterator[str]:
    settings = make_settings(db_url)
    with Served(create_app(settings)) as served:
        yield served.url


@asynccontextmanager
async def rig(horde_url: str, db_url: str) -> AsyncIterator[Rig]:
    keys = await make_users(db_url, {"volunteer": 0})
    backend = FakeBackend()
    proxy = HordeProxy(horde_url)
    with Served(backend) as b, Served(proxy) as p:
        async with httpx.AsyncClient(base_url=horde_url, timeout=PATIENCE) as http:
            yield Rig(horde_url, proxy, p.url, backend, b.url, keys["volunteer"], http)


@asynccontextmanager
async def sqlite_rig(tmp_path: Path, sqlite_template: Path) -> AsyncIterator[Rig]:
    """The rig on a fresh copy of the migrated SQLite template (the worker is database-agnostic)."""
    path = tmp_path / "horde.db"
    shutil.copy(sqlite_template, path)
    url = f"sqlite+aiosqlite:///{path}"
    with served_horde(url) as horde_url:
        async with rig(horde_url, url) as r:
            yield r


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[int]]:
    """The worker runs while the block does; it is stopped (and must stop cleanly) after."""
    task = asyncio.create_task(worker.run())
    try:
        yield task
    finally:
        worker.stop()
        with contextlib.suppress(asyncio.CancelledError):
            code = await asyncio.wait_for(task, PATIENCE)
            assert code == 0, worker.fatal
