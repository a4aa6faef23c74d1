"""/status/*: models and heartbeat."""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.params import FromQuery

import horde_lite
from horde_lite.api.common import horde_of, transaction
from horde_lite.lifecycle.catalogue import text_models


@get("/status/models")
async def status_models(
    request: Request[Any, Any, Any], type: FromQuery[str] = "text"
) -> list[dict[str, Any]]:
    if type not in ("text", "all"):
        return []  # horde_lite serves text only
    horde = horde_of(request)
    async with transaction(horde) as session:
        return await text_models(session, horde)


@get("/status/heartbeat")
async def heartbeat() -> dict[str, str]:
    return {"message": "OK", "version": horde_lite.__version__}


HANDLERS = [status_models, heartbeat]
