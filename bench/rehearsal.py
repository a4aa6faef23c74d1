"""The multi-host rehearsal: three `horde-lite run` processes ("hosts") behind HAProxy, on PgBouncer
in front of a throwaway PostgreSQL server, under simulated workers and clients; one host SIGKILLed
and restarted, later PostgreSQL restarted, then a drain and a report. Exits 1 when an invariant
fails.

    .venv/bin/python -m bench.rehearsal --small            # the run CI uses (under 2 minutes)
    .venv/bin/python -m bench.rehearsal --seconds 300

Everything runs on loopback and in temp directories, and is stopped at the end: the machine's own
PostgreSQL is not touched. bench/README.md describes the set-up and the report.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from bench.rehearsal_stack import SERVED_BY, Proxy, missing_binaries, pgbouncer_for
from bench.soak import (
    EXPIRY,
    OVERRIDES,
    WORKER_KINDS,
    collect_failures,
    drain,
    owner_of,
    print_database,
    print_traffic,
    print_verdict,
    set_up_users,
    shared_keys,
)
from bench.soak_load import (
    CALL_TIMEOUT,
    SMALL,
    Cluster,
    Requesters,
    Tally,
    WorkerSpec,
    run_client,
    run_worker,
)
from bench.soak_load import waiting_pops as probe_waiting_pops
from bench.soak_servers import Server, free_port, server_env
from horde_lite.db import migrate
from horde_lite.db.engine import make_engine
from tests.support.invariants import check
from tests.support.postgres import FAST_OPTIONS, ThrowawayServer

DATABASE = "horde"
HOSTS = 3
WAIT_SECONDS = 20  # a waiting pop's bound, when the servers have waiting pops
# The server's own settings: room for PgBouncer's pool, each host's LISTEN and queue-copy
# connections and the rehearsal's own.
PG_OPTIONS = f"{FAST_OPTIONS} -c max_connections=300"
DRAIN_LIMIT = 30 + EXPIRY + 15  # the soak's: the longest lease, an expiry, the sweep and slack
HAMMER_SECONDS = 50.0  # under one rate-limit window (a minute), so the bound is one window's
HAMMER_RATE = 4.0  # create calls a second from the one hammering key
PROBE_INTERVAL = 0.2


@dataclass
class Fault:
    what: str
    at: float  # monotonic
    took: float = 0.0  # the action itself (a restart's)
    seen_down: float | None = None  # the proxy's health checks marked the host down
    back: float | None = None  # the proxy had the restarted host back in rotation
    errors: Counter[str] = field(default_factory=Counter)  # during the window after it


@dataclass
class Probe:
    """A database read through the proxy every PROBE_INTERVAL: (monotonic time, answered 200)."""

    results: list[tuple[float, bool]] = field(default_factory=list)

    def outage(self, start: float, end: float) -> tuple[int, float]:
        """Failed probes in [start, end), and the seconds from `start` to the first success after the
        last failure (0: none failed)."""
        window = [(t, ok) for t, ok in self.results if start <= t < end]
        failed = [t for t, ok in window if not ok]
        if not failed:
            return 0, 0.0
        after = [t for t, ok in window if ok and t > failed[-1]]
        return len(failed), (after[0] if after else end) - start


@dataclass
class Hammer:
    """One key's create calls through the proxy: admitted (202) and refused (429) per host."""

    admitted: Counter[str] = field(default_factory=Counter)
    limited: Counter[str] = field(default_factory=Counter)
    other: Counter[str] = field(default_factory=Counter)
    span: float = 0.0


def worker_cli_waits() -> bool:
    cli = Path(sys.executable).with_name("horde-lite")
    out = subprocess.run([str(cli), "worker", "--help"], capture_output=True, text=True, timeout=60)
    return "--wait-seconds" in out.stdout


def overrides(create_per_minute: int, direct: str) -> dict[str, dict[str, Any]]:
    """The soak's settings, the rate limits counted in the database (shared by the hosts), and the
    database through PgBouncer with LISTEN on `direct` (docs/reference/operators.md, "PgBouncer")."""
    out = {table: dict(values) for table, values in OVERRIDES.items()}
    out["ratelimit"] = {"create_per_minute": create_per_minute, "status_per_minute": 0, "store": "database"}
    out["database"] = {"pgbouncer": True, "listen_url": direct}
    return out


async def probe(cluster: Cluster, key: str, until: float, out: Probe) -> None:
    while time.monotonic() < until:
        t = time.monotonic()
        try:
            r = await cluster.http.get(f"{cluster.servers[0].base_url}/api/v2/find_user",
                                       headers={"apikey": key}, timeout=5)  # fmt: skip
            ok = r.status_code == 200
        except httpx.TransportError:
            ok = False
        out.results.append((t, ok))
        await asyncio.sleep(max(0.0, PROBE_INTERVAL - (time.monotonic() - t)))


