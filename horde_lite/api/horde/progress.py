"""/generate/text/progress: a streaming chat job's progress posts (api.md)."""

from __future__ import annotations

from typing import Any

from litestar import Request, post

from horde_lite.api.common import apikey_of, decode, horde_of
from horde_lite.lifecycle import progress
from horde_lite.lifecycle.inputs import ProgressInput


@post("/generate/text/progress", status_code=200)
async def post_progress(request: Request[Any, Any, Any]) -> dict[str, Any]:
    body = await decode(request, ProgressInput)
    return await progress.post(horde_of(request), apikey_of(request), body)


HANDLERS = [post_progress]
