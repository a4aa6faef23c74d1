"""The fleet bench: thousands of idle simulated workers (each its own name, a few owners) popping a
real `horde-lite run` process on PostgreSQL over HTTP, as upstream's workers poll (a pop every 2 s,
jittered) or with waiting pops (`wait_seconds`); a client creates a request every few seconds.
It prints pops per second, the server's and PostgreSQL's CPU per pop, pop latencies and the time
from a request's creation to its first pop, for each variant side by side.

    .venv/bin/python -m bench.fleet --workers 200 --seconds 20          # both variants
    .venv/bin/python -m bench.fleet --workers 2000 --seconds 30 --polling

The database (`hl_fleet` on --pg-url's server, loopback only) is created and dropped by the bench.
One asyncio process drives every worker, each on a keep-alive connection of its own
(bench/raw_http.py). bench/README.md
describes the measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import resource
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from sqlalchemy.engine import make_url

from bench.admission import pct
from bench.perf_cycles import proc_cpu
from bench.raw_http import RawConnection
from bench.soak import set_up_users
from bench.soak_load import waiting_pops
from bench.soak_servers import LIMITS_OFF, LOOPBACK, Server, free_port, fresh_postgres, server_env
from horde_lite.db import migrate
from horde_lite.db.engine import make_engine

DATABASE = "hl_fleet"
DEFAULT_PG = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
MODEL = "fleet/Idle-8B"
OWNERS = 8
POLL_SECONDS = 2.0  # upstream's workers pop about this often
POLL_JITTER = 0.5
WAIT_SECONDS = 20  # a waiting pop's bound
CREATE_EVERY = (2.0, 4.0)  # seconds between two of the client's requests
WARM_UP = 10.0  # seconds of the fleet's own pops before the window opens
REGISTERING = 100  # first pops in flight at once while the workers register
CALL_TIMEOUT = 30.0
MARK = "fleet probe "


@dataclass
class Window:
    """What happened inside the measured window."""

    start: float = math.inf
    end: float = math.inf
    pops: int = 0
    found: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    latency: list[float] = field(default_factory=list)  # ms: polling pops, or waiting pops with a job
    waited: list[float] = field(default_factory=list)  # ms a waiting pop answered empty took in all
    created: dict[int, float] = field(default_factory=dict)  # request mark -> monotonic time of creation
    first_pop: dict[int, float] = field(default_factory=dict)  # request mark -> ms until a worker got it

    def inside(self, t: float) -> bool:
        return self.start <= t < self.end

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


@dataclass
class Row:
    variant: str
    workers: int
    seconds: float
    available: bool = True
    pops_per_second: float = 0.0
    found: int = 0
    server_ms_per_pop: float | None = None
    server_cores: float | None = None
    postgres_ms_per_pop: float | None = None
    client_ms_per_pop: float | None = None
    latency: tuple[float, float] | None = None
    waited_overhead: tuple[float, float] | None = None
    first_pop: tuple[float, float] | None = None
    requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    load: tuple[float, float] = (0.0, 0.0)  # the machine's 1-minute load average at the window's start, end
    registered: tuple[float, float] | None = None  # the workers' first pops: seconds, server CPU ms each


def _pop_body(i: int, wait: int) -> dict[str, Any]:
    body: dict[str, Any] = {"name": f"fleet-worker-{i:05d}", "models": [MODEL], "max_length": 512,
                            "max_context_length": 2048, "bridge_agent": "fleet:1:bench"}  # fmt: skip
    if wait:
        body["wait_seconds"] = wait
    return body


async def register(conns: list[RawConnection], owners: list[str], server: Server) -> tuple[float, float]:
    """Each worker's first pop (no wait), which creates it: a cost paid once per worker, kept out of
    the window. Returns (seconds, server CPU ms per first pop)."""
    assert server.process is not None
    began, (cpu0, _) = time.monotonic(), cpu_of(set(), server.process.pid)
    slots = asyncio.Semaphore(REGISTERING)

    async def first(i: int) -> None:
        async with slots:
            status, answer = await conns[i].request(
                "POST", "/api/v2/generate/text/pop", _pop_body(i, 0), {"apikey": owners[i % OWNERS]}
            )
        if status != 200:
            raise SystemExit(f"fleet: worker {i}'s first pop: {status} {answer}")

    await asyncio.gather(*(first(i) for i in range(len(conns))))
    cpu1, _ = cpu_of(set(), server.process.pid)
    return time.monotonic() - began, (cpu1 - cpu0) * 1000 / max(1, len(conns))


async def worker(conn: RawConnection, key: str, i: int, wait: int, stop: float, w: Window,
                 rng: random.Random) -> None:  # fmt: skip
    body = _pop_body(i, wait)
    auth = {"apikey": key}
    await asyncio.sleep(rng.uniform(0, POLL_SECONDS))  # the fleet does not start in step
    while time.monotonic() < stop:
        began = time.monotonic()
        try:
            status, job = await conn.request("POST", "/api/v2/generate/text/pop", body, auth)
        except (OSError, asyncio.IncompleteReadError) as e:
            w.error(type(e).__name__)
            await asyncio.sleep(1)
            continue
        answered = time.monotonic()
        if status != 200 or not isinstance(job, dict):
            w.error(f"pop {status} {job.get('rc') if isinstance(job, dict) else ''}".strip())
            await asyncio.sleep(1)
            continue
        counted = w.inside(answered)
        elapsed = (answered - began) * 1000
        if counted:
            w.pops += 1
        if job.get("id"):
            if counted:
                w.found += 1
            prompt = str((job.get("payload") or {}).get("prompt", ""))
            if prompt.startswith(MARK):
                mark = int(prompt[len(MARK) :])
                if mark in w.created:
                    w.first_pop.setdefault(mark, (answered - w.created[mark]) * 1000)
            if counted:
                w.latency.append(elapsed)
            submit = {"id": job["id"], "generation": "done", "state": "ok"}
            status, _ = await conn.request("POST", "/api/v2/generate/text/submit", submit, auth)
            if status != 200:
                w.error(f"submit {status}")
        elif counted:
            (w.waited if wait else w.latency).append(elapsed)
        if not wait:
            await asyncio.sleep(max(0.0, rng.uniform(POLL_SECONDS - POLL_JITTER, POLL_SECONDS + POLL_JITTER)
                                         - (time.monotonic() - began)))  # fmt: skip
    conn.close()


async def client(conn: RawConnection, key: str, stop: float, w: Window, rng: random.Random) -> None:
    """A request every few seconds inside the window; its mark in the prompt tells the worker that
    gets it which one it is (time from the creation call's start: an upper bound)."""
    mark = 0
    await asyncio.sleep(max(0.0, w.start - time.monotonic()))
    while time.monotonic() < stop:
        mark += 1
        body = {"prompt": f"{MARK}{mark}", "models": [MODEL], "params": {"n": 1, "max_length": 16}}
        w.created[mark] = time.monotonic()
        status, _ = await conn.request("POST", "/api/v2/generate/text/async", body, {"apikey": key})
        if status != 202:
            w.error(f"create {status}")
            del w.created[mark]
        await asyncio.sleep(rng.uniform(*CREATE_EVERY))
    conn.close()


async def backend_pids(admin: asyncpg.Connection) -> set[int]:
    rows = await admin.fetch("SELECT pid FROM pg_stat_activity WHERE datname = $1", DATABASE)
    return {int(r["pid"]) for r in rows}


def cpu_of(pids: set[int], pgrp: int) -> tuple[float, dict[int, float]]:
    """The server's process group's CPU, and each of these PostgreSQL backends' CPU."""
    stats = proc_cpu()
    return sum(p.used for p in stats if p.pgrp == pgrp), {p.pid: p.used for p in stats if p.pid in pids}


async def run_variant(variant: str, args: argparse.Namespace, work: Path) -> Row:
    url = make_url(args.pg_url).set(database=DATABASE).render_as_string(hide_password=False)
    row = Row(variant, args.workers, args.seconds)
    await fresh_postgres(url)
    await asyncio.to_thread(migrate.upgrade, url)
    engine = make_engine(url, null_pool=True)
    keys = await set_up_users(engine, OWNERS, 1)
    await engine.dispose()
    server = Server(0, free_port(), work, server_env(url, LIMITS_OFF))
    parsed = make_url(args.pg_url)
    admin = await asyncpg.connect(host=parsed.host, port=parsed.port or 5432, user=parsed.username,
                                  password=parsed.password, database="postgres")  # fmt: skip
    http = httpx.AsyncClient(timeout=CALL_TIMEOUT)  # the probe for waiting pops
    try:
        await server.start()
        wait = 0
        if variant == "waiting":
            if not await waiting_pops(http, server.base_url, keys["owners"][0], "fleet-probe"):
                row.available = False
                return row
            wait = WAIT_SECONDS
        owners = keys["owners"]
        conns = [RawConnection(LOOPBACK, server.port) for _ in range(args.workers)]
        row.registered = await register(conns, owners, server)
        w = Window()
        rng = random.Random(args.seed)
        begin = time.monotonic()
        w.start = begin + WARM_UP
        w.end = w.start + args.seconds
        # After the window: the pops still waiting are answered, the last request is taken.
        stop = w.end + (WAIT_SECONDS if wait else POLL_SECONDS + POLL_JITTER + 1)
        tasks = [asyncio.create_task(worker(conns[i], owners[i % OWNERS], i, wait, stop, w,
                                            random.Random(rng.random())))
                 for i in range(args.workers)]  # fmt: skip
        tasks.append(asyncio.create_task(client(RawConnection(LOOPBACK, server.port), keys["registered"][0],
                                                w.end, w, rng)))  # fmt: skip
        assert server.process is not None
        await asyncio.sleep(max(0.0, w.start - time.monotonic()))
        pids0 = await backend_pids(admin)
        load0 = os.getloadavg()[0]
        (server0, pg0), client0 = cpu_of(pids0, server.process.pid), time.process_time()
        await asyncio.sleep(max(0.0, w.end - time.monotonic()))
        pids1 = await backend_pids(admin)
        row.load = (load0, os.getloadavg()[0])
        (server1, pg1), client1 = cpu_of(pids0 | pids1, server.process.pid), time.process_time()
        await asyncio.gather(*tasks)
    finally:
        await http.aclose()
        server.stop()
        await admin.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        await admin.close()
    # Backends that ended inside the window are missed; new ones count from zero.
    postgres = sum(used - pg0.get(pid, 0.0) for pid, used in pg1.items())
    seconds = w.end - w.start
    row.pops_per_second = w.pops / seconds
    row.found = w.found
    if w.pops:
        row.server_ms_per_pop = (server1 - server0) * 1000 / w.pops
        row.postgres_ms_per_pop = postgres * 1000 / w.pops
        row.client_ms_per_pop = (client1 - client0) * 1000 / w.pops
    row.server_cores = (server1 - server0) / seconds
    if w.latency:
        row.latency = (pct(w.latency, 0.5), pct(w.latency, 0.99))
    if w.waited:
        over = [max(0.0, v - wait * 1000) for v in w.waited]
        row.waited_overhead = (pct(over, 0.5), pct(over, 0.99))
    got = list(w.first_pop.values())
    row.requests = len(w.created)
    if got:
        row.first_pop = (pct(got, 0.5), pct(got, 0.99))
    missing = len(w.created) - len(got)
    if missing:
        row.errors["requests never popped in the run"] = missing
    row.errors.update(w.errors)
    return row


def _pair(v: tuple[float, float] | None) -> str:
    return "-" if v is None else f"{v[0]:.0f} / {v[1]:.0f}"


def _num(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def print_table(rows: list[Row]) -> None:
    lines = [
        ("workers", lambda r: f"{r.workers:,}"),
        (
            "first pops (registration, before the window): s / server CPU ms each",
            lambda r: "-" if r.registered is None else f"{r.registered[0]:.1f} / {r.registered[1]:.2f}",
        ),
        ("measured s", lambda r: f"{r.seconds:.0f}"),
        ("pops/s", lambda r: f"{r.pops_per_second:.1f}"),
        ("pops that got a job", lambda r: str(r.found)),
        ("server CPU ms/pop", lambda r: _num(r.server_ms_per_pop)),
        ("server CPU, cores", lambda r: _num(r.server_cores)),
        ("PostgreSQL CPU ms/pop", lambda r: _num(r.postgres_ms_per_pop)),
        ("bench client CPU ms/pop", lambda r: _num(r.client_ms_per_pop)),
        ("pop p50 / p99 ms (polling: every pop; waiting: pops with a job)", lambda r: _pair(r.latency)),
        (f"waiting pop beyond its {WAIT_SECONDS} s, p50 / p99 ms", lambda r: _pair(r.waited_overhead)),
        ("created to first pop p50 / p99 ms", lambda r: _pair(r.first_pop)),
        ("requests created", lambda r: str(r.requests)),
        ("load average (1 min), start / end", lambda r: f"{r.load[0]:.1f} / {r.load[1]:.1f}"),
        ("errors", lambda r: ", ".join(f"{k}: {v}" for k, v in r.errors.items()) or "none"),
    ]
    print("| | " + " | ".join(r.variant for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for label, get in lines:
        print(f"| {label} | " + " | ".join(get(r) if r.available else "not available" for r in rows) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2000, help="simulated workers (2,000)")
    parser.add_argument("--seconds", type=float, default=30.0, help="the measured window (30 s)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--polling", action="store_true", help="only the polling fleet")
    which.add_argument("--waiting", action="store_true", help="only the waiting pops")
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="the PostgreSQL server to make hl_fleet on")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if not 1 <= args.workers <= 5000 or not 5 <= args.seconds <= 600:
        parser.error("--workers must be 1..5000 and --seconds 5..600")
    if make_url(args.pg_url).host not in ("localhost", "127.0.0.1", "::1"):
        parser.error("--pg-url: a loopback server only (the bench drops and creates hl_fleet on it)")
    # A connection per worker: raise this process's open-file limit as far as it may go.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, args.workers * 2 + 256)), hard))
    variants = ["polling"] if args.polling else ["waiting"] if args.waiting else ["polling", "waiting"]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="horde-lite-fleet-") as tmp:
        for variant in variants:
            print(f"fleet: {variant}, {args.workers} workers registered, then {WARM_UP:.0f} s warm-up + "
                  f"{args.seconds:.0f} s measured", flush=True)  # fmt: skip
            rows.append(asyncio.run(run_variant(variant, args, Path(tmp))))
    print()
    print_table(rows)
    return 1 if any(r.available and r.errors for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