async def hammer(cluster: Cluster, key: str, seconds: float, out: Hammer) -> None:
    """Create calls from one key as fast as HAMMER_RATE allows, through every host (round robin)."""
    body = {"prompt": "hammer", "models": [SMALL], "params": {"n": 1, "max_length": 16}}
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        t = time.monotonic()
        try:
            r = await cluster.http.post(f"{cluster.servers[0].base_url}/api/v2/generate/text/async",
                                        json=body, headers={"apikey": key}, timeout=CALL_TIMEOUT)  # fmt: skip
            host = r.headers.get(SERVED_BY, "proxy")
            if r.status_code == 202:
                out.admitted[host] += 1
            elif r.status_code == 429:
                out.limited[host] += 1
            else:
                out.other[f"{r.status_code} {host}"] += 1
        except httpx.TransportError as e:
            out.other[type(e).__name__] += 1
        await asyncio.sleep(max(0.0, 1 / HAMMER_RATE - (time.monotonic() - t)))
    out.span = time.monotonic() - start


def snapshot(tally: Tally) -> Counter[str]:
    errors: Counter[str] = Counter({"5xx": tally.calls["5xx"]})
    errors["no answer"] = tally.killed_inflight + tally.refused_down
    errors["proxy 5xx"] = tally.proxy_fault
    errors["503 DatabaseUnavailable"] = tally.fault_503
    errors["unexplained"] = len(tally.problems)
    return errors


async def chaos(
    cluster: Cluster, proxy: Proxy, servers: list[Server], pg: ThrowawayServer, start: float,
    duration: float, faults: list[Fault],
) -> None:  # fmt: skip
    """A host SIGKILLed and restarted at 25 % of the load; PostgreSQL restarted at 60 %."""
    await asyncio.sleep(max(0.0, start + duration * 0.25 - time.monotonic()))
    victim = servers[1]
    fault = Fault(f"SIGKILL host{victim.index}, restart", time.monotonic())
    faults.append(fault)
    cluster.faults.append(fault.at)
    proxy.killed_at = fault.at
    before = snapshot(cluster.tally)
    victim.kill()
    seen = asyncio.create_task(proxy.wait_state(victim, "DOWN", 10))
    await asyncio.sleep(1.0)  # down a moment, as a crashed host is before its supervisor restarts it
    began = time.monotonic()
    await victim.start()
    fault.took = time.monotonic() - began
    cluster.faults.append(time.monotonic())
    fault.seen_down = await seen
    back = await proxy.wait_state(victim, "UP", 20)
    fault.back = None if back is None else time.monotonic() - fault.at

    await asyncio.sleep(max(0.0, start + duration * 0.6 - time.monotonic()))
    fault.errors = snapshot(cluster.tally) - before
    fault = Fault("PostgreSQL restart -m fast", time.monotonic())
    faults.append(fault)
    cluster.faults.append(fault.at)
    before = snapshot(cluster.tally)
    await asyncio.to_thread(pg.restart)
    fault.took = time.monotonic() - fault.at
    cluster.faults.append(time.monotonic())
    await asyncio.sleep(max(0.0, start + duration - time.monotonic()))
    fault.errors = snapshot(cluster.tally) - before


