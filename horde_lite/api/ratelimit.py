"""Rate limits on request creation and status reads, per (API key, client address) pair, and on
registration, per client address.

Litestar's `RateLimitMiddleware` counts calls in a fixed window (a minute, an hour for registration)
in a store. The store is
Litestar's in-memory one, so every server process counts on its own: with `--wc N` a client gets up
to N times the limit. The key is kept only as a hash, so the store never holds a usable key. The
429 it raises becomes each face's `RateLimited` answer in `horde_lite.api.errors`.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.middleware.base import DefineMiddleware
from litestar.middleware.rate_limit import CacheObject, DurationUnit, RateLimitConfig, RateLimitMiddleware
from litestar.stores.base import Store
from litestar.stores.memory import MemoryStore

from horde_lite.api.deps import apikey_of
from horde_lite.settings import RateLimitSettings

# Which calls each limit counts: (method, path pattern) pairs.
CREATE_CALLS = (
    ("POST", re.compile(r"/api/v2/generate/text/async/?")),
    ("POST", re.compile(r"/v1/chat/completions/?")),
    ("POST", re.compile(r"/v1/completions/?")),
)
STATUS_CALLS = (("GET", re.compile(r"/api/v2/generate/text/status/[^/]+/?")),)
REGISTER_CALLS = (("POST", re.compile(r"/api/v2/register/?")), ("POST", re.compile(r"/register/?")))
# Expired windows are dropped from the memory store this often, so one-off addresses don't pile up.
PURGE_SECONDS = 300


def client_address(connection: ASGIConnection[Any, Any, Any, Any]) -> str:
    """The connection's client address (uvicorn's, after its trusted proxies' headers)."""
    return connection.client.host if connection.client else "unknown"


def caller_identity(request: Request[Any, Any, Any]) -> str:
    """The client address and a hash of its key (the anonymous key and no key count alike)."""
    key = apikey_of(request) or "0000000000"
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return f"{client_address(request)}|{digest}"


class KeyAndAddressRateLimit(RateLimitMiddleware):
    """Litestar's middleware, with expired windows purged from the in-memory store now and then."""

    _next_purge: float = 0.0

    async def set_cached_history(self, key: str, cache_object: CacheObject, store: Store) -> None:
        await super().set_cached_history(key, cache_object, store)
        now = time.monotonic()
        if isinstance(store, MemoryStore) and now >= self._next_purge:
            self._next_purge = now + PURGE_SECONDS
            await store.delete_expired()


def _matcher(calls: tuple[tuple[str, re.Pattern[str]], ...]) -> Any:
    # A coroutine function: Litestar runs a plain function given as `check_throttle_handler` in a
    # thread, a hand-off per request for a few string comparisons.
    async def counts(request: Request[Any, Any, Any]) -> bool:
        path = request.url.path
        return any(request.method == method and pattern.fullmatch(path) for method, pattern in calls)

    return counts


def _limit(
    name: str,
    calls: tuple[tuple[str, re.Pattern[str]], ...],
    rate: tuple[DurationUnit, int],
    identity: Callable[[Request[Any, Any, Any]], str] = caller_identity,
) -> DefineMiddleware:
    config = RateLimitConfig(
        rate_limit=rate,
        identifier_for_request=identity,
        check_throttle_handler=_matcher(calls),
        middleware_class=KeyAndAddressRateLimit,
        store=f"ratelimit_{name}",
    )
    return config.middleware


def rate_limit_middleware(settings: RateLimitSettings) -> list[DefineMiddleware]:
    """One middleware per limit that is on (0 turns a limit off)."""
    out: list[DefineMiddleware] = []
    if settings.create_per_minute > 0:
        out.append(_limit("create", CREATE_CALLS, ("minute", settings.create_per_minute)))
    if settings.status_per_minute > 0:
        out.append(_limit("status", STATUS_CALLS, ("minute", settings.status_per_minute)))
    if settings.register_per_hour > 0:
        # By address alone: whoever registers has no key yet, and a made-up key must not buy a new budget.
        out.append(_limit("register", REGISTER_CALLS, ("hour", settings.register_per_hour), client_address))
    return out
