"""What both faces share: body decoding, the horde state, one transaction per request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import msgspec
from litestar import Request
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.api.deps import apikey_of  # noqa: F401  (re-exported while the faces move over)
from horde_lite.lifecycle.context import Horde
from horde_lite.lifecycle.errors import HordeError

T = TypeVar("T")

MAX_BODY_BYTES = 4 * 1024 * 1024


def horde_of(request: Request[Any, Any, Any]) -> Horde:
    return request.app.state.horde


async def decode(request: Request[Any, Any, Any], type_: type[T]) -> T:
    """Decode a JSON body into `type_`; malformed JSON or a bad field is a 400 naming the field."""
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise HordeError("PayloadTooLarge", f"The request body is larger than {MAX_BODY_BYTES} bytes.")
    if not raw.strip():
        raw = b"{}"
    try:
        decoded = msgspec.json.decode(raw, type=type_)
        if b"\\u0000" in raw and _has_nul(msgspec.json.decode(raw)):
            # PostgreSQL text cannot hold NUL (SQLite can): refuse it the same way on both.
            raise HordeError("BadRequest", "Strings in the request body may not contain NUL characters.")
        return decoded
    except msgspec.ValidationError as e:
        path = str(e).rpartition(" - at `$.")[2].rstrip("`") if " - at `$." in str(e) else "body"
        raise HordeError(
            "BadRequest", f"Input payload validation failed: {e}", errors={path: str(e)}, param=path
        ) from e
    except msgspec.DecodeError as e:
        raise HordeError("BadRequest", f"The request body is not valid JSON: {e}") from e


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def client_agent_of(request: Request[Any, Any, Any]) -> str:
    return request.headers.get("client-agent") or request.headers.get("client_agent") or ""


@asynccontextmanager
async def transaction(horde: Horde) -> AsyncIterator[AsyncSession]:
    """One short transaction: committed when the block ends, rolled back on any error (so a
    refused request leaves nothing behind)."""
    async with horde.sessionmaker() as session, session.begin():
        yield session
