"""Whole job cycles (bench/perf_cycles.py) on PostgreSQL directly and through a real PgBouncer in
transaction mode (`[database] pgbouncer = true`, `listen_url` direct), with JIT on and off for
the database behind PgBouncer (which cannot be sent `jit=off` at connect): cycles per second and
CPU per cycle of the servers, PostgreSQL and PgBouncer, printed.

    .venv/bin/python -m bench.perf_pgbouncer --seconds 10 --workers 16
"""

from __future__ import annotations

import argparse
import asyncio
import os

import asyncpg
from sqlalchemy.engine import make_url

from bench.admission import BENCH_PG_DB, DEFAULT_PG
from bench.perf_cycles import CycleResult, run_cycles
from tests.support.pgbouncer import Bouncer, start_pgbouncer


def _cpu_of(pid: int) -> float:
    """User + system CPU seconds of one process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _set_jit(url: str, jit: bool) -> None:
    parsed = make_url(url)
    conn = await asyncpg.connect(host=parsed.host, port=parsed.port or 5432, user=parsed.username,
                                 password=parsed.password, database="postgres")  # fmt: skip
    try:
        await conn.execute(f'ALTER DATABASE "{parsed.database}" SET jit = {"on" if jit else "off"}')
    finally:
        await conn.close()


async def _through(bouncer: Bouncer, jit: bool, args: argparse.Namespace) -> tuple[CycleResult, float]:
    async def route(url: str) -> str:
        await _set_jit(url, jit)  # before PgBouncer opens its server connections
        return bouncer.url_for(str(make_url(url).database))

    direct = make_url(args.pg_url).set(database=BENCH_PG_DB).render_as_string(hide_password=False)
    before = _cpu_of(bouncer.pid())
    [result] = await run_cycles("postgresql", args.pg_url, args.processes, [args.workers], args.seconds,
                                route=route, database={"pgbouncer": True, "listen_url": direct})  # fmt: skip
    return result, (_cpu_of(bouncer.pid()) - before) * 1000 / max(result.cycles, 1)


def _line(name: str, r: CycleResult, bouncer_ms: float | None) -> str:
    pgb = "" if bouncer_ms is None else f"{bouncer_ms:.2f}"
    cpu = f"{r.server_cpu_ms_per_cycle or 0:>10.2f} {r.postgres_cpu_ms_per_cycle or 0:>10.2f} {pgb:>10}"
    return f"{name:<30} {r.cycles:>7} {r.per_second:>9.1f} {r.cycle_p50:>9.1f} {cpu} {r.errors:>6}"


async def main_async(args: argparse.Namespace) -> None:
    print(f"{'run':<30} {'cycles':>7} {'cycles/s':>9} {'p50 ms':>9} {'server ms':>10} {'pg ms':>10}"
          f" {'pgb ms':>10} {'errors':>6}   (CPU per cycle)")  # fmt: skip
    [direct] = await run_cycles("postgresql", args.pg_url, args.processes, [args.workers], args.seconds)
    print(_line("direct (jit off at connect)", direct, None), flush=True)
    with start_pgbouncer(args.pg_url, pool_size=args.pool) as bouncer:
        for jit in (False, True):
            result, bouncer_ms = await _through(bouncer, jit, args)
            print(_line(f"pgbouncer, database jit {'on' if jit else 'off'}", result, bouncer_ms), flush=True)
            for error in result.errors_seen:
                print("   ", error)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", default=DEFAULT_PG, help=f"a server to create {BENCH_PG_DB} on")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--pool", type=int, default=20, help="PgBouncer's server connections")
    asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
