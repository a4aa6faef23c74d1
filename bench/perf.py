"""The hot path at scale: pop (job found, nothing found, refused by a rule), request creation and
status reads with 1,000, 10,000 and 100,000 queued requests and 500 workers (in-process, through the
lifecycle's entry points), full job cycles per second over HTTP against real server processes, and
the PostgreSQL plans of the pop and the wait estimate at the largest size.

    .venv/bin/python -m bench.perf                      # both databases, the default sizes
    .venv/bin/python -m bench.perf --quick              # a smoke run (size 200, 3 s cycles)

The queue is `bench/admission.py`'s synthetic horde, with its model-less requests given the most
popular model (so a worker serving none of the queued models finds nothing), and 40 registered
requesters with nothing queued who make the measured creations. Every measured call
runs the route's own lifecycle entry point in a transaction that is rolled back at the end (the
rollback is timed, a commit's flush is not), so every sample sees the same queue.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import gc
import json
import math
import os
import random
import sys
import tempfile
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import msgspec
from sqlalchemy import event, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from bench.admission import (
    DEFAULT_PG,
    Fixture,
    build,
    close,
    fresh_database,
    horde_for,
    insert_users,
    pct,
    request_shape,
    settle,
)
from bench.cycle_floor import run_floor
from bench.perf_cycles import CycleResult, run_cycles
from bench.soak_servers import STACKS
from horde_lite.accounts.users import hash_key
from horde_lite.core.context import Caller, Horde
from horde_lite.core.errors import HordeError
from horde_lite.db.models import QueueEntry, RequestModel, TextRequest
from horde_lite.inputs import PopInput, TextRequestInput
from horde_lite.jobs import dispatch
from horde_lite.queue import queue_index
from horde_lite.requests import status
from horde_lite.requests.admission import request_text

RESULTS = Path(__file__).with_name("results")
SIZES = [1_000, 10_000, 100_000]
SQLITE_MAX = 100_000  # the largest size built on SQLite (its 100,000-request fixture takes ~40 s)
UNSERVED = "bench/Unserved-7B"
CREATORS = 40  # requesters with nothing queued, who make the measured creations
PROBES = 4  # dedicated workers per pop kind, used in turn
RUNNING = 500  # jobs being generated for "pop busy" (a tenth of the queue when that is fewer)


@dataclasses.dataclass
class BenchHorde(Horde):
    """The app's Horde whose transactions can be rolled back at the end (the measured calls, after
    flushing what their commit would write), with a hook that runs inside the transaction before
    the rollback (the EXPLAINs)."""

    rollback: bool = False
    on_end: Callable[[AsyncSession], Awaitable[None]] | None = None

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        if not self.rollback:
            async with super().transaction() as session:
                yield session
            return
        async with self.sessionmaker() as session:
            try:
                yield session
                await session.flush()  # what the commit would write (a pop's records), timed too
            finally:
                if self.on_end is not None:  # also after a refusal: its statements ran
                    await self.on_end(session)
                await session.rollback()


def bench_horde(url: str) -> BenchHorde:
    h = horde_for(url)
    return BenchHorde(**{f.name: getattr(h, f.name) for f in dataclasses.fields(Horde) if f.init})


# --- the fixture -----------------------------------------------------------------------------------


async def prepare(horde: Horde, fixture: Fixture) -> None:
    """Give the queue's model-less requests the most popular model (a model-less request is
    anyone's, so a worker serving none of the queued models would otherwise always find one), and
    add requesters with nothing queued: at 100,000 queued every fixture requester (and the
    anonymous user) is past the per-user limit of waiting requests, so its creations would all be
    `TooManyPrompts` refusals that never reach the estimate."""
    top = fixture.models[0]
    rng = random.Random(len(fixture.requester_ids))
    now = horde.clock.now()
    async with horde.transaction() as session:
        users = [{"username": f"perf-requester-{i}", "api_key_hash": hash_key(f"perf-key-{i}"),
                  "kudos": 0.0 if i == 0 else float(rng.choice([0, 100, 5000, 1e6])),
                  "trusted": False, "moderator": False, "anonymous": False, "created_at": now}
                 for i in range(CREATORS)]  # fmt: skip
        await insert_users(session, users, now)
        ids = list((await session.execute(select(TextRequest.id).where(TextRequest.any_model))).scalars())
        await session.execute(
            update(TextRequest).where(TextRequest.any_model).values(any_model=False, models=[top])
        )
        if ids:
            await session.execute(insert(RequestModel), [{"request_id": i, "model": top} for i in ids])
            await session.execute(
                update(QueueEntry).where(QueueEntry.model == queue_index.ANY_MODEL).values(model=top)
            )
    await settle(horde)


@dataclasses.dataclass
class Probe:
    key: str
    body: PopInput


async def probes(horde: BenchHorde, fixture: Fixture) -> dict[str, list[Probe]]:
    """Dedicated workers (registered by one committed pop each, on owners of the fixture):
    found: serves the most popular model with large limits; none: serves a model nobody asked for;
    refused: serves the most popular model with a max_length below every queued request's."""
    top = fixture.models[0]
    shapes = {
        "found": {"models": [top], "max_length": 8192, "max_context_length": 32768},
        "none": {"models": [UNSERVED], "max_length": 8192, "max_context_length": 32768},
        "refused": {"models": [top], "max_length": 16, "max_context_length": 32768},
    }
    out: dict[str, list[Probe]] = {}
    for n, (kind, shape) in enumerate(shapes.items()):
        out[kind] = []
        for i in range(PROBES):
            owner = n * PROBES + i  # bench-user-0..: worker owners, none of them requesters
            body = msgspec.convert(
                {"name": f"perf-{kind}-{i}", "bridge_agent": "perf:1:bench", **shape}, PopInput
            )
            probe = Probe(f"bench-key-{owner}", body)
            await dispatch.pop_job(horde, Caller(apikey=probe.key), body)  # committed: the worker exists
            out[kind].append(probe)
    return out


