"""What one counted call costs the rate-limit middleware in each `[ratelimit] store`: memory
(Litestar's in-memory store, each process on its own), the database (SQLite, PostgreSQL) and Redis.

    .venv/bin/python -m bench.ratelimit --stores memory sqlite postgresql redis

Each call runs the middleware's own hooks as a request does (`retrieve_cached_history`, then
`set_cached_history` when the call is admitted) for one of `--callers` identities in turn, under
the status limit's default (600 a minute). "serial" is microseconds per call, one after another,
the median of `--rounds` rounds of `--calls` calls; "concurrent" is calls per second with
`--tasks` calls under way at once (the middleware's lock is per limit and route, so different
routes' calls meet in the store, as here).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from litestar.middleware.rate_limit import RateLimitConfig, RateLimitMiddleware
from litestar.stores.base import Store
from litestar.stores.memory import MemoryStore

from bench.admission import close, fresh_pg, horde_for
from horde_lite.api.rate_counts import DatabaseCounts, RedisCounts, SharedCounts, redis_client
from horde_lite.api.ratelimit import KeyAndAddressRateLimit, SharedLimitConfig, SharedRateLimit
from horde_lite.db import migrate

LIMIT = 600


async def _no_app(scope: Any, receive: Any, send: Any) -> None:
    return None


def _middleware(counts: SharedCounts | None) -> RateLimitMiddleware:
    if counts is None:
        config = RateLimitConfig(rate_limit=("minute", LIMIT), middleware_class=KeyAndAddressRateLimit)
        return KeyAndAddressRateLimit(app=_no_app, config=config)
    shared = SharedLimitConfig(
        rate_limit=("minute", LIMIT), middleware_class=SharedRateLimit, store="ratelimit_bench", counts=counts
    )
    return SharedRateLimit(app=_no_app, config=shared)


async def _call(middleware: RateLimitMiddleware, key: str, store: Store) -> None:
    history = await middleware.retrieve_cached_history(key, store)
    if len(history.history) < middleware.max_requests:
        await middleware.set_cached_history(key, history, store)


async def _serial(middleware: RateLimitMiddleware, keys: list[str], store: Store, calls: int) -> float:
    started = time.perf_counter()
    for i in range(calls):
        await _call(middleware, keys[i % len(keys)], store)
    return (time.perf_counter() - started) / calls * 1e6


async def _concurrent(
    middleware: RateLimitMiddleware, keys: list[str], store: Store, calls: int, tasks: int
) -> float:
    async def worker(offset: int) -> None:
        for i in range(offset, calls, tasks):
            await _call(middleware, keys[i % len(keys)], store)

    started = time.perf_counter()
    await asyncio.gather(*(worker(t) for t in range(tasks)))
    return calls / (time.perf_counter() - started)


async def measure(name: str, counts: SharedCounts | None, args: argparse.Namespace) -> None:
    middleware = _middleware(counts)
    run = uuid.uuid4().hex[:8]
    serial = []
    for r in range(args.rounds):
        # Fresh identities each round: no caller reaches the limit, so every call is counted.
        keys = [f"bench{run}-{r}-{i}" for i in range(args.callers)]
        serial.append(await _serial(middleware, keys, MemoryStore(), args.calls))
    keys = [f"bench{run}-c-{i}" for i in range(args.callers)]
    per_second = await _concurrent(middleware, keys, MemoryStore(), args.calls, args.tasks)
    print(f"| {name} | {statistics.median(serial):.1f} | {per_second:,.0f} |")


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--stores", nargs="+", choices=("memory", "sqlite", "postgresql", "redis"),
        default=["memory", "sqlite", "postgresql", "redis"],
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2_000)
    parser.add_argument("--callers", type=int, default=100)
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument(
        "--pg-url",
        default=os.environ.get(
            "HORDE_LITE_BENCH_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument(
        "--redis-url", default=os.environ.get("HORDE_LITE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    args = parser.parse_args()
    print(f"| store | serial (us per call) | concurrent, {args.tasks} tasks (calls/s) |")
    print("|---|---|---|")
    for store in args.stores:
        if store == "memory":
            await measure("memory", None, args)
        elif store == "redis":
            client = redis_client(args.redis_url)
            try:
                await measure("redis", RedisCounts(client, f"horde_lite_bench_{uuid.uuid4().hex[:8]}"), args)
            finally:
                await client.aclose()
        else:
            with tempfile.TemporaryDirectory() as tmp:
                if store == "sqlite":
                    url = f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}"
                else:
                    url = await fresh_pg(args.pg_url, "hl_bench_ratelimit")
                await asyncio.to_thread(migrate.upgrade, url)
                horde = horde_for(url)
                counts = DatabaseCounts()
                counts.bind(horde)
                try:
                    await measure(f"database ({store})", counts, args)
                finally:
                    await close(horde)


if __name__ == "__main__":
    asyncio.run(main())
