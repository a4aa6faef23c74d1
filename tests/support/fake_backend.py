"""A fake OpenAI-compatible model server for the worker tests (no tests here), and a way to serve
any ASGI app on a free loopback port from a thread.

`FakeBackend` streams like llama.cpp's llama-server: `data: {json}\\n\\n` chat.completion.chunk
events, a chunk with the finish_reason, a usage chunk (`choices: []`), then `data: [DONE]`. What
it does is chosen by the last user message:

- `"hold"`: stream HOLD_TOKENS tokens, wait until the test calls `release()`, then the rest, slowly;
- `"tools"`: a tool call of the first tool, its arguments in fragments;
- `"fail"`: HTTP 500;
- anything else: TOKENS tokens at once.

A legacy prompt is answered with LEGACY_TEXT and its `usage` (LEGACY_USAGE), as llama-server
answers; `"ramble"` with more text than any job allows (RAMBLE, RAMBLE_TOKENS by its count);
`"mute"` with LEGACY_TEXT and no `usage`. With `context=None` it says nothing of its context (no
`/props`), as llama-cpp-python's server.

It records every request body, and whether a stream was closed by the client before it ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn

TOKENS = ["Once", " upon", " a", " time", ",", " a", " horde", " hummed", "."]
HOLD_TOKENS = 3
AFTER_HOLD_PAUSE = 0.1
TOOL_ARGS = '{"city": "Paris", "days": 2}'
LEGACY_TEXT = " and they all lived happily ever after."
RAMBLE = LEGACY_TEXT * 4  # 156 characters: 39 tokens by the horde's count
# Its counts of a legacy answer (the horde's own: 10 tokens for LEGACY_TEXT, from its characters).
LEGACY_USAGE = {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}
RAMBLE_TOKENS = 36
CONTEXT = 8192
MODEL_ID = "fake-model.gguf"

Scope = dict[str, Any]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def lifespan(receive: Any, send: Any) -> None:
    """Answer an ASGI lifespan scope (start-up and shutdown need nothing here)."""
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})


async def read_body(receive: Any) -> bytes:
    raw = b""
    while True:
        message = await receive()
        raw += message.get("body", b"")
        if not message.get("more_body"):
            return raw


@dataclass
class FakeBackend:
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    closed_early: int = 0  # streams the client closed before they ended
    finished: int = 0  # streams sent to the end
    gate: threading.Event = field(default_factory=threading.Event)
    context: int | None = CONTEXT

    def release(self) -> None:
        self.gate.set()

    def bodies(self, path: str) -> list[dict[str, Any]]:
        return [body for p, body in self.requests if p == path]

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        raw = await read_body(receive)
        body = json.loads(raw) if raw else {}
        path = scope["path"]
        self.requests.append((path, body))
        if path == "/v1/models":
            await _json(send, 200, {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]})
        elif path == "/props" and self.context is not None:
            await _json(send, 200, {"default_generation_settings": {"n_ctx": self.context}})
        elif path == "/v1/completions":
            await _json(send, 200, _completion(body.get("prompt")))
        elif path == "/v1/chat/completions":
            await self._chat(body, receive, send)
        else:
            await _json(send, 404, {"error": {"message": "not found"}})

    async def _chat(self, body: dict[str, Any], receive: Any, send: Any) -> None:
        said = next((m["content"] for m in reversed(body["messages"]) if m["role"] == "user"), "")
        if said == "fail":
            await _json(send, 500, {"error": {"message": "the model crashed", "type": "server_error"}})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        gone = asyncio.Event()

        async def watch() -> None:  # uvicorn reports a closed connection as http.disconnect
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch())
        pause = 0.01
        try:
            for event in self._events(body, said):
                if event is None:  # the "hold" pause; after it, tokens come slowly (0.1 s apart)
                    while not self.gate.is_set() and not gone.is_set():  # noqa: ASYNC110 (a thread sets it)
                        await asyncio.sleep(0.02)
                    pause = AFTER_HOLD_PAUSE
                    continue
                if gone.is_set():
                    self.closed_early += 1
                    return
                await send({"type": "http.response.body", "body": event, "more_body": True})
                await asyncio.sleep(pause)
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
            self.finished += 1
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    def _events(self, body: dict[str, Any], said: str) -> Iterator[bytes | None]:
        if said == "tools":
            name = body["tools"][0]["function"]["name"]
            yield _chunk({"tool_calls": [{"index": 0, "id": "call_fake1", "type": "function",
                                          "function": {"name": name, "arguments": ""}}]})  # fmt: skip
            for i in range(0, len(TOOL_ARGS), 6):
                yield _chunk({"tool_calls": [{"index": 0, "function": {"arguments": TOOL_ARGS[i : i + 6]}}]})
            yield _chunk({}, "tool_calls")
            yield _usage(len(TOOL_ARGS) // 4)
            return
        for i, token in enumerate(TOKENS):
            if said == "hold" and i == HOLD_TOKENS:
                yield None
            yield _chunk({"content": token})
        yield _chunk({}, "stop")
        yield _usage(len(TOKENS))


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    event = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()),
             "model": MODEL_ID, "choices": [choice]}  # fmt: skip
    return f"data: {json.dumps(event)}\n\n".encode()


def _completion(prompt: Any) -> dict[str, Any]:
    text, usage = LEGACY_TEXT, dict(LEGACY_USAGE)
    if prompt == "ramble":
        text = RAMBLE
        usage.update(completion_tokens=RAMBLE_TOKENS, total_tokens=usage["prompt_tokens"] + RAMBLE_TOKENS)
    answer: dict[str, Any] = {"choices": [{"text": text, "index": 0, "finish_reason": "length"}]}
    if prompt != "mute":
        answer["usage"] = usage
    return answer


def _usage(completion: int) -> bytes:
    usage = {"prompt_tokens": 17, "completion_tokens": completion, "total_tokens": 17 + completion}
    event = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "choices": [], "usage": usage}
    return f"data: {json.dumps(event)}\n\n".encode()


async def _json(send: Any, status: int, payload: Any) -> None:
    data = json.dumps(payload).encode()
    await send(
        {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
    )
    await send({"type": "http.response.body", "body": data})


class Served:
    """An ASGI app served by uvicorn in a thread on 127.0.0.1:`port` (a free one by default)."""

    def __init__(self, app: Any, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # A stop cuts connections still open after a second (a waiting pop, a stream the test left):
        # uvicorn would otherwise wait for them, and __exit__ gives up on the thread after 15 s.
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=1)  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on port {self.port}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)
