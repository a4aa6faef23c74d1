"""Whether the client of a request is still there, through Litestar's public `Request.receive`:
once the body is read, the next ASGI message a request receives is `http.disconnect`, sent when
the client closes the connection."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request

Req = Request[Any, Any, Any]


async def disconnected(request: Req) -> None:
    """Return when the client closes the connection (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


@contextlib.asynccontextmanager
async def watched(request: Req) -> AsyncIterator[asyncio.Event]:
    """An event set when the client goes, watched while the block runs."""
    gone = asyncio.Event()

    async def watch() -> None:
        await disconnected(request)
        gone.set()

    watcher = asyncio.ensure_future(watch())
    try:
        yield gone
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
