"""What the HTTP backends share: error translation, SSE parsing, OpenAI chunks, the base URL."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from horde_lite.worker.backends.base import BackendDown, BackendError, Chunk


def split_base(url: str) -> tuple[str, str]:
    """`http://h:8080/v1` or `http://h:8080` -> (root, root + "/v1")."""
    root = url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root, f"{root}/v1"


def client(timeout: float) -> httpx.AsyncClient:
    # connect: short, so a server that is down is noticed quickly; read: the gap allowed between
    # two pieces of a stream (or before a non-streamed answer).
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=5.0), follow_redirects=True)


@contextmanager
def translated(what: str) -> Iterator[None]:
    """httpx failures as BackendDown (unreachable) or BackendError (this job failed)."""
    try:
        yield
    except (httpx.ConnectError, httpx.ConnectTimeout) as e:
        raise BackendDown(f"{what}: cannot connect ({e or type(e).__name__})") from e
    except httpx.TimeoutException as e:
        raise BackendError(f"{what}: timed out ({type(e).__name__})") from e
    except httpx.HTTPError as e:
        raise BackendError(f"{what}: {type(e).__name__}: {e}") from e


async def raise_for_status(response: httpx.Response, what: str) -> None:
    if response.status_code >= 400:
        body = (await response.aread()).decode("utf-8", "replace")[:300]
        raise BackendError(f"{what}: HTTP {response.status_code}: {body}")


async def sse_json(response: httpx.Response, what: str) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of an SSE stream (`data: {...}` lines) up to `data: [DONE]`."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # blank separators, comments (": ping"), event names
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return
        try:
            event = json.loads(data)
        except ValueError as e:
            raise BackendError(f"{what}: a stream event is not JSON: {data[:120]!r}") from e
        if isinstance(event, dict) and "error" in event:
            raise BackendError(f"{what}: error in the stream: {json.dumps(event['error'])[:300]}")
        if isinstance(event, dict):
            yield event


def openai_chunk(event: dict[str, Any]) -> Chunk:
    """An OpenAI `chat.completion.chunk` as a Chunk (reasoning fields are not relayed)."""
    out = Chunk()
    choices = event.get("choices") or []
    if choices and isinstance(choices[0], dict):
        choice = choices[0]
        delta = choice.get("delta") or {}
        if isinstance(delta.get("content"), str) and delta["content"]:
            out.content = delta["content"]
        if isinstance(delta.get("tool_calls"), list) and delta["tool_calls"]:
            out.tool_calls = delta["tool_calls"]
        out.finish_reason = choice.get("finish_reason") or None
    usage = event.get("usage")
    if isinstance(usage, dict):
        out.usage = {k: v for k, v in usage.items() if isinstance(v, int) and not isinstance(v, bool)}
    return out


async def stream_chat(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], what: str
) -> AsyncIterator[Chunk]:
    """POST a streaming chat completion and yield its chunks; leaving early closes the stream."""
    with translated(what):
        async with http.stream("POST", url, json=body) as response:
            await raise_for_status(response, what)
            async for event in sse_json(response, what):
                yield openai_chunk(event)
