"""Rate limits on request creation and status reads, per (API key, client address) pair, and on
registration, per client address.

Litestar's `RateLimitMiddleware` counts calls in a fixed window (a minute, an hour for registration).
Where it counts is `[ratelimit] store`: in each process's memory (Litestar's in-memory store, so
with `--wc N` a client gets up to N times the limit), or shared by every process and host, in the
database or in Redis (api/rate_counts.py), where one atomic call per counted request decides. The
key is kept only as a hash, so no store ever holds a usable key. The 429 it raises becomes each
face's `RateLimited` answer in `horde_lite.api.errors`; a shared store that cannot be reached is
each face's 503.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from litestar import Litestar, Request
from litestar.connection import ASGIConnection
from litestar.middleware.base import DefineMiddleware
from litestar.middleware.rate_limit import CacheObject, DurationUnit, RateLimitConfig, RateLimitMiddleware
from litestar.stores.base import Store
from litestar.stores.memory import MemoryStore

from horde_lite.api.deps import apikey_of
from horde_lite.api.rate_counts import DatabaseCounts, RedisCounts, SharedCounts, redis_client
from horde_lite.db.engine import is_sqlite
from horde_lite.settings import Settings

log = logging.getLogger("horde_lite.ratelimit")

# Which calls each limit counts: (method, path pattern) pairs.
CREATE_CALLS = (
    ("POST", re.compile(r"/api/v2/generate/text/async/?")),
    ("POST", re.compile(r"/v1/chat/completions/?")),
    ("POST", re.compile(r"/v1/completions/?")),
)
STATUS_CALLS = (("GET", re.compile(r"/api/v2/generate/text/status/[^/]+/?")),)
REGISTER_CALLS = (("POST", re.compile(r"/api/v2/register/?")), ("POST", re.compile(r"/register/?")))
# The windows' lengths, as Litestar's middleware reads its units.
WINDOW_SECONDS: dict[DurationUnit, int] = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
WHERE = {
    "memory": "in each server process's memory",
    "database": "in the database, shared by every process",
    "redis": "in Redis, shared by every process",
}
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


@dataclass
class SharedLimitConfig(RateLimitConfig):
    """Litestar's config, with the shared counts the limit counts in."""

    counts: SharedCounts | None = field(default=None)


class SharedRateLimit(RateLimitMiddleware):
    """Litestar's middleware counting in a shared store: the one atomic count made when the history
    is retrieved decides, and the history is only its length (no list of call times, however large
    the limit). Rejected calls count too: a client that keeps calling past its limit gains nothing."""

    def cache_key_from_request(self, request: Request[Any, Any, Any]) -> str:
        # The limit's name and a hash of the identity: fixed length whatever the caller sent.
        digest = hashlib.sha256(super().cache_key_from_request(request).encode()).hexdigest()[:40]
        return f"{self.config.store}:{digest}"

    async def retrieve_cached_history(self, key: str, store: Store) -> CacheObject:
        counts = cast(SharedLimitConfig, self.config).counts
        assert counts is not None
        hits, left = await counts.hit(key, WINDOW_SECONDS[self.unit])
        # The middleware reads the count before this call, and the reset on its own wall clock.
        return CacheObject(history=_calls(hits - 1), reset=int(time.time()) + max(1, math.ceil(left)))

    async def set_cached_history(self, key: str, cache_object: CacheObject, store: Store) -> None:
        cache_object.history = _calls(len(cache_object.history) + 1)  # counted already


def _calls(count: int) -> list[int]:
    # The middleware only takes the history's length: a range has one without a list behind it.
    return cast(list[int], range(count))


def _matcher(calls: tuple[tuple[str, re.Pattern[str]], ...]) -> Any:
    # A coroutine function: Litestar runs a plain function given as `check_throttle_handler` in a
    # thread, a hand-off per request for a few string comparisons.
    async def counts(request: Request[Any, Any, Any]) -> bool:
        path = request.url.path
        return any(request.method == method and pattern.fullmatch(path) for method, pattern in calls)

    return counts


def store_kind(settings: Settings) -> str:
    """Where the limits count: "memory", "database" or "redis" (`auto`: the database on PostgreSQL,
    memory on SQLite)."""
    store = settings.ratelimit.store
    if store == "auto":
        return "memory" if is_sqlite(settings.database.url) else "database"
    return "redis" if settings.ratelimit.redis_url else store


class RateLimits:
    """The app's limits (one middleware per limit that is on; 0 turns a limit off), where they
    count, and the stores Litestar runs for them."""

    def __init__(self, settings: Settings) -> None:
        limits = settings.ratelimit
        self.kind = store_kind(settings)
        self.stores: dict[str, Store] = {}
        self.counts: SharedCounts | None = None
        if self.kind == "database":
            self.counts = DatabaseCounts()
        elif self.kind == "redis":
            from litestar.stores.redis import RedisStore

            client = redis_client(limits.store)
            self.counts = RedisCounts(client, limits.redis_namespace)
            # Registered so that Litestar closes the client with the app; the counts use the same one.
            self.stores["ratelimit_redis"] = RedisStore(
                client, namespace=limits.redis_namespace, handle_client_shutdown=True
            )
        self.middleware: list[DefineMiddleware] = []
        if limits.create_per_minute > 0:
            self.middleware.append(self._limit("create", CREATE_CALLS, ("minute", limits.create_per_minute)))
        if limits.status_per_minute > 0:
            self.middleware.append(self._limit("status", STATUS_CALLS, ("minute", limits.status_per_minute)))
        if limits.register_per_hour > 0:
            # By address alone: whoever registers has no key yet, and a made-up key must not buy a new budget.
            self.middleware.append(
                self._limit("register", REGISTER_CALLS, ("hour", limits.register_per_hour), client_address)
            )

    def _limit(
        self,
        name: str,
        calls: tuple[tuple[str, re.Pattern[str]], ...],
        rate: tuple[DurationUnit, int],
        identity: Callable[[Request[Any, Any, Any]], str] = caller_identity,
    ) -> DefineMiddleware:
        common: dict[str, Any] = {
            "rate_limit": rate,
            "identifier_for_request": identity,
            "check_throttle_handler": _matcher(calls),
            "store": f"ratelimit_{name}",
        }
        if self.counts is None:
            return RateLimitConfig(**common, middleware_class=KeyAndAddressRateLimit).middleware
        return SharedLimitConfig(**common, middleware_class=SharedRateLimit, counts=self.counts).middleware

    async def start(self, app: Litestar) -> None:
        """At the app's start-up, after the horde's: the database counts use its engine and clock."""
        if isinstance(self.counts, DatabaseCounts):
            self.counts.bind(app.state.horde)
        if self.middleware:
            log.info("rate limits counted %s", WHERE[self.kind])
