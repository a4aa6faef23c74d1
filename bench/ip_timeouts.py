"""What checking a caller's address against the live timeouts costs (operators/ip_timeouts.py), and
what a process's poll of them costs, on SQLite and PostgreSQL.

    .venv/bin/python -m bench.ip_timeouts --db both

The check: `ip_timeouts.check` on a horde whose copy holds 0, 10, 100 and 2,000 timeouts (the most
a horde holds; a quarter each IPv4 /32, IPv4 /24, IPv6 /64 and IPv6 /48, the shapes moderators
set), for an IPv4 and an IPv6 caller that no timeout covers (every request's case) and one that a
timeout covers; microseconds per check, the median of `--rounds` rounds of `--calls` calls. It
reads no database (its copy is fresh for the whole run). The poll: one `ip_timeouts.reload` with
those timeouts stored (the read and the copy's rebuild), milliseconds, the median of `--rounds`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import msgspec
from sqlalchemy import delete, insert

from bench.admission import close, fresh_pg, horde_for
from horde_lite.core.context import Horde
from horde_lite.core.errors import HordeError
from horde_lite.db import migrate
from horde_lite.db.models import IpTimeout
from horde_lite.operators import ip_timeouts

SIZES = (0, 10, 100, 2_000)
MISS_V4, MISS_V6 = "192.0.2.1", "2001:db8:ffff:ffff::1"


def _networks(count: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    out: set[str] = set()
    while len(out) < count:
        kind = len(out) % 4
        if kind == 0:
            out.add(
                f"{rng.randrange(11, 190)}.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)}/32"
            )
        elif kind == 1:
            out.add(f"{rng.randrange(11, 190)}.{rng.randrange(256)}.{rng.randrange(256)}.0/24")
        else:
            prefix = 64 if kind == 2 else 48
            value = (0x2A00 << 112) | (rng.getrandbits(48) << 64)
            out.add(str(ipaddress.ip_network((value, prefix), strict=False)))
    return sorted(out)


async def _store(horde: Horde, networks: list[str]) -> None:
    now = horde.clock.now()
    async with horde.transaction() as session:
        await session.execute(delete(IpTimeout))
        if networks:
            rows = [{"network": n, "expires_at": now + 3600, "created_at": now} for n in networks]
            await session.execute(insert(IpTimeout), rows)


async def _per_check(horde: Horde, address: str, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        with contextlib.suppress(HordeError):
            await ip_timeouts.check(horde, address)
    return (time.perf_counter() - started) / calls * 1e6


async def run(url: str, kind: str, rounds: int, calls: int) -> None:
    horde = horde_for(url)
    # No poll during the timed checks: the copy is read by `reload` alone, so a check is timed alone.
    policies = msgspec.structs.replace(horde.settings.policies, reload_seconds=3600.0)
    horde.settings = msgspec.structs.replace(horde.settings, policies=policies)
    try:
        for size in SIZES:
            networks = _networks(size)
            await _store(horde, networks)
            polls = []
            for _ in range(rounds):
                started = time.perf_counter()
                await ip_timeouts.reload(horde)
                polls.append((time.perf_counter() - started) * 1e3)
            assert len(horde.ip_timeouts) == size
            hit = str(ipaddress.ip_network(networks[0]).network_address) if networks else MISS_V4
            checks = {}
            for name, address in (("miss v4", MISS_V4), ("miss v6", MISS_V6), ("hit", hit)):
                checks[name] = statistics.median(
                    [await _per_check(horde, address, calls) for _ in range(rounds)]
                )
            cells = [f"{checks[name]:.2f}" for name in ("miss v4", "miss v6", "hit")]
            print(f"| {kind} | {size:,} | {' | '.join(cells)} | {statistics.median(polls):.1f} |")
    finally:
        await close(horde)


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="sqlite")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument(
        "--pg-url",
        default=os.environ.get(
            "HORDE_LITE_BENCH_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = parser.parse_args()
    print("| database | timeouts | check, v4 miss (us) | check, v6 miss (us) | check, hit (us) | poll (ms) |")
    print("|---|---|---|---|---|---|")
    if args.db in ("sqlite", "both"):
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}"
            await asyncio.to_thread(migrate.upgrade, url)
            await run(url, "sqlite", args.rounds, args.calls)
    if args.db in ("postgresql", "both"):
        url = await fresh_pg(args.pg_url, "hl_bench_ip")
        await asyncio.to_thread(migrate.upgrade, url)
        await run(url, "postgresql", args.rounds, args.calls)


if __name__ == "__main__":
    asyncio.run(main())
