"""Helpers for the chat tests (no tests here): a streaming in-process transport, a chat worker
driven over HTTP, and the app with its lifespan run in the test's own event loop.

Why not the conftest's AsyncTestClient: it runs the app through a blocking portal in another
thread and returns a response only once the app has sent all of it, and its `await` blocks the
test's event loop meanwhile. A chat client waits for a worker, so the worker must run while the
client waits, and a stream must be readable (and closable) before it ends. The transport below
runs the app as a task in the test's loop, hands back the response as soon as its headers are
sent, streams the body as the app sends it, and turns closing the response early into the ASGI
`http.disconnect` a real server sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import openai
from litestar import Litestar
from sqlalchemy import func, select

from horde_lite.clock import ManualClock
from horde_lite.core.context import Horde
from horde_lite.db.models import Generation, KudosHold, TextRequest
from horde_lite.settings import Settings
from tests.support.apps import app_for
from tests.support.horde import ANON, HordeClient

BASE = "http://testserver.local"
# Wall-clock seconds a helper waits for something another task does (a request to appear, a job
# to be offered) before failing the test: a guard against hangs, never a measure of speed.
PATIENCE = 60.0
MODEL = "acme/chat-8B"
T = TypeVar("T")
U = TypeVar("U")
CHAT_BLOCK: dict[str, Any] = {
    "max_completion_tokens": 2048,
    "max_context_tokens": 8192,
    "features": ["tools", "json_schema"],
    "image_transports": [],
}


# --- transport ---------------------------------------------------------------------------------


class _Exchange:
    def __init__(self, body: bytes) -> None:
        self.body = body
        self.body_sent = False
        self.started = asyncio.Event()
        self.closed = asyncio.Event()  # the response ended or the client went away
        self.complete = False
        self.gone = False
        self.status = 500
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None

    async def receive(self) -> dict[str, Any]:
        if not self.body_sent:
            self.body_sent = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.closed.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if self.gone:
            return  # like a server writing to a closed connection
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = list(message.get("headers", []))
            self.started.set()
        elif message["type"] == "http.response.body":
            chunk = message.get("body", b"")
            if chunk:
                self.chunks.put_nowait(chunk)
            if not message.get("more_body", False):
                self.complete = True
                self.closed.set()
                self.chunks.put_nowait(None)

    def disconnect(self) -> None:
        self.gone = True
        self.closed.set()

    async def finish(self) -> None:
        """Wait for the app to finish (its clean-up included) and surface an escaped exception."""
        assert self.task is not None
        await asyncio.wait_for(asyncio.shield(self.task), 30)


class _Body(httpx.AsyncByteStream):
    def __init__(self, exchange: _Exchange) -> None:
        self.exchange = exchange

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self.exchange.chunks.get()
            if chunk is None:
                break
            yield chunk
        task = self.exchange.task
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]

    async def aclose(self) -> None:
        if not self.exchange.complete:
            self.exchange.disconnect()
        await self.exchange.finish()


class StreamingASGITransport(httpx.AsyncBaseTransport):
    """Runs the ASGI app in the caller's loop; streams responses; closing early disconnects."""

    def __init__(self, app: Litestar) -> None:
        self.app = app
        self.tasks: set[asyncio.Task[None]] = set()

    async def aclose(self) -> None:
        """Cancel what is still running in the app (a test that failed midway), then wait for it."""
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            with contextlib.suppress(BaseException):
                await task

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": request.url.scheme,
            "path": request.url.path,
            "raw_path": request.url.raw_path.split(b"?")[0],
            "query_string": request.url.query,
            "root_path": "",
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "client": ("127.0.0.1", 50000),
            "server": (request.url.host, request.url.port or 80),
        }
        exchange = _Exchange(body)
        task = asyncio.create_task(self.app(scope, exchange.receive, exchange.send))  # type: ignore[arg-type]
        exchange.task = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        task.add_done_callback(lambda _t: exchange.chunks.put_nowait(None))
        started = asyncio.create_task(exchange.started.wait())
        try:
            await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the client gave up before the answer started
            exchange.disconnect()
            await exchange.finish()
            raise
        finally:
            started.cancel()
        if not exchange.started.is_set():
            task.result()  # an exception that escaped the app
            raise AssertionError("the app ended without starting a response")
        return httpx.Response(
            exchange.status, headers=exchange.headers, stream=_Body(exchange), request=request
        )


