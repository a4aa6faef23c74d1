"""The soak: two real server processes on one database under simulated workers and clients, with a
server SIGKILLed and restarted and (on PostgreSQL) the servers' database connections terminated,
then a drain and an invariant report. Exits 1 when an invariant fails.

    .venv/bin/python -m bench.soak --minutes 5
    .venv/bin/python -m bench.soak --seconds 45 --db postgresql+asyncpg://postgres@127.0.0.1:5432/hl_soak

The database is a fresh SQLite file in a temporary directory by default; a PostgreSQL URL names a
database of the soak's own, which is dropped and recreated. Servers listen on loopback only. The
servers run with short leases, sweeps and expiries (see OVERRIDES) so lapses happen under load and
a drain takes seconds, and with the rate limits off (every simulated caller shares one address).
bench/README.md describes the load and the report.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.soak_load import Cluster, Requesters, Tally, WorkerSpec, run_client, run_worker
from bench.soak_servers import (
    Server,
    free_port,
    fresh_postgres,
    is_postgres,
    server_env,
    terminate_connections,
)
from horde_lite.accounts import kudos as ledger
from horde_lite.accounts.users import create_user
from horde_lite.clock import Clock
from horde_lite.db import migrate
from horde_lite.db.engine import make_engine, make_sessionmaker
from horde_lite.db.models import Generation, TextRequest
from tests.support.invariants import Report, check

LEASE = 8.0
EXPIRY = 20.0
OVERRIDES: dict[str, dict[str, object]] = {
    "lease": {
        "base_seconds": LEASE,
        "preparation_allowance_seconds": 2,
        "progress_extension_seconds": 4,
        "max_seconds": 30,
        "sweep_seconds": 1,
    },
    "request": {"expiry_seconds": EXPIRY, "max_waiting_per_user": 1000},
    # Up to 200 workers on 8 owners, a hostile worker under 3 names: room for them all.
    "worker": {"max_per_user": 100},
    "chat": {"grace_seconds": 5, "max_queue_wait_seconds": 20},
    "ratelimit": {"create_per_minute": 0, "status_per_minute": 0},
}
# The drain: the longest a job can still run (a lease stretched by progress posts) plus an expiry
# of a request no worker can take, plus the sweep and some slack.
DRAIN_LIMIT = 30 + EXPIRY + 15
WORKER_KINDS = ("text", "text", "chat", "chat", "streamer", "faulty", "lapser", "batcher", "hostile")
FAILING_KINDS = ("faulty", "lapser", "hostile")


def owner_of(owners: list[str], i: int) -> str:
    """Honest workers share most owners; the failing kinds have two owners of their own, which the
    per-owner failure rule puts in maintenance without touching the honest ones."""
    if WORKER_KINDS[i % len(WORKER_KINDS)] in FAILING_KINDS:
        return owners[-1 - i % 2]
    return owners[i % (len(owners) - 2)]


async def set_up_users(engine: AsyncEngine, owners: int, requesters: int) -> dict[str, list[str]]:
    """What `horde-lite users create NAME --kudos N` does, in one transaction."""
    now = Clock().now()
    keys: dict[str, list[str]] = {"owners": [], "registered": [], "poor": []}
    async with make_sessionmaker(engine)() as session, session.begin():
        for group, count, kudos in (
            ("owners", owners, 0.0),
            ("registered", requesters, 200_000.0),
            ("poor", 1, 30.0),
        ):
            for i in range(count):
                user, key = await create_user(session, f"soak-{group}-{i}", now)
                if kudos:
                    await ledger.record(session, user.id, kudos, "grant", "soak", now)
                keys[group].append(key)
    return keys


async def shared_keys(cluster: Cluster, owner_key: str) -> list[str]:
    """A key with a small budget and an unlimited one, made over HTTP as their owner would."""
    made: list[str] = []
    for body in ({"kudos": 300, "name": "soak-budget"}, {"kudos": -1, "name": "soak-open"}):
        response = await cluster.call("POST", "/api/v2/sharedkeys", owner_key, body)
        if response is None or response.status_code != 200:
            raise SystemExit(f"soak: could not create a shared key: {response and response.text}")
        made.append(response.json()["id"])
    return made


async def unsettled(engine: AsyncEngine) -> tuple[int, int]:
    """(waiting requests, running jobs) right now."""
    async with engine.connect() as conn:
        waiting = await conn.scalar(
            select(func.count()).select_from(TextRequest).where(TextRequest.state == "waiting")
        )
        running = await conn.scalar(
            select(func.count()).select_from(Generation).where(Generation.state == "processing")
        )
    return int(waiting or 0), int(running or 0)


async def drain(engine: AsyncEngine, until: float) -> float | None:
    """Wait until no request waits and no job runs; the monotonic time it settled (None: not by
    `until`)."""
    while time.monotonic() < until:
        waiting, running = await unsettled(engine)
        if not waiting and not running:
            return time.monotonic()
        await asyncio.sleep(1)
    return None


async def chaos(
    cluster: Cluster, servers: list[Server], db_url: str, start: float, duration: float, log: list[str]
) -> None:
    """SIGKILL and restart a server now and then; on PostgreSQL, terminate the database connections."""
    kills = max(1, round(duration / 75))
    events = [(start + duration * (i + 0.6) / (kills + 0.5), "kill", i) for i in range(kills)]
    if is_postgres(db_url):
        terms = max(2, round(duration / 40))
        events += [(start + duration * (i + 0.3) / (terms + 0.3), "terminate", i) for i in range(terms)]
    for at, what, i in sorted(events):
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        cluster.faults.append(time.monotonic())
        if what == "kill":
            server = servers[i % len(servers)]
            server.kill()
            log.append(f"{time.monotonic() - start:6.1f}s SIGKILL server {server.index} (port {server.port})")
            await asyncio.sleep(0.5)
            await server.start()
            cluster.faults.append(time.monotonic())
            log.append(f"{time.monotonic() - start:6.1f}s server {server.index} restarted and answering")
        else:
            count = await terminate_connections(db_url)
            log.append(f"{time.monotonic() - start:6.1f}s pg_terminate_backend: {count} connections")


async def soak(args: argparse.Namespace, workdir: Path) -> int:
    duration = args.seconds if args.seconds is not None else args.minutes * 60
    db_url = args.db or f"sqlite+aiosqlite:///{workdir / 'soak.db'}"
    if is_postgres(db_url):
        await fresh_postgres(db_url)
    await asyncio.to_thread(migrate.upgrade, db_url)
    engine = make_engine(db_url, null_pool=True)  # no pooled connection for a termination to break
    keys = await set_up_users(engine, owners=8, requesters=10)
    env = server_env(db_url, OVERRIDES)
    servers = [Server(i, free_port(), workdir, env) for i in range(args.processes)]
    await asyncio.gather(*(s.start() for s in servers))
    tally = Tally()
    cluster = Cluster(servers, tally)
    chaos_log: list[str] = []
    try:
        shared = await shared_keys(cluster, keys["registered"][0])
        who = Requesters(keys["registered"], keys["poor"][0], shared)
        rng = random.Random(args.seed)
        start = time.monotonic()
        load_end = start + duration
        drain_end = load_end + DRAIN_LIMIT
        waits = {"poll": (0.5, 1.5), "v1": 20 + 30.0}
        workers = [
            WorkerSpec(
                f"soak-worker-{i:02d}", owner_of(keys["owners"], i), WORKER_KINDS[i % len(WORKER_KINDS)]
            )
            for i in range(args.workers)
        ]
        print(f"soak: {len(servers)} servers on {db_url.split('://')[0]}, {args.workers} workers, "
              f"{args.clients} clients, {duration:.0f} s of load (logs in {workdir})",
              flush=True)  # fmt: skip
        worker_tasks = [
            asyncio.create_task(run_worker(cluster, w, drain_end, load_end, rng.randrange(2**32)))
            for w in workers
        ]
        client_tasks = [
            asyncio.create_task(run_client(cluster, who, load_end, drain_end, rng.randrange(2**32), waits))
            for _ in range(args.clients)
        ]
        chaos_task = asyncio.create_task(chaos(cluster, servers, db_url, start, duration, chaos_log))
        await asyncio.gather(*client_tasks, chaos_task)
        # The drain: no new requests; workers keep taking jobs honestly; lapses and expiries run out.
        settled_at = await drain(engine, drain_end)
        for task in worker_tasks:
            task.cancel()
        await asyncio.gather(*worker_tasks, return_exceptions=True)
        drained_in = (settled_at or time.monotonic()) - load_end
    finally:
        await cluster.http.aclose()
        for server in servers:
            server.stop()
    report = await check(engine, drained=True)
    await engine.dispose()
    return print_report(
        args, db_url, servers, tally, chaos_log, report, duration, drained_in, settled_at is not None
    )


def print_report(
    args: argparse.Namespace, db_url: str, servers: list[Server], tally: Tally, chaos_log: list[str],
    report: Report, duration: float, drained_in: float, settled: bool,
) -> int:  # fmt: skip
    kills = sum(1 for line in chaos_log if "SIGKILL" in line)
    restarts = sum(1 for line in chaos_log if "restarted" in line)
    terms = sum(1 for line in chaos_log if "pg_terminate" in line)
    failures = collect_failures(tally, report, servers, settled, DRAIN_LIMIT)
    if restarts != kills:
        failures.append(f"kills survived: {kills} kills, {restarts} restarts")

    kind = db_url.split("+")[0].split(":")[0]
    print()
    print(f"===== soak report: {kind}, {duration:.0f} s of load, {len(servers)} processes, "
          f"{args.workers} workers, {args.clients} clients =====")  # fmt: skip
    for line in chaos_log:
        print(f"  {line}")
    print_traffic(tally, report, servers)
    print(f"kills survived        {restarts} of {kills} SIGKILLs; {terms} pg_terminate_backend rounds")
    print(f"drain                 {'settled' if settled else 'NOT settled'} in {drained_in:.1f} s")
    print_database(report)
    return print_verdict(failures)


def collect_failures(
    tally: Tally, report: Report, servers: list[Server], settled: bool, drain_limit: float
) -> list[str]:
    """The invariants that failed: the database's (`report`), the load's and the servers' logs'."""
    failures: list[str] = list(report.violations)
    for label in dict.fromkeys(label for label, _ in tally.problems):
        details = [d for lb, d in tally.problems if lb == label]
        failures += [f"{label}: {d}" for d in details[:10]]
        if len(details) > 10:
            failures.append(f"{label}: ... and {len(details) - 10} more")
    deadlocks = [line for s in servers for line in s.log_lines("deadlock detected")]
    failures += [f"no deadlock: {line[:300]}" for line in deadlocks[:10]]
    failures += [f"no job handed out twice: generation {g} popped twice" for g in tally.handed_twice[:10]]
    failures += [f"no generation submitted twice: {g} accepted twice" for g in tally.accepted_twice[:10]]
    if not settled:
        failures.append(f"every request final after the drain: still unsettled after {drain_limit:.0f} s")
    return failures


def print_traffic(tally: Tally, report: Report, servers: list[Server]) -> None:
    """What the load did and saw: requests, jobs, kudos, HTTP answers by kind, the servers' logs."""
    f = report.figures
    created = sum(tally.created.values()) - tally.created["refused"]
    print(f"requests created      {created}  ({_counts(tally.created)})")
    print(f"client outcomes       {_counts(tally.outcomes)}")
    print(f"jobs handed out       {tally.popped}  (submitted: {_counts(tally.submitted)}; "
          f"left to lapse: {tally.lapsed_on_purpose}; progress posts: {tally.progress_posts})")  # fmt: skip
    print(f"jobs paid             {f['jobs paid']:.0f}")
    print(f"kudos moved           {f['kudos rewarded']:.2f} earned by workers, "
          f"{f['kudos charged']:.2f} paid by requesters, "
          f"{f['kudos burned']:.0f} burned (+1 per job)")  # fmt: skip
    calls = sum(tally.calls.values())
    print(
        f"HTTP calls            {calls}  ({', '.join(f'{k}: {v}' for k, v in sorted(tally.calls.items()))})"
    )
    print(
        f"  no answer (killed process in flight): {tally.killed_inflight}; "
        f"refused while down: {tally.refused_down}; the proxy's 5xx for a killed process: {tally.proxy_fault}"
    )
    print(f"  503 DatabaseUnavailable right after a fault: {tally.fault_503}; documented 5xx (no worker, "
          f"timeout, worker failed): {tally.domain_5xx}")  # fmt: skip
    print(f"  unexplained 5xx, no answer or inconsistent status: {len(tally.problems)}")
    print("  refusals: " + ", ".join(f"{k} x{v}" for k, v in tally.rcs.most_common(12)))
    deadlocks = sum(len(s.log_lines("deadlock detected")) for s in servers)
    tracebacks = sum(len(s.log_lines("Traceback")) for s in servers)
    print(f"deadlocks in logs     {deadlocks}   (tracebacks in logs: {tracebacks})")