async def rehearse(args: argparse.Namespace, workdir: Path) -> int:
    missing = missing_binaries()
    if missing:
        raise SystemExit(f"rehearsal: needs {', '.join(missing)}")
    notes: list[str] = []
    pg = ThrowawayServer.create(PG_OPTIONS)
    if isinstance(pg, str):
        raise SystemExit(f"rehearsal: {pg}")
    bouncer = pgbouncer_for(pg)
    servers: list[Server] = []
    proxy: Proxy | None = None
    clis: list[subprocess.Popen[bytes]] = []
    try:
        await asyncio.to_thread(pg.start)
        admin = await asyncpg.connect(host="127.0.0.1", port=pg.port, user="postgres", database="postgres")
        await admin.execute(f"CREATE DATABASE {DATABASE}")
        # Behind PgBouncer the hosts cannot turn JIT off at connect: the database does, as the
        # operators' docs say ("PgBouncer").
        await admin.execute(f"ALTER DATABASE {DATABASE} SET jit = off")
        await admin.close()
        direct = pg.url(DATABASE)
        await asyncio.to_thread(migrate.upgrade, direct)
        try:
            await asyncio.to_thread(bouncer.start)
        except RuntimeError as exc:
            raise SystemExit(f"rehearsal: {exc}") from exc
        engine = make_engine(direct, null_pool=True)
        keys = await set_up_users(engine, owners=8, requesters=args.clients + 2)

        env = server_env(bouncer.url_for(DATABASE), overrides(args.create_per_minute, direct))
        via = f"PgBouncer (transaction pooling, :{bouncer.port}); LISTEN on the direct URL"
        servers = [Server(i, free_port(), workdir, env) for i in range(HOSTS)]
        await asyncio.gather(*(s.start() for s in servers))
        proxy = Proxy(servers, workdir)
        await proxy.start()

        tally = Tally()
        cluster = Cluster([proxy], tally)
        waiting = await probe_waiting_pops(cluster.http, proxy.base_url, keys["owners"][0], "rehearsal-probe")
        if not waiting:
            notes.append("waiting pops (`wait_seconds`) are not available here: workers poll")
        clis = start_cli_workers(args, proxy, keys["owners"], workdir, waiting, notes)
        hammer_key = keys["registered"].pop()
        probe_key = keys["registered"].pop()
        shared = await shared_keys(cluster, keys["registered"][0])
        who = Requesters(keys["registered"], keys["poor"][0], shared)
        rng = random.Random(args.seed)
        duration = args.seconds
        start = time.monotonic()
        load_end = start + duration
        drain_end = load_end + DRAIN_LIMIT
        print(f"rehearsal: {HOSTS} hosts behind HAProxy (:{proxy.port}) on {via}, PostgreSQL at :{pg.port}; "
              f"{args.workers} workers, {len(clis)} `horde-lite worker` processes, {args.clients} clients, "
              f"{duration:.0f} s of load (work directory {workdir})", flush=True)  # fmt: skip
        for note in notes:
            print(f"  note: {note}", flush=True)
        wait = WAIT_SECONDS if waiting else 0
        workers = [
            WorkerSpec(
                f"rehearsal-worker-{i:02d}",
                owner_of(keys["owners"], i),
                WORKER_KINDS[i % len(WORKER_KINDS)],
                wait,
            )
            for i in range(args.workers)
        ]
        worker_tasks = [
            asyncio.create_task(run_worker(cluster, w, drain_end, load_end, rng.randrange(2**32)))
            for w in workers
        ]
        waits = {"poll": (0.5, 1.5), "v1": 20 + 30.0}
        client_tasks = [
            asyncio.create_task(run_client(cluster, who, load_end, drain_end, rng.randrange(2**32), waits))
            for _ in range(args.clients)
        ]
        faults: list[Fault] = []
        probed = Probe()
        hammered = Hammer()
        probe_task = asyncio.create_task(probe(cluster, probe_key, load_end, probed))
        await asyncio.gather(
            *client_tasks,
            chaos(cluster, proxy, servers, pg, start, duration, faults),
            hammer(cluster, hammer_key, min(HAMMER_SECONDS, duration), hammered),
            probe_task,
        )
        settled_at = await drain(engine, drain_end)
        for task in worker_tasks:
            task.cancel()
        await asyncio.gather(*worker_tasks, return_exceptions=True)
        drained_in = (settled_at or time.monotonic()) - load_end
        await cluster.http.aclose()
        report = await check(engine, drained=True)
        await engine.dispose()
    finally:
        for cli in clis:
            cli.terminate()
        for cli in clis:
            try:
                cli.wait(15)
            except subprocess.TimeoutExpired:
                cli.kill()
        if proxy is not None:
            proxy.stop()
        for server in servers:
            server.stop()
        keep_logs(workdir, {"pgbouncer.log": bouncer.log, "postgresql.log": Path(pg.log)})
        await asyncio.to_thread(bouncer.stop)
        await asyncio.to_thread(pg.stop)

    failures = collect_failures(tally, report, servers, settled_at is not None, DRAIN_LIMIT)
    failures += [f"the horde-lite worker process {i} stopped during the run (rc {rc})"
                 for i, rc in enumerate(c.returncode for c in clis) if rc not in (0, -15)]  # fmt: skip
    print()
    print(f"===== rehearsal report: {HOSTS} hosts behind HAProxy on {via}, {duration:.0f} s of load, "
          f"{args.workers} workers, {args.clients} clients =====")  # fmt: skip
    for note in notes:
        print(f"note: {note}")
    print_faults(faults, probed, start, load_end)
    print_traffic(tally, report, servers)
    failures += print_limits(hammered, args.create_per_minute, args.expect_shared_limits)
    print(f"drain                 {'settled' if settled_at else 'NOT settled'} in {drained_in:.1f} s")
    print_database(report)
    return print_verdict(failures)


def keep_logs(workdir: Path, logs: dict[str, Path]) -> None:
    """Copy PgBouncer's and PostgreSQL's logs into the work directory, which a failed run keeps:
    their own temp directories go with them."""
    for name, path in logs.items():
        if path.exists():
            shutil.copyfile(path, workdir / name)