# --- the app and its clients -------------------------------------------------------------------


@dataclass
class Chat:
    """The app under test with an HTTP client, the horde helpers and OpenAI clients."""

    app: Litestar
    http: httpx.AsyncClient
    hc: HordeClient
    transport: StreamingASGITransport

    def handlers(self) -> set[asyncio.Task[None]]:
        """The app's calls still running (each a task, as a server runs them)."""
        return set(self.transport.tasks)

    @property
    def horde(self) -> Horde:
        return self.hc.horde

    @property
    def clock(self) -> ManualClock:
        return self.hc.clock

    def openai(self, key: str = ANON) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{BASE}/v1",
            api_key=key,
            http_client=self.http,
            max_retries=0,
            _strict_response_validation=True,
        )

    def worker(self, key: str, name: str, **declarations: Any) -> ChatWorker:
        return ChatWorker(self.hc, key, name, declarations)

    async def requests(self) -> list[TextRequest]:
        async with self.horde.sessionmaker() as session:
            return list(
                (await session.execute(select(TextRequest).order_by(TextRequest.created_at))).scalars()
            )

    async def request(self, request_id: str) -> TextRequest:
        async with self.horde.sessionmaker() as session:
            row = await session.get(TextRequest, request_id)
            assert row is not None
            return row

    async def generations(self, request_id: str) -> list[Generation]:
        """The request's generations by pop time; those popped at one instant of the clock in any order."""
        async with self.horde.sessionmaker() as session:
            query = (
                select(Generation).where(Generation.request_id == request_id).order_by(Generation.popped_at)
            )
            return list((await session.execute(query)).scalars())

    async def active_holds(self) -> int:
        async with self.horde.sessionmaker() as session:
            query = select(func.count(KudosHold.key)).where(KudosHold.active.is_(True))
            return int((await session.execute(query)).scalar_one())

    async def until_request(self, predicate: Callable[[TextRequest], bool] | None = None) -> TextRequest:
        """The newest request once one exists (and matches): the front creates it concurrently."""
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            rows = await self.requests()
            if rows and (predicate is None or predicate(rows[-1])):
                return rows[-1]
            await asyncio.sleep(0.02)
        raise AssertionError("the chat front never created the request")