def print_database(report: Report) -> None:
    f = report.figures
    print(
        "database after drain  "
        + ", ".join(
            f"{k}: {v:g}" for k, v in f.items() if k.startswith(("requests", "generations", "active"))
        )
    )


def print_verdict(failures: list[str]) -> int:
    """The failures, or the invariants that held; the exit code (1: something failed)."""
    if failures:
        print(f"\nINVARIANTS FAILED ({len(failures)}):")
        for line in failures:
            print(f"  {line}")
        return 1
    print("\nall invariants hold: balances = ledger, no active hold on a finished request, jobs within n, "
          "status counts add up, one settlement per job, paid = earned + burns, queue index = requests "
          "with a job to hand out, refusals = deny-lists and failed workers and owners, no charge above "
          "its job's share of the quote, every amount finite and bounded, all final, no deadlock, "
          "no 5xx outside the killed process's calls")  # fmt: skip
    return 0


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(counter.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, default=5.0, help="length of the load (default 5)")
    length.add_argument("--seconds", type=float, default=None, help="length of the load in seconds (CI)")
    parser.add_argument(
        "--db",
        default=None,
        help="a PostgreSQL URL of the soak's own database (dropped and recreated); default: a SQLite file",
    )
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--clients", type=int, default=24)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, SQLite file)")
    args = parser.parse_args(argv)
    if not 1 <= args.workers <= 200 or not 1 <= args.clients <= 200 or not 1 <= args.processes <= 8:
        parser.error("--workers and --clients must be 1..200, --processes 1..8")
    workdir = Path(tempfile.mkdtemp(prefix="horde-lite-soak-"))
    rc = 2
    try:
        rc = asyncio.run(soak(args, workdir))
        return rc
    finally:
        if args.keep or rc != 0:  # a failed run keeps its server logs
            print(f"soak: kept {workdir} (server logs)")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
