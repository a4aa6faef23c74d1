"""Answering a /v1 call that waits: the non-streaming answer or the server-sent events, and what
happens when the client leaves. Both /v1 fronts (chat and text completions) answer through here.

Nothing is sent before a worker holds the job, so every failure up to then (refusals, the grace's
`no_eligible_worker`, `queue_timeout`) is a real HTTP status. The events go out through Litestar's
`ServerSentEvent`, one `data: <json>` line and a blank line each (a `\\n` separator, no `event:` or
`id:` lines), `: keep-alive` comments while idle, and `data: [DONE]` at the end. Once the stream
has started, a failure is one in-stream error event and the stream ends without `[DONE]`. A client
that goes away, before or during the stream, cancels its request (`waiting.abandon`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from litestar import Request, Response
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIResponse, OpenAPIType, Operation, Schema
from litestar.response import ServerSentEvent, ServerSentEventMessage

from horde_lite.api.client_gone import disconnected
from horde_lite.api.db_errors import database_unavailable
from horde_lite.api.errors import openai_body
from horde_lite.api.openai import schemas
from horde_lite.core.context import Horde
from horde_lite.core.errors import HordeError
from horde_lite.fronts import waiting
from horde_lite.fronts.waiting import Delta, Final, FrontRequest, KeepAlive, Waiter
from horde_lite.rc import Rc

log = logging.getLogger("horde_lite.openai")

Req = Request[Any, Any, Any]
T = TypeVar("T")

SEP = "\n"  # OpenAI's servers and every SSE client use a bare newline
DONE = ServerSentEventMessage(data="[DONE]", sep=SEP)
KEEPALIVE = ServerSentEventMessage(data=None, comment="keep-alive", sep=SEP)


def event(data: Any) -> ServerSentEventMessage:
    return ServerSentEventMessage(data=msgspec.json.encode(data).decode(), sep=SEP)


class Render:
    """The chunks of one front's stream; the base sends nothing to open and no progress."""

    def __init__(self, front: FrontRequest, include_usage: bool) -> None:
        self.front = front
        self.include_usage = include_usage

    def opening(self) -> list[dict[str, Any]]:
        return []

    def delta(self, delta: Delta) -> list[dict[str, Any]]:
        return []

    def closing(self, final: Final) -> list[dict[str, Any]]:
        raise NotImplementedError

    def final(self, final: Final) -> list[dict[str, Any]]:
        """The closing chunks, then the usage chunk (`choices: []`) when the client asked for it."""
        out = self.closing(final)
        if self.include_usage:
            usage = schemas.usage(final)
            out.append(schemas.chunk(self.front, [], include_usage=True, usage=usage, kudos=final.kudos))
        return out


@dataclass(frozen=True)
class Answer:
    """How one front answers: its non-streaming struct and its stream's chunks."""

    whole: Callable[[FrontRequest, Final], Any]
    render: Callable[[FrontRequest, bool], Render]


async def respond(
    request: Req, horde: Horde, front: FrontRequest, answer: Answer, *, include_usage: bool
) -> Response[Any]:
    """Wait for the request and answer it, whole or as a stream (the lifecycle's rules)."""
    waiter = Waiter(horde, front)
    headers = {"x-horde-request-id": front.request_id}
    if not front.stream:
        try:
            final = await _unless_client_leaves(request, horde, front, waiter.result())
        finally:
            waiter.close()
        return Response(answer.whole(front, final), headers=headers)
    try:
        await _unless_client_leaves(request, horde, front, waiter.assigned())
    except BaseException:
        waiter.close()
        raise
    render = answer.render(front, include_usage)
    return ServerSentEvent(_events(horde, front, waiter, render), headers=headers)


async def _unless_client_leaves(request: Req, horde: Horde, front: FrontRequest, work: Awaitable[T]) -> T:
    """Await `work`; if the client disconnects first, cancel the request instead."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server is stopping or the connection was torn down
        task.cancel()
        watcher.cancel()
        await waiting.abandon(horde, front.request_id)
        raise
    finally:
        for pending in (task, watcher):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending
    if task.done() and not task.cancelled():
        return task.result()
    log.info("client left before its answer request=%s", front.request_id)
    await waiting.abandon(horde, front.request_id)
    raise HordeError(Rc.ClientDisconnected, "The client closed the connection; the request was cancelled.")


async def _events(
    horde: Horde, front: FrontRequest, waiter: Waiter, render: Render
) -> AsyncIterator[ServerSentEventMessage]:
    finished = False
    try:
        for chunk in render.opening():
            yield event(chunk)
        async for update in waiter.events():
            if isinstance(update, KeepAlive):
                yield KEEPALIVE
            elif isinstance(update, Delta):
                for chunk in render.delta(update):
                    yield event(chunk)
            else:
                for chunk in render.final(update):
                    yield event(chunk)
                yield DONE
                finished = True
    except HordeError as error:
        finished = True  # the waiter has cancelled what needed cancelling
        yield event(openai_body(error.rc.status, error.rc, error.message))
    except Exception as exc:
        if database_unavailable(exc):  # retryable, as the same failure before the stream began
            log.warning("stream lost its database request=%s: %s", front.request_id, exc)
            message = "The database is unavailable; retry in a few seconds."
            yield event(openai_body(Rc.DatabaseUnavailable.status, Rc.DatabaseUnavailable, message))
        else:
            log.exception("stream failed request=%s", front.request_id)
            message = "The server hit an internal error; the request was cancelled."
            yield event(openai_body(Rc.InternalServerError.status, Rc.InternalServerError, message))
    finally:
        waiter.close()
        if not finished:  # the client went away mid-stream (or the server hit an error)
            await waiting.abandon(horde, front.request_id)


@dataclass
class EventStreamOperation(Operation):
    """A /v1 operation whose 200 answer is JSON or, with `stream: true`, an event stream."""

    def __post_init__(self) -> None:
        ok = (self.responses or {}).get("200")
        if isinstance(ok, OpenAPIResponse):
            stream = Schema(
                type=OpenAPIType.STRING,
                description="With `stream: true`: server-sent events, `data: <chunk JSON>` each, "
                "`: keep-alive` comments, and `data: [DONE]` last.",
            )
            ok.content = {**(ok.content or {}), "text/event-stream": OpenAPIMediaType(schema=stream)}
