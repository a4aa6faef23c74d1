"""POST /v1/chat/completions: waits for the answer, or streams it as server-sent events.

Nothing is sent before a worker holds the job, so every failure up to then (refusals, the grace's
`no_eligible_worker`, `queue_timeout`) is a real HTTP status. Once the event stream has started, a
failure is one in-stream error event and the stream ends without `data: [DONE]`. A client that goes
away, before or during the stream, cancels its request (chat_front.abandon).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import anyio
from litestar import Request, Response, post
from litestar.response import Stream

from horde_lite.api.common import apikey_of, client_agent_of, decode, horde_of
from horde_lite.api.errors import openai_body, status_of
from horde_lite.api.openai import schemas
from horde_lite.lifecycle import chat_front
from horde_lite.lifecycle.context import Horde
from horde_lite.lifecycle.errors import HordeError

log = logging.getLogger("horde_lite.openai")

Req = Request[Any, Any, Any]
T = TypeVar("T")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Req) -> Response[Any]:
    horde = horde_of(request)
    body = await decode(request, schemas.ChatCompletionInput)
    payload = schemas.to_payload(body)
    key, agent = apikey_of(request), client_agent_of(request)
    if body.dry_run:
        quoted = await chat_front.quote(horde, key, payload, body.model, client_agent=agent)
        return Response(schemas.quote(quoted))
    stream = bool(body.stream)
    chat = await chat_front.create(horde, key, payload, body.model, stream=stream, client_agent=agent)
    waiter = chat_front.ChatWaiter(horde, chat)
    headers = {"x-horde-request-id": chat.request_id}
    if not stream:
        try:
            final = await _unless_client_leaves(request, horde, chat, waiter.result())
        finally:
            waiter.close()
        return Response(schemas.completion(chat, final), headers=headers)
    try:
        await _unless_client_leaves(request, horde, chat, waiter.assigned())
    except BaseException:
        waiter.close()
        raise
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return Stream(
        _events(horde, chat, waiter, include_usage),
        media_type="text/event-stream",
        headers={**SSE_HEADERS, **headers},
    )


async def _disconnected(request: Req) -> None:
    """Return when the client closes the connection (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _unless_client_leaves(
    request: Req, horde: Horde, chat: chat_front.ChatRequest, work: Awaitable[T]
) -> T:
    """Await `work`; if the client disconnects first, cancel the request instead."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server is stopping or the connection was torn down
        task.cancel()
        watcher.cancel()
        with anyio.CancelScope(shield=True):
            await chat_front.abandon(horde, chat.request_id)
        raise
    finally:
        for pending in (task, watcher):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending
    if task.done() and not task.cancelled():
        return task.result()
    log.info("client left before its answer request=%s", chat.request_id)
    with anyio.CancelScope(shield=True):
        await chat_front.abandon(horde, chat.request_id)
    raise HordeError("ClientDisconnected", "The client closed the connection; the request was cancelled.")


async def _events(
    horde: Horde, chat: chat_front.ChatRequest, waiter: chat_front.ChatWaiter, include_usage: bool
) -> AsyncIterator[bytes]:
    finished = False

    def chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> bytes:
        return schemas.chunk(chat, delta, finish, include_usage=include_usage, **extra)

    try:
        yield chunk({"role": "assistant", "content": ""}, context_adjustments=chat.context_adjustments)
        async for event in waiter.events():
            if isinstance(event, chat_front.KeepAlive):
                yield schemas.KEEPALIVE
            elif isinstance(event, chat_front.Delta):
                yield chunk(_delta(event))
            else:
                if event.remainder is not None:
                    yield chunk(_delta(event.remainder))
                yield chunk({}, event.finish_reason, kudos=event.kudos)
                if include_usage:
                    yield chunk(None, usage=schemas.usage(event), kudos=event.kudos)
                yield schemas.DONE
                finished = True
    except HordeError as error:
        finished = True  # the waiter has cancelled what needed cancelling
        yield schemas.sse(openai_body(status_of(error.rc), error.rc, error.message))
    except Exception:
        log.exception("chat stream failed request=%s", chat.request_id)
        message = "The server hit an internal error; the request was cancelled."
        yield schemas.sse(openai_body(500, "InternalServerError", message))
    finally:
        waiter.close()
        if not finished:  # the client went away mid-stream (or the server hit an error)
            with anyio.CancelScope(shield=True):
                await chat_front.abandon(horde, chat.request_id)


def _delta(delta: chat_front.Delta) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if delta.content:
        out["content"] = delta.content
    if delta.tool_calls:
        out["tool_calls"] = delta.tool_calls
    return out


HANDLERS = [chat_completions]
