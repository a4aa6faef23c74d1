"""Full job cycles over HTTP against real `horde-lite run` processes: simulated workers each create a
request, pop until they get a job and submit it, for a bounded time, on a fresh database.

Each simulated worker has its own worker owner and its own requester (so the figure is the server's,
not the contention on one shared account's row); calls go round robin over the processes; rate
limits are off (every caller shares one address).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.admission import BENCH_PG_DB, pct
from bench.soak import set_up_users
from bench.soak_servers import LIMITS_OFF, Server, free_port, fresh_bench_database, server_env
from horde_lite.db.engine import make_engine

MODEL = "bench/Cycle-8B"
CREATE = {"prompt": "Once upon a time", "models": [MODEL],
          "params": {"n": 1, "max_length": 64, "max_context_length": 1024}}  # fmt: skip
CALL_TIMEOUT = 30.0


@dataclass
class CycleResult:
    db: str
    stack: str  # how the servers were started (bench/soak_servers.py STACKS)
    processes: int
    workers: int
    seconds: float
    cycles: int
    empty_pops: int
    errors: int
    per_second: float
    create_p50: float
    pop_p50: float
    submit_p50: float
    cycle_p50: float
    cycle_p99: float
    server_cpu_ms_per_cycle: float | None  # all server processes' user+system CPU over the window
    # What else the machine spent per cycle: the local PostgreSQL server's processes (None on SQLite,
    # whose work is the server's own) and this bench's simulated workers. On a machine whose cores
    # all three share, cores x 1,000 / (their sum) bounds the cycles/s even of a server costing nothing.
    postgres_cpu_ms_per_cycle: float | None = None
    client_cpu_ms_per_cycle: float | None = None
    errors_seen: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ProcCpu:
    """One process's CPU so far, from /proc/<pid>/stat (Linux), in seconds."""

    pid: int
    name: str
    pgrp: int
    used: float  # user + system (fields 14, 15)
    children: float  # of its children that ended and were waited for (fields 16, 17)


def proc_cpu() -> list[ProcCpu]:
    """Every process's CPU so far."""
    tick = os.sysconf("SC_CLK_TCK")
    out: list[ProcCpu] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        parts = stat[stat.rindex(")") + 2 :].split()
        used = (int(parts[11]) + int(parts[12])) / tick
        out.append(ProcCpu(int(entry), name, int(parts[2]), used, (int(parts[13]) + int(parts[14])) / tick))
    return out


def _cpu_seconds(pgids: set[int]) -> tuple[float, float]:
    """User + system CPU of every process in these process groups, and of every process named
    `postgres` and its ended children (a local PostgreSQL server's; Linux /proc)."""
    grouped = postgres = 0.0
    for p in proc_cpu():
        if p.pgrp in pgids:
            grouped += p.used
        elif p.name == "postgres":
            # With the CPU of its children that ended (the postmaster's, of the backends a pool
            # closed during the window, whose own entries are gone).
            postgres += p.used + p.children
    return grouped, postgres


class Pool:
    """One keep-alive client per server process, calls round robin."""

    def __init__(self, servers: list[Server], connections: int) -> None:
        # Idle connections are dropped before uvicorn's keep-alive timeout (5 s) closes them: with
        # httpx's default expiry (also 5 s), a call could go out on a connection the server was
        # closing that instant and fail with a ReadError.
        limits = httpx.Limits(
            max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=2.0
        )
        self.clients = [httpx.AsyncClient(base_url=s.base_url, limits=limits, timeout=CALL_TIMEOUT)
                        for s in servers]  # fmt: skip
        self.turn = 0

    async def post(self, path: str, key: str, body: dict[str, Any]) -> httpx.Response:
        self.turn += 1
        return await self.clients[self.turn % len(self.clients)].post(
            path, json=body, headers={"apikey": key}
        )

    async def close(self) -> None:
        for c in self.clients:
            await c.aclose()


def _pop_body(slot: int) -> dict[str, Any]:
    return {"name": f"perf-worker-{slot}", "models": [MODEL], "max_length": 512, "max_context_length": 2048,
            "bridge_agent": "perf:1:bench"}  # fmt: skip