@asynccontextmanager
async def open_chat(settings: Settings, clock: ManualClock) -> AsyncIterator[Chat]:
    app = app_for(settings, clock)
    ready, stop = asyncio.Event(), asyncio.Event()

    async def lifespan() -> None:  # entered and exited in one task, as anyio's cancel scopes need
        async with app.lifespan():
            ready.set()
            await stop.wait()

    running = asyncio.create_task(lifespan())
    waiting = asyncio.create_task(ready.wait())
    await asyncio.wait({running, waiting}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if running.done():
        running.result()
    transport = StreamingASGITransport(app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url=BASE, timeout=60) as http:
            yield Chat(app, http, HordeClient(http, app.state.horde), transport)  # type: ignore[arg-type]
    finally:
        await transport.aclose()
        stop.set()
        await running


# --- a chat worker over HTTP -------------------------------------------------------------------


@dataclass
class ChatWorker:
    hc: HordeClient
    key: str
    name: str
    declarations: dict[str, Any]
    jobs: list[dict[str, Any]] = field(default_factory=list)

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "models": [MODEL],
            "max_length": 512,
            "max_context_length": 4096,
            "chat": dict(CHAT_BLOCK),
        }
        out.update(self.declarations)
        return out

    async def pop(self) -> dict[str, Any]:
        response = await self.hc.pop(self.key, self.name, **self.body())
        assert response.status_code == 200, response.text
        job = response.json()
        if job.get("id"):
            self.jobs.append(job)
        return job

    async def pop_job(self) -> dict[str, Any]:
        """Pop until a job comes (the request under test is being created concurrently)."""
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            job = await self.pop()
            if job.get("id"):
                return job
            await asyncio.sleep(0.02)
        raise AssertionError(f"{self.name} never got a job")

    async def progress(
        self,
        gen_id: str,
        seq: int,
        content: str | None = None,
        *,
        tool_calls: list[dict[str, Any]] | None = None,
        completion_tokens: int | None = None,
        key: str | None = None,
    ) -> httpx.Response:
        delta: dict[str, Any] = {}
        if content is not None:
            delta["content"] = content
        if tool_calls is not None:
            delta["tool_calls"] = tool_calls
        body: dict[str, Any] = {"id": gen_id, "seq": seq, "delta": delta}
        if completion_tokens is not None:
            body["completion_tokens"] = completion_tokens
        return await self.hc.http.post(
            "/api/v2/generate/text/progress", json=body, headers={"apikey": key or self.key}
        )

    async def submit(
        self,
        gen_id: str,
        content: str | None,
        *,
        tool_calls: list[dict[str, Any]] | None = None,
        finish_reason: str = "stop",
        usage: dict[str, int] | None = None,
        state: str = "ok",
    ) -> httpx.Response:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls is not None:
            message["tool_calls"] = tool_calls
        chat: dict[str, Any] = {"message": message, "finish_reason": finish_reason}
        if usage is not None:
            chat["usage"] = usage
        return await self.hc.submit(self.key, gen_id, content or "", state=state, chat=chat)

    async def serve(self, reply: str | Callable[[dict[str, Any]], str], *, parts: int = 3) -> dict[str, Any]:
        """Take one job and answer it: streamed in `parts` progress posts when it streams."""
        job = await self.pop_job()
        assert job["kind"] == "chat", job
        text = reply(job) if callable(reply) else reply
        if job["stream"]:
            cuts = [math.floor(len(text) * i / parts) for i in range(parts + 1)]
            for seq, (a, b) in enumerate(itertools.pairwise(cuts), start=1):
                answer = await self.progress(job["id"], seq, text[a:b], completion_tokens=math.ceil(b / 4))
                assert answer.status_code == 200, answer.text
        submitted = await self.submit(
            job["id"], text, usage={"prompt_tokens": 11, "completion_tokens": math.ceil(len(text) / 4)}
        )
        assert submitted.status_code == 200, submitted.text
        return job


async def gather_stream(stream: Any) -> tuple[list[Any], BaseException | None]:
    """Every chunk of an openai AsyncStream, and the exception that ended it, if any."""
    chunks: list[Any] = []
    try:
        async with asyncio.timeout(PATIENCE * 2):  # a hang guard: the stream must end
            async for chunk in stream:
                chunks.append(chunk)
    except Exception as e:
        return chunks, e
    return chunks, None


async def text_until(parts: AsyncIterator[str], marker: str) -> str:
    """Read a streamed body (`response.aiter_text()`) until it holds `marker`, so a test knows the
    front has relayed it before the worker goes on; read the rest from the same iterator."""
    text = ""
    async with asyncio.timeout(PATIENCE * 2):  # a hang guard: the marker must come
        async for part in parts:
            text += part
            if marker in text:
                return text
    raise AssertionError(f"the stream ended without {marker!r}: {text!r}")


async def collect(call: Awaitable[Any]) -> tuple[list[Any], BaseException | None]:
    """Open a stream (an openai `create(stream=True)` call) and gather it."""
    return await gather_stream(await call)


def joined(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


async def along(call: Awaitable[T], work: Awaitable[U]) -> tuple[T, U]:
    """Run a client call and a worker's work side by side and return both results. If either
    fails the other is cancelled (a worker that never got its job must not leave the client
    waiting forever)."""
    first, second = asyncio.ensure_future(call), asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait(
            {first, second}, timeout=PATIENCE * 2, return_when=asyncio.FIRST_EXCEPTION
        )
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        if len(done) < 2:
            raise AssertionError("the client call or the worker never finished")
        return first.result(), second.result()
    finally:
        for task in (first, second):
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task


async def settled(task: Awaitable[T]) -> T:
    """Await something that must end (a hang guard, not a speed check)."""
    return await asyncio.wait_for(task, PATIENCE * 2)


async def in_background(awaitable: Awaitable[Any]) -> asyncio.Task[Any]:
    task = asyncio.ensure_future(awaitable)
    await asyncio.sleep(0)
    return task