# --- what is measured ------------------------------------------------------------------------------


def creation_body(rng: random.Random, fixture: Fixture) -> tuple[str, TextRequestInput]:
    shape = request_shape(rng, fixture.models, fixture.weights)
    key = f"perf-key-{rng.randrange(CREATORS)}"
    body: dict[str, Any] = {"models": shape["models"], "slow_workers": shape["slow_workers"],
                            "allow_downgrade": rng.random() < 0.3}  # fmt: skip
    if shape["is_chat"]:
        chat: dict[str, Any] = {"messages": [{"role": "user", "content": "x" * (shape["prompt_tokens"] * 3)}],
                                "max_tokens": shape["max_length"]}  # fmt: skip
        if "tools" in shape["features"]:
            chat["tools"] = [{"type": "function", "function": {"name": "f"}}]
        body["chat"] = chat
    else:
        body["prompt"] = "Once upon a time"
        body["params"] = {"max_length": shape["max_length"], "max_context_length": 8192, "n": shape["n"]}
    return key, msgspec.convert(body, TextRequestInput)


@dataclasses.dataclass
class OpTimes:
    op: str
    samples: int
    p50: float
    p95: float
    p99: float
    outcome: dict[str, int]  # e.g. found / nothing / refused rc


async def timed(
    calls: list[Callable[[], Awaitable[str]]], op: str, warm: list[Callable[[], Awaitable[str]]]
) -> OpTimes:
    """Times `calls` after running `warm`, calls drawn the same way: a server that has run a while
    has built and compiled the statement of every shape its calls take (the first use of each of a
    few dozen shapes costs 20-40 ms once per process), and its pool and planner are warm."""
    for call in warm:
        with suppress(HordeError):
            await call()
    times, outcome = [], {}
    for call in calls:
        started = time.perf_counter()
        try:
            what = await call()
        except HordeError as e:  # a refusal ran the same path
            what = e.rc
        times.append((time.perf_counter() - started) * 1000)
        outcome[what] = outcome.get(what, 0) + 1
    return OpTimes(op, len(times), pct(times, 0.5), pct(times, 0.95), pct(times, 0.99), outcome)