def start_cli_workers(
    args: argparse.Namespace, proxy: Proxy, owners: list[str], workdir: Path, waiting: bool, notes: list[str]
) -> list[subprocess.Popen[bytes]]:
    """Real `horde-lite worker --simulate` processes through the proxy, as an operator runs them."""
    if not args.cli_workers:
        return []
    cli = Path(sys.executable).with_name("horde-lite")
    extra: list[str] = []
    if waiting and worker_cli_waits():
        extra = ["--wait-seconds", str(WAIT_SECONDS)]
    elif waiting:
        notes.append("`horde-lite worker --wait-seconds` is not an option here: the CLI workers poll")
    out: list[subprocess.Popen[bytes]] = []
    for i in range(args.cli_workers):
        log = (workdir / f"cli-worker-{i}.log").open("wb")
        out.append(subprocess.Popen(
            [str(cli), "worker", "--horde", proxy.base_url, "--key", owners[i % 6], "--name",
             f"rehearsal-cli-{i}", "--simulate", "1000", "--model", SMALL, "--threads", "2",
             "--drain-seconds", "5", *extra],
            stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
        ))  # fmt: skip
    return out


def print_faults(faults: list[Fault], probed: Probe, start: float, load_end: float) -> None:
    print("faults (s from the start of the load; the probe reads the database through the proxy every "
          f"{PROBE_INTERVAL:g} s):")  # fmt: skip
    print("| fault | at s | action s | proxy saw it down s | back in rotation s | probe failures | "
          "probe outage s | errors in its window |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    ends = [f.at for f in faults[1:]] + [load_end]
    for fault, end in zip(faults, ends, strict=True):
        failed, outage = probed.outage(fault.at, end)
        errors = ", ".join(f"{k} {v}" for k, v in sorted(fault.errors.items()) if v) or "none"
        print(f"| {fault.what} | {fault.at - start:.1f} | {fault.took:.1f} | {_s(fault.seen_down)} | "
              f"{_s(fault.back)} | {failed} | {outage:.1f} | {errors} |")  # fmt: skip
    total_failed = sum(1 for _, ok in probed.results if not ok)
    print(f"probe                 {len(probed.results)} reads, {total_failed} failed")


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def print_limits(hammered: Hammer, per_minute: int, expect_shared: bool) -> list[str]:
    """One key's creations through every host within one window: at most `per_minute` admitted
    when the hosts share their counts, up to that per host when each counts on its own."""
    hosts = sorted(set(hammered.admitted) | set(hammered.limited))
    total = sum(hammered.admitted.values())
    per_host = ", ".join(
        f"{h}: {hammered.admitted[h]} admitted, {hammered.limited[h]} limited" for h in hosts
    )
    other = f"; other: {dict(hammered.other)}" if hammered.other else ""
    print(f"rate limit            one key, {HAMMER_RATE:g} creations/s for {hammered.span:.0f} s through the "
          f"proxy, create_per_minute = {per_minute}: {total} admitted ({per_host}{other})")  # fmt: skip
    verdict = (
        "within the limit across hosts" if total <= per_minute else f"{total / per_minute:.1f} x the limit"
    )
    print(f"                      {verdict} (the bound is checked with --expect-shared-limits)")
    if expect_shared and total > per_minute:
        return [f"limits held across hosts: {total} creations admitted in one window, limit {per_minute}"]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rehearsal", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=180.0, help="length of the load (default 180)")
    parser.add_argument("--small", action="store_true",
                        help="the CI size: 40 s of load, 12 workers, 10 clients")  # fmt: skip
    parser.add_argument("--workers", type=int, default=32, help="in-process simulated workers (32)")
    parser.add_argument(
        "--cli-workers", type=int, default=2, help="`horde-lite worker --simulate` processes (2)"
    )
    parser.add_argument("--clients", type=int, default=24)
    parser.add_argument("--create-per-minute", type=int, default=20,
                        help="[ratelimit] create_per_minute of the hosts (20)")  # fmt: skip
    parser.add_argument("--expect-shared-limits", action="store_true",
                        help="fail unless one key got at most that many across hosts")  # fmt: skip
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    if args.small:
        args.seconds, args.workers, args.clients = min(args.seconds, 40.0), 12, 10
    if not 1 <= args.workers <= 200 or not 1 <= args.clients <= 200 or not 0 <= args.cli_workers <= 6:
        parser.error("--workers and --clients must be 1..200, --cli-workers 0..6")
    if args.seconds < 10 or args.create_per_minute < 1:
        parser.error("--seconds must be at least 10 and --create-per-minute at least 1")
    workdir = Path(tempfile.mkdtemp(prefix="horde-lite-rehearsal-"))
    rc = 2
    try:
        rc = asyncio.run(rehearse(args, workdir))
        return rc
    finally:
        if args.keep or rc != 0:  # a failed run keeps its logs
            print(f"rehearsal: kept {workdir} (host, HAProxy, worker, PgBouncer and PostgreSQL logs)")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