async def _slot(pool: Pool, slot: int, owner: str, requester: str, stop: float, out: dict[str, Any]) -> None:
    while time.monotonic() < stop:
        began = time.perf_counter()
        r = await pool.post("/api/v2/generate/text/async", requester, CREATE)
        out["create"].append(time.perf_counter() - began)
        if r.status_code != 202:
            out["errors"].append(f"create {r.status_code} {r.text[:200]}")
            await asyncio.sleep(0.05)
            continue
        ids: list[str] = []
        while not ids and time.monotonic() < stop + 10:
            t = time.perf_counter()
            r = await pool.post("/api/v2/generate/text/pop", owner, _pop_body(slot))
            out["pop"].append(time.perf_counter() - t)
            if r.status_code != 200:
                out["errors"].append(f"pop {r.status_code} {r.text[:200]}")
                await asyncio.sleep(0.05)
                continue
            ids = r.json().get("ids") or []
            if not ids:
                out["empty"] += 1
                await asyncio.sleep(0.01)
        for gen_id in ids:
            t = time.perf_counter()
            r = await pool.post("/api/v2/generate/text/submit", owner,
                                {"id": gen_id, "generation": "w" * 60, "state": "ok"})  # fmt: skip
            out["submit"].append(time.perf_counter() - t)
            if r.status_code != 200:
                out["errors"].append(f"submit {r.status_code} {r.text[:200]}")
                continue
            if time.monotonic() <= stop:
                out["cycles"] += 1
                out["cycle"].append(time.perf_counter() - began)


async def _measure(servers: list[Server], keys: dict[str, list[str]], workers: int, seconds: float,
                   db: str, stack: str) -> CycleResult:  # fmt: skip
    pool = Pool(servers, workers)
    try:
        for slot in range(workers):  # check every worker in first, so creations find an eligible one
            await pool.post("/api/v2/generate/text/pop", keys["owners"][slot], _pop_body(slot))
        out: dict[str, Any] = {"create": [], "pop": [], "submit": [], "cycle": [], "cycles": 0, "empty": 0,
                               "errors": []}  # fmt: skip
        pgids = {s.process.pid for s in servers if s.process is not None}
        (cpu0, pg0), client0, started = _cpu_seconds(pgids), time.process_time(), time.monotonic()
        stop = started + seconds
        await asyncio.gather(*(_slot(pool, i, keys["owners"][i], keys["registered"][i], stop, out)
                               for i in range(workers)))  # fmt: skip
        (cpu1, pg1), client1 = _cpu_seconds(pgids), time.process_time()
    finally:
        await pool.close()
    ms = {k: [v * 1000 for v in out[k]] for k in ("create", "pop", "submit", "cycle")}

    def p(k: str, q: float) -> float:
        return pct(ms[k], q) if ms[k] else float("nan")

    def per_cycle(seconds_used: float) -> float | None:
        return seconds_used * 1000 / out["cycles"] if out["cycles"] else None

    return CycleResult(
        db=db, stack=stack, processes=len(servers), workers=workers, seconds=seconds, cycles=out["cycles"],
        empty_pops=out["empty"], errors=len(out["errors"]), per_second=out["cycles"] / seconds,
        create_p50=p("create", 0.5), pop_p50=p("pop", 0.5), submit_p50=p("submit", 0.5),
        cycle_p50=p("cycle", 0.5), cycle_p99=p("cycle", 0.99),
        server_cpu_ms_per_cycle=per_cycle(cpu1 - cpu0),
        postgres_cpu_ms_per_cycle=per_cycle(pg1 - pg0) if db == "postgresql" else None,
        client_cpu_ms_per_cycle=per_cycle(client1 - client0),
        errors_seen=sorted(set(out["errors"]))[:5],
    )  # fmt: skip


async def run_cycles(db: str, pg_url: str, processes: int, worker_counts: list[int], seconds: float,
                     stack: str = "horde-lite", route: Callable[[str], Awaitable[str]] | None = None,
                     database: dict[str, object] | None = None) -> list[CycleResult]:  # fmt: skip
    """Fresh database, `processes` servers on it (started as `stack` says), then each worker count
    in turn. `route`: the URL the servers reach the set-up database by (e.g. through PgBouncer);
    `database`: their `[database]` settings."""
    most = max(worker_counts)
    with tempfile.TemporaryDirectory(prefix="hl-perf-") as tmp:
        work = Path(tmp)
        url = await fresh_bench_database(db, pg_url, BENCH_PG_DB, work, "cycles.db")
        engine = make_engine(url)
        try:
            keys = await set_up_users(engine, most, most)
        finally:
            await engine.dispose()
        served = url if route is None else await route(url)
        env = server_env(served, {**LIMITS_OFF, "database": database or {}})
        servers = [Server(i, free_port(), work, env, stack=stack) for i in range(processes)]
        try:
            await asyncio.gather(*(s.start() for s in servers))
            return [await _measure(servers, keys, n, seconds, db, stack) for n in worker_counts]
        finally:
            for s in servers:
                s.stop()