async def measure(horde: BenchHorde, rng: random.Random, fixture: Fixture, samples: int) -> list[OpTimes]:
    found = await probes(horde, fixture)
    horde.rollback = True

    def pop(p: Probe) -> Callable[[], Awaitable[str]]:
        async def call() -> str:
            popped = await dispatch.pop_job(horde, Caller(apikey=p.key), p.body)
            return "job" if popped.offer else "nothing"

        return call

    def create() -> Callable[[], Awaitable[str]]:
        key, body = creation_body(rng, fixture)

        async def call() -> str:
            await request_text(horde, Caller(apikey=key, client_agent="perf"), body)
            return "created"

        return call

    async with horde.sessionmaker() as session:
        waiting = list(
            (await session.execute(select(TextRequest.id).where(TextRequest.state == "waiting"))).scalars()
        )

    def read(request_id: str) -> Callable[[], Awaitable[str]]:
        async def call() -> str:
            got = await status.read(horde, request_id)
            return "waiting" if got.waiting else "other"

        return call

    out = []
    for kind in ("found", "none", "refused"):
        # A pop that takes nothing commits, as on a real horde, where its only write is the worker's
        # check-in time every few seconds; the others are answered without a transaction. (Rolled
        # back, every such pop would find its check-in due and write it.)
        horde.rollback = kind == "found"
        pops = [pop(found[kind][i % PROBES]) for i in range(samples)]
        out.append(await timed(pops, f"pop {kind}", warm=pops))
    horde.rollback = True
    warm = [create() for _ in range(samples)]
    out.append(await timed([create() for _ in range(samples)], "create", warm))
    warm = [read(rng.choice(waiting)) for _ in range(samples)]
    out.append(await timed([read(rng.choice(waiting)) for _ in range(samples)], "status", warm))
    # A busy horde: the head of the queue is being generated (the oldest requests are the ones
    # served). The found probes take that many jobs for good, then the found pop is measured again.
    horde.rollback = False
    for i in range(min(RUNNING, len(waiting) // 10)):
        await pop(found["found"][i % PROBES])()
    horde.rollback = True
    pops = [pop(found["found"][i % PROBES]) for i in range(samples)]
    out.append(await timed(pops, "pop busy", warm=pops))
    # Then the next requests the found workers would take ask for NSFW workers, which they are not.
    horde.rollback = False
    await mark_nsfw(horde, fixture, min(RUNNING, len(waiting) // 10))
    horde.rollback = True
    out.append(await timed(pops, "pop sfw", warm=pops))
    horde.rollback = False
    return out


async def mark_nsfw(horde: Horde, fixture: Fixture, count: int) -> None:
    """The first `count` requests with a job to hand out for the most popular model, in queue order,
    ask for NSFW workers, as admission would have written them (their entries too, where they carry
    the choice)."""
    e = QueueEntry
    head = select(e.request_id).where(e.model == fixture.models[0])
    head = head.order_by(e.effective_start, e.created_at, e.request_id).limit(count)
    async with horde.transaction() as session:
        ids = list((await session.execute(head)).scalars())
        await session.execute(update(TextRequest).where(TextRequest.id.in_(ids)).values(nsfw=True))
        if hasattr(QueueEntry, "nsfw"):
            await session.execute(update(e).where(e.request_id.in_(ids)).values(nsfw=True))


# --- plans (PostgreSQL) ----------------------------------------------------------------------------


async def plans(horde: BenchHorde, rng: random.Random, fixture: Fixture, path: Path) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of every query on text_requests that one found pop and one
    creation run, with their own parameters, inside their own (rolled-back) transactions. Returns
    the labels of the statements whose plan scans text_requests sequentially."""
    captured: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if statement.split(None, 1)[0].upper() in ("SELECT", "WITH") and "text_requests" in statement:
            captured.append((statement, parameters))

    report: list[str] = []
    seq: list[str] = []
    # The app's engine, and the one of the copy of the queue the estimate reads (its catch-up).
    engines = [e.sync_engine for e in (horde.engine, horde.mirror.engine) if e is not None]

    async def explain_all(label: str, session: AsyncSession) -> None:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", capture)
        driver = (await (await session.connection()).get_raw_connection()).driver_connection
        for n, (statement, parameters) in enumerate(captured):
            name = f"{label} #{n + 1}"
            try:
                rows = await driver.fetch(f"EXPLAIN (ANALYZE, BUFFERS) {statement}", *(parameters or ()))
                plan = "\n".join(r[0] for r in rows)
            except Exception as e:
                plan = f"(could not EXPLAIN: {e!r})"
            if "Seq Scan on text_requests" in plan:
                seq.append(name)
            report.append(f"=== {name}\n{statement}\n-- parameters: {parameters!r}\n\n{plan}\n")
        captured.clear()

    def pop(kind: str, owner: int, **shape: Any) -> Callable[[], Awaitable[Any]]:
        body = msgspec.convert({"name": f"perf-{kind}-0", "bridge_agent": "perf:1:bench", **shape}, PopInput)
        return lambda: dispatch.pop_job(horde, Caller(apikey=f"bench-key-{owner}"), body)

    top, big = fixture.models[0], {"max_length": 8192, "max_context_length": 32768}
    async with horde.sessionmaker() as session:  # the back of the queue: the longest walk ahead
        r = TextRequest
        back = select(r.id).where(r.state == "waiting")
        back = back.order_by(r.effective_start.desc(), r.created_at.desc())
        last = (await session.execute(back.limit(1))).scalar_one()
    horde.rollback = True
    try:
        for label, call in (  # each probe kind's first worker (see `probes`)
            ("pop (job found)", pop("found", 0, models=[top], **big)),
            ("pop (nothing found)", pop("none", PROBES, models=[UNSERVED], **big)),
            ("pop (refused)", pop("refused", 2 * PROBES, models=[top], **{**big, "max_length": 16})),
            ("creation", lambda: request_text(horde, Caller(apikey="perf-key-0"), _plan_request(fixture))),
            ("status (back of the queue)", lambda: status.read(horde, last)),
        ):
            for engine in engines:
                event.listen(engine, "before_cursor_execute", capture)

            async def on_end(session: AsyncSession, label: str = label) -> None:
                await explain_all(label, session)

            horde.on_end = on_end
            with suppress(HordeError):  # a refusal's statements are explained all the same
                await call()
    finally:
        horde.on_end = None
        horde.rollback = False
        for engine in engines:
            if event.contains(engine, "before_cursor_execute", capture):
                event.remove(engine, "before_cursor_execute", capture)
    await asyncio.to_thread(path.write_text, "\n".join(report))
    return seq


def _plan_request(fixture: Fixture) -> TextRequestInput:
    """A request for the most popular model by a requester with no kudos (so no priority): the
    estimate's expensive case, a long queue ahead; within the free allowance, so it is admitted."""
    return msgspec.convert({"prompt": "Once upon a time", "models": [fixture.models[0]],
                            "params": {"max_length": 256, "max_context_length": 4096, "n": 1}},
                           TextRequestInput)  # fmt: skip


# --- the run ---------------------------------------------------------------------------------------


async def run_size(kind: str, url: str, size: int, samples: int, seed: int, plan_path: Path | None
                   ) -> dict[str, Any]:  # fmt: skip
    horde = bench_horde(url)
    rng = random.Random(seed)
    try:
        started = time.perf_counter()
        fixture = await build(horde, rng, size)
        await prepare(horde, fixture)
        build_s = time.perf_counter() - started
        # A started server freezes what it holds (horde_lite/heap.py); here the fixture, the bench's
        # own, is kept out of full collections too, at each size.
        gc.collect()
        gc.freeze()
        ops = await measure(horde, rng, fixture, samples)
        seq = await plans(horde, rng, fixture, plan_path) if plan_path else None
        return {"db": kind, "queued": size, "build_s": round(build_s, 1),
                "ops": [dataclasses.asdict(o) for o in ops], "plans": str(plan_path) if plan_path else None,
                "seq_scans_of_text_requests": seq}  # fmt: skip
    finally:
        await close(horde)


def fmt(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"


def print_tables(result: dict[str, Any]) -> None:
    print(f"\nIn-process, {result['load']}; p50 / p95 / p99 ms\n")
    ops = ["pop found", "pop none", "pop refused", "create", "status", "pop busy", "pop sfw"]
    print("| database | queued | build s | " + " | ".join(ops) + " |")
    print("|---|---|---|" + "---|" * len(ops))
    for row in result["sizes"]:
        by = {o["op"]: o for o in row["ops"]}
        cells = [f"{fmt(by[o]['p50'])} / {fmt(by[o]['p95'])} / {fmt(by[o]['p99'])}" for o in ops]
        print(f"| {row['db']} | {row['queued']:,} | {row['build_s']} | " + " | ".join(cells) + " |")
    print("\nOutcomes: " + "; ".join(
        f"{r['db']} {r['queued']:,} {o['op']}: {o['outcome']}" for r in result["sizes"] for o in r["ops"]
        if o["op"] != "status"))  # fmt: skip
    if result["cycles"]:
        print("\nFull cycles over HTTP (create, pop, submit)\n")
        print(
            "| database | server | processes | workers | cycles/s | cycle p50 / p99 ms "
            "| create / pop / submit p50 ms | CPU ms/cycle: server / postgres / bench client "
            "| bound without the server, cycles/s | empty pops | errors |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for c in result["cycles"]:
            cpu = [c[f"{who}_cpu_ms_per_cycle"] for who in ("server", "postgres", "client")]
            print(f"| {c['db']} | {c['stack']} | {c['processes']} | {c['workers']} | {c['per_second']:.1f} | "
                  f"{fmt(c['cycle_p50'])} / {fmt(c['cycle_p99'])} | "
                  f"{fmt(c['create_p50'])} / {fmt(c['pop_p50'])} / {fmt(c['submit_p50'])} | "
                  f"{' / '.join(fmt(v) for v in cpu)} | {fmt(_bound(cpu[1], cpu[2]))} | "
                  f"{c['empty_pops']} | {c['errors']} |")  # fmt: skip
        print(f"\n(The bound: {os.cpu_count()} cores x 1,000 ms over what PostgreSQL and the bench's own "
              "simulated workers spend per cycle, all on this machine: the most cycles/s even a server "
              "costing nothing could reach here.)")  # fmt: skip
        for line in floor_ratios(result["cycles"]):
            print(line)
    for row in result["sizes"]:
        if row["plans"]:
            seq = row["seq_scans_of_text_requests"]
            print(f"\nPlans ({row['db']}, {row['queued']:,} queued): {row['plans']}; sequential scan of "
                  f"text_requests: {', '.join(seq) if seq else 'none'}")  # fmt: skip


def floor_ratios(cycles: list[dict[str, Any]]) -> list[str]:
    """One server process's CPU per cycle on PostgreSQL over the stack's floor's (`bench.cycle_floor`,
    the same calls and round trips with none of the horde's logic) at the same number of workers: the
    figure that holds on a machine whose speed drifts, where the absolute ones do not."""
    floors = {c["workers"]: c for c in cycles if c["stack"].startswith("floor")}
    lines = []
    for c in cycles:
        floor = floors.get(c["workers"])
        if c["db"] != "postgresql" or c["processes"] != 1 or c["stack"].startswith("floor") or floor is None:
            continue
        mine, least = c["server_cpu_ms_per_cycle"], floor["server_cpu_ms_per_cycle"]
        if mine and least:
            lines.append(f"{c['stack']} x1, {c['workers']} workers: {mine / least:.2f}x the stack's floor "
                         f"({fmt(mine)} against {fmt(least)} ms of server CPU per cycle)")  # fmt: skip
    return ["\nAgainst the floor (bench.cycle_floor, run after them):", *lines] if lines else []


def _bound(*others: float | None) -> float | None:
    """Cycles/s this machine's cores allow once the other processes of a cycle have had theirs."""
    spent = sum(v for v in others if v is not None)
    return (os.cpu_count() or 1) * 1000 / spent if spent > 0 else None


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) / {five:.2f} (5 min) on {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="queue sizes, comma-separated")
    parser.add_argument("--sqlite-max", type=int, default=SQLITE_MAX, help="largest size built on SQLite")
    parser.add_argument("--samples", type=int, default=100, help="measured calls per operation and size")
    parser.add_argument("--large-samples", type=int, default=40, help="samples at 100,000 queued and above")
    parser.add_argument("--cycle-seconds", type=float, default=15.0)
    parser.add_argument("--cycle-workers", default="16,64")
    parser.add_argument("--no-cycles", action="store_true")
    parser.add_argument("--stacks", default=STACKS[0],
                        help=f"server stacks for the cycles, comma-separated: {', '.join(STACKS)}; "
                             "stacks past the first run one process only")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="size 200, 10 samples, 3 s cycles of 16 workers")
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="a server to create hl_bench on")
    parser.add_argument("--seed", type=int, default=20261130)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    workers = [int(w) for w in args.cycle_workers.split(",")]
    if args.quick:
        sizes, args.samples, args.cycle_seconds, workers = [200], 10, 3.0, [16]
    kinds = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    RESULTS.mkdir(exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    result: dict[str, Any] = {
        "started": stamp,
        "load": load(),
        "sizes": [],
        "cycles": [],
        "skipped": [],
        "errors": [],
    }
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hl-perf-") as tmp:
        for kind in kinds:
            for size in sizes:
                if kind == "sqlite" and size > args.sqlite_max:
                    result["skipped"].append(f"sqlite {size} (above --sqlite-max {args.sqlite_max})")
                    print(f"skipping sqlite {size:,}: above --sqlite-max", file=sys.stderr)
                    continue
                plan = (
                    RESULTS / f"plans-{stamp}-pg-{size}.txt"
                    if kind == "postgresql" and size == max(sizes)
                    else None
                )
                samples = args.samples if size < 100_000 else min(args.samples, args.large_samples)
                url = fresh_database(kind, args.pg_url, Path(tmp))
                try:
                    result["sizes"].append(asyncio.run(run_size(kind, url, size, samples, args.seed, plan)))
                except Exception:  # report it and go on: the other sizes still count
                    traceback.print_exc()
                    result["errors"].append(f"{kind} {size}: {traceback.format_exc(limit=-3)}")
                print(f"{kind} {size:,} done ({time.monotonic() - began:.0f} s)", file=sys.stderr, flush=True)
    if not args.no_cycles:
        stacks = args.stacks.split(",")
        configs = [(k, p, stacks[0]) for k in kinds for p in ((1,) if k == "sqlite" else (1, 2))]
        configs += [(k, 1, stack) for stack in stacks[1:] for k in kinds]
        for kind, processes, stack in configs:
            cycles: list[CycleResult] = asyncio.run(
                run_cycles(kind, args.pg_url, processes, workers, args.cycle_seconds, stack)
            )
            result["cycles"] += [dataclasses.asdict(c) for c in cycles]
            print(
                f"cycles {kind} {stack} x{processes} done ({time.monotonic() - began:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
        if "postgresql" in kinds:  # the stack's floor beside them: the figure to compare a cycle with
            for n in workers:
                floor = asyncio.run(run_floor(args.pg_url, "session", n, args.cycle_seconds))
                result["cycles"].append(dataclasses.asdict(floor))
            print(f"cycles floor done ({time.monotonic() - began:.0f} s)", file=sys.stderr, flush=True)
    result["load_after"] = load()
    result["seconds"] = round(time.monotonic() - began)
    out = RESULTS / f"perf-{stamp}.json"
    out.write_text(json.dumps(result, indent=1))
    print_tables(result)
    print(f"\n{result['seconds']} s in all; {result['load_after']} at the end. JSON: {out}")
    return 1 if broken(result) else 0


def broken(result: dict[str, Any]) -> bool:
    """What fails the smoke run (never a timing): a cycle configuration that completed nothing or
    got errors, an operation that never reached its expected outcome."""
    bad = list(result["errors"])
    bad += [f"cycles {c['db']} x{c['processes']} {c['workers']}: {c['cycles']} cycles, {c['errors_seen']}"
            for c in result["cycles"] if c["cycles"] == 0 or c["errors"]]  # fmt: skip
    expected = {"pop found": "job", "pop none": "nothing", "pop refused": "nothing", "status": "waiting",
                "pop busy": "job", "pop sfw": "job"}  # fmt: skip
    for row in result["sizes"]:
        for o in row["ops"]:
            if o["op"] in expected and o["outcome"].get(expected[o["op"]], 0) == 0:
                bad.append(f"{row['db']} {row['queued']} {o['op']}: {o['outcome']}")
    for line in bad:
        print(f"FAILED: {line}", file=sys.stderr)
    return bool(bad)


if __name__ == "__main__":
    raise SystemExit(main())
