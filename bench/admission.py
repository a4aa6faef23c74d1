"""Request creation at scale: how long `admit` (validation, the wait estimate, the allowance
decision, the hold, the insert and the commit) takes with 100, 1,000 and 10,000 queued requests and
500 workers, on SQLite and PostgreSQL.

    .venv/bin/python -m bench.admission --db both
    .venv/bin/python -m bench.admission --db postgresql --sizes 10000 --samples 100

The fixture (users, a fleet over ~50 models, the queue) is bulk-inserted with SQLAlchemy core
inserts; that is set-up, timed separately, not what is measured. Each measured creation is one
transaction through the lifecycle (the same `legacy_spec`/`chat_spec` and `admit` the HTTP route
calls), committed, then deleted outside the timing so every sample sees the same queue.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
from sqlalchemy import delete, insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession

from bench.soak_servers import LIMITS_OFF
from horde_lite.accounts.users import ANONYMOUS_KEY, Requester, hash_key
from horde_lite.accounts.workers import capacity_for
from horde_lite.clock import ManualClock
from horde_lite.core.context import Horde
from horde_lite.db import migrate
from horde_lite.db import statistics as planner_statistics
from horde_lite.db.engine import make_engine, make_sessionmaker
from horde_lite.db.models import (
    KudosEvent,
    KudosHold,
    QueueEntry,
    RequestModel,
    TextRequest,
    User,
    Worker,
    WorkerModel,
)
from horde_lite.inputs import ChatPayload, TextRequestInput
from horde_lite.metrics import Metrics
from horde_lite.policies.registry import load_policies
from horde_lite.queue.estimate import estimate_request
from horde_lite.requests import admission
from horde_lite.settings import Settings

DEFAULT_PG = os.environ.get(
    "HORDE_LITE_BENCH_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)
BENCH_PG_DB = "hl_bench"
SIZES = (100, 1_000, 10_000)
WORKERS = 500
MODELS = 50
OWNERS = 120
REQUESTERS = 300

# --- a realistic fleet and queue ------------------------------------------------------------------


@dataclass
class Fixture:
    models: list[str]
    weights: list[float]
    anonymous_id: int
    requester_ids: list[int]


def model_names(rng: random.Random) -> tuple[list[str], list[float]]:
    sizes = [7, 8, 12, 13, 14, 22, 24, 27, 32, 70]
    names = [f"bench/Model-{i:02d}-{rng.choice(sizes)}B-v1" for i in range(MODELS)]
    # Zipf-like popularity: a few models carry most workers and most requests.
    weights = [1 / (rank + 1) ** 1.1 for rank in range(MODELS)]
    return names, weights


def pick_models(rng: random.Random, names: list[str], weights: list[float], k: int) -> list[str]:
    chosen: list[str] = []
    while len(chosen) < k:
        m = rng.choices(names, weights)[0]
        if m not in chosen:
            chosen.append(m)
    return chosen


def worker_rows(rng: random.Random, settings: Settings, now: float, owners: list[int], names: list[str],
                weights: list[float]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
    workers, links = [], []
    for i in range(WORKERS):
        wid = str(uuid.uuid4())
        models = pick_models(rng, names, weights, rng.choices([1, 2, 3], [6, 3, 1])[0])
        speed = None if rng.random() < 0.2 else round(min(60.0, max(0.8, rng.lognormvariate(2.0, 0.7))), 2)
        chat = rng.random() < 0.4
        features = sorted(
            f for f, p in (("tools", 0.5), ("json_schema", 0.4), ("vision", 0.15)) if rng.random() < p
        )
        transports = sorted(rng.sample(["url", "base64"], rng.randint(1, 2))) if "vision" in features else []
        owner = rng.choice(owners)
        workers.append(
            {
                "id": wid,
                "name": f"bench-worker-{i}",
                "owner_id": owner,
                "trusted": rng.random() < 0.3,
                "models": models,
                "max_length": rng.choice([512, 1024, 2048, 4096, 8192]),
                "max_context_length": rng.choice([4096, 8192, 16384, 32768]),
                "threads": rng.choices([1, 2, 4], [7, 2, 1])[0],
                "bridge_agent": "bench:1:bench",
                "nsfw": rng.random() < 0.5,
                "priority_user_ids": [],
                "chat_max_completion_tokens": rng.choice([1024, 2048, 4096, 8192]) if chat else None,
                "chat_max_context_tokens": rng.choice([8192, 16384, 32768]) if chat else None,
                "chat_features": features if chat else [],
                "chat_image_transports": transports if chat else [],
                "maintenance": rng.random() < 0.02,
                "maintenance_msg": "",
                "paused": rng.random() < 0.01,
                "last_check_in": now - (rng.uniform(0, 60) if rng.random() < 0.9 else rng.uniform(400, 5000)),
                "created_at": now - 86400,
                "lease_speed": speed,
                "speed_samples": [] if speed is None else [speed],
                "capacity": capacity_for(speed, settings),
                "completed_jobs": 0,
                "aborted_jobs": 0,
                "faulted_jobs": 0,
                "tokens_generated": 0,
                "kudos_earned": 0.0,
            }
        )
        links.extend({"worker_id": wid, "model": m} for m in models)
    return workers, links


def request_shape(rng: random.Random, names: list[str], weights: list[float]) -> dict[str, Any]:
    """One request as a client would shape it: legacy or chat, over the fleet's models."""
    roll = rng.random()
    models = [] if roll < 0.05 else pick_models(rng, names, weights, 1 if roll < 0.9 else 2)
    is_chat = rng.random() < 0.3
    max_length = rng.choices([128, 256, 512, 1024, 2048, 4096], [2, 3, 4, 3, 2, 1])[0]
    features = []
    if is_chat:
        if rng.random() < 0.1:
            features.append("tools")
        if rng.random() < 0.05:
            features.append("json_schema")
    return {
        "is_chat": is_chat,
        "models": models,
        "max_length": max_length,
        "n": 1 if is_chat or rng.random() < 0.9 else rng.randint(2, 4),
        "prompt_tokens": rng.randint(50, 3000) if is_chat else 0,
        "features": sorted(features),
        "slow_workers": rng.random() < 0.95,
        "trusted_workers": rng.random() < 0.05,
    }


def queue_rows(rng: random.Random, now: float, fixture: Fixture, count: int
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
    rows, links = [], []
    for _ in range(count):
        shape = request_shape(rng, fixture.models, fixture.weights)
        rid = str(uuid.uuid4())
        # Under 2,000 anonymous requests even at 10,000 queued: more would make every anonymous
        # creation a TooManyPrompts refusal, which never reaches the estimate.
        anonymous = rng.random() < 0.15
        user = fixture.anonymous_id if anonymous else rng.choice(fixture.requester_ids)
        priority = 0.0 if anonymous else rng.choice([0.0, 10.0, 500.0, 5000.0, 50000.0])
        created = now - rng.uniform(0, 1100)
        context = (
            shape["prompt_tokens"] + shape["max_length"]
            if shape["is_chat"]
            else rng.choice([2048, 4096, 8192])
        )
        remaining = shape["n"] if rng.random() < 0.9 else max(1, shape["n"] - 1)
        rows.append(
            {
                "id": rid,
                "user_id": user,
                "shared_key_hash": None,
                "requester_kind": "anonymous" if anonymous else "registered",
                "state": "waiting",
                "is_chat": shape["is_chat"],
                "stream": False,
                "prompt": "" if shape["is_chat"] else "Once upon a time",
                "params": {"max_length": shape["max_length"], "max_context_length": context, "n": shape["n"]},
                "chat": {"messages": [{"role": "user", "content": "hi"}]} if shape["is_chat"] else None,
                "max_length": shape["max_length"],
                "max_context_length": max(context, shape["max_length"]),
                "prompt_tokens": shape["prompt_tokens"],
                "required_features": shape["features"],
                "required_transports": [],
                "any_model": not shape["models"],
                "models": shape["models"],
                "targeted": False,
                "worker_allow": [],
                "worker_deny": [],
                "trusted_workers": shape["trusted_workers"],
                "slow_workers": shape["slow_workers"],
                "nsfw": False,
                "n_total": shape["n"],
                "n_remaining": remaining,
                "restarts": 0,
                "failures": 0,
                "initial_priority": priority,
                "effective_start": created - priority / 5.0,
                "created_at": created,
                "expires_at": created + 1200 + 600,
                "kudos_spent": 0.0,
                "requested_max_length": shape["max_length"],
                "context_adjustments": [],
                "client_agent": "bench",
            }
        )
        links.extend({"request_id": rid, "model": m} for m in shape["models"])
    return rows, links


async def insert_users(session: AsyncSession, users: list[dict[str, Any]], now: float) -> dict[str, int]:
    """Insert user rows with their opening balances granted through the ledger (so every balance
    equals its ledger); returns every user's id by name."""
    await session.execute(insert(User), users)
    ids = dict((await session.execute(select(User.username, User.id))).all())
    grants = [{"user_id": ids[u["username"]], "amount": u["kudos"], "kind": "grant", "ref": "bench",
               "created_at": now} for u in users if u["kudos"]]  # fmt: skip
    if grants:
        await session.execute(insert(KudosEvent), grants)
    return ids


async def build(horde: Horde, rng: random.Random, queued: int) -> Fixture:
    """Users, 500 workers over ~50 models, and `queued` waiting requests, bulk-inserted."""
    now = horde.clock.now()
    names, weights = model_names(rng)
    async with horde.sessionmaker() as session, session.begin():
        users = [{"username": "Anonymous", "api_key_hash": hash_key(ANONYMOUS_KEY), "kudos": 0.0,
                  "trusted": False, "moderator": False, "anonymous": True, "created_at": now}]  # fmt: skip
        for i in range(OWNERS + REQUESTERS):
            users.append({"username": f"bench-user-{i}", "api_key_hash": hash_key(f"bench-key-{i}"),
                          "kudos": float(rng.choice([0, 100, 5000, 1_000_000])), "trusted": False,
                          "moderator": False, "anonymous": False, "created_at": now})  # fmt: skip
        ids = await insert_users(session, users, now)
        owners = [ids[f"bench-user-{i}"] for i in range(OWNERS)]
        requesters = [ids[f"bench-user-{i}"] for i in range(OWNERS, OWNERS + REQUESTERS)]
        fixture = Fixture(names, weights, ids["Anonymous"], requesters)
        workers, worker_links = worker_rows(rng, horde.settings, now, owners, names, weights)
        await session.execute(insert(Worker), workers)
        await session.execute(insert(WorkerModel), worker_links)
        for start in range(0, queued, 2000):
            rows, links = queue_rows(rng, now, fixture, min(2000, queued - start))
            await session.execute(insert(TextRequest), rows)
            if links:
                await session.execute(insert(RequestModel), links)
    await settle(horde)
    return fixture


async def settle(horde: Horde) -> None:
    """Statistics for the planner after a bulk load. On PostgreSQL a VACUUM too: a freshly loaded
    table is what autovacuum goes for next, and its run in the middle of the measured calls (on the
    same two cores) moved them by a third from one run to the next; vacuumed, the index-only scans
    also skip the heap, as on a settled database. On SQLite the server's own periodic step
    (`statistics.refresh`, which a running server takes every few minutes), not a manual ANALYZE."""
    if horde.engine.dialect.name == "postgresql":
        async with horde.engine.connect() as conn:
            await conn.execute(text("COMMIT"))  # VACUUM runs outside a transaction
            await conn.execute(text("VACUUM ANALYZE"))
    else:
        await planner_statistics.refresh(horde)


# --- what is measured ------------------------------------------------------------------------------


async def create_one(horde: Horde, rng: random.Random, fixture: Fixture) -> tuple[float, str | None]:
    """One request creation, as the route does it; returns (seconds, request id)."""
    shape = request_shape(rng, fixture.models, fixture.weights)
    anonymous = rng.random() < 0.5
    user_id = fixture.anonymous_id if anonymous else rng.choice(fixture.requester_ids)
    started = time.perf_counter()
    try:
        async with horde.sessionmaker() as session, session.begin():
            user = await session.get(User, user_id)
            assert user is not None
            requester = Requester(user)
            if shape["is_chat"]:
                payload = msgspec.convert(
                    {"messages": [{"role": "user", "content": "x" * (shape["prompt_tokens"] * 3)}],
                     "max_tokens": shape["max_length"],
                     **({"tools": [{"type": "function", "function": {"name": "f"}}]}
                        if "tools" in shape["features"] else {})},
                    ChatPayload,
                )  # fmt: skip
                spec = await admission.chat_spec(
                    session, horde, horde.in_force(), requester, payload, models=shape["models"]
                )
            else:
                body = TextRequestInput(
                    prompt="Once upon a time",
                    models=shape["models"],
                    params={"max_length": shape["max_length"], "max_context_length": 8192, "n": shape["n"]},
                    slow_workers=shape["slow_workers"],
                    allow_downgrade=rng.random() < 0.3,
                )
                spec = admission.legacy_spec(requester, body, horde, "bench")
            result = await admission.admit(session, horde, spec)
            request_id = result.request_id
    except Exception as e:  # a refusal is a creation too: it ran the same path
        if type(e).__name__ != "HordeError":
            raise
        request_id = None
    return time.perf_counter() - started, request_id


async def forget(horde: Horde, request_id: str) -> None:
    """Undo one measured creation so the next sample sees the same queue (not timed)."""
    async with horde.sessionmaker() as session, session.begin():
        await session.execute(delete(KudosHold).where(KudosHold.request_id == request_id))
        await session.execute(delete(RequestModel).where(RequestModel.request_id == request_id))
        await session.execute(delete(QueueEntry).where(QueueEntry.request_id == request_id))
        await session.execute(delete(TextRequest).where(TextRequest.id == request_id))


async def time_estimate(horde: Horde, rng: random.Random, samples: int) -> list[float]:
    """The wait estimate alone, for queued requests anywhere in the queue (what a status poll pays;
    a new request, at the back of its queue, is the expensive case and is timed by creation)."""
    async with horde.sessionmaker() as session:
        ids = list((await session.execute(select(TextRequest.id))).scalars())
    out = []
    for request_id in rng.sample(ids, min(samples, len(ids))):
        started = time.perf_counter()
        async with horde.sessionmaker() as session:
            await estimate_request(horde, session, request_id, horde.rules(horde.clock.now()))
        out.append(time.perf_counter() - started)
    return out


# --- databases ------------------------------------------------------------------------------------


async def fresh_pg(base_url: str, database: str = BENCH_PG_DB) -> str:
    """An empty `database` on the server of `base_url` (created when missing); its URL."""
    url = make_url(base_url)
    kwargs = {"host": url.host, "port": url.port or 5432, "user": url.username, "password": url.password}
    conn = await asyncpg.connect(database=url.database or "postgres", **kwargs)
    try:
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database):
            await conn.execute(f'CREATE DATABASE "{database}"')
    finally:
        await conn.close()
    conn = await asyncpg.connect(database=database, **kwargs)
    try:
        await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    finally:
        await conn.close()
    return url.set(database=database).render_as_string(hide_password=False)


def fresh_database(kind: str, pg_url: str, tmp: Path) -> str:
    if kind == "sqlite":
        path = tmp / "bench.db"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        url = f"sqlite+aiosqlite:///{path}"
    else:
        url = asyncio.run(fresh_pg(pg_url))
    migrate.upgrade(url)
    return url


async def close(horde: Horde) -> None:
    """What the app's shutdown does: the metrics, the copy of the queue's connection, the engine."""
    horde.metrics.shutdown()
    await horde.mirror.close()
    await horde.engine.dispose()


def horde_for(url: str) -> Horde:
    settings = msgspec.convert({**LIMITS_OFF, "database": {"url": url}}, Settings)
    engine = make_engine(url)
    return Horde(
        settings=settings,
        policies=load_policies(settings.policies),
        metrics=Metrics(),
        clock=ManualClock(),
        engine=engine,
        sessionmaker=make_sessionmaker(engine),
    )


# --- the run ---------------------------------------------------------------------------------------


@dataclass
class Row:
    db: str
    queued: int
    build_s: float
    samples: int
    p50: float
    p95: float
    mean: float
    refused: int
    est_p50: float


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def run_size(kind: str, url: str, queued: int, samples: int, seed: int) -> Row:
    horde = horde_for(url)
    rng = random.Random(seed)
    try:
        started = time.perf_counter()
        fixture = await build(horde, rng, queued)
        build_s = time.perf_counter() - started
        for _ in range(5):  # warm up the pool, the statement caches and the planner
            _, rid = await create_one(horde, rng, fixture)
            if rid:
                await forget(horde, rid)
        times, refused = [], 0
        for _ in range(samples):
            seconds, rid = await create_one(horde, rng, fixture)
            times.append(seconds)
            if rid:
                await forget(horde, rid)
            else:
                refused += 1
        est_times = await time_estimate(horde, rng, min(samples, 100))
        ms = [t * 1000 for t in times]
        return Row(kind, queued, build_s, samples, pct(ms, 0.5), pct(ms, 0.95), statistics.fmean(ms), refused,
                   pct([t * 1000 for t in est_times], 0.5))  # fmt: skip
    finally:
        await close(horde)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--samples", type=int, default=200, help="measured creations per size")
    parser.add_argument("--pg-url", default=DEFAULT_PG, help=f"a server to create {BENCH_PG_DB} on")
    parser.add_argument("--seed", type=int, default=20261130)
    args = parser.parse_args(argv)
    kinds = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="hl-bench-") as tmp:
        for kind in kinds:
            for queued in args.sizes:
                url = fresh_database(kind, args.pg_url, Path(tmp))
                row = asyncio.run(run_size(kind, url, queued, args.samples, args.seed))
                rows.append(row)
                print(f"{kind} {queued}: p50 {row.p50:.1f} ms", file=sys.stderr, flush=True)
    print(f"\nRequest creation (admit + commit), {WORKERS} workers over {MODELS} models\n")
    header = ("database", "queued", "fixture s", "samples", "refused", "p50 ms", "p95 ms", "mean ms",
              "estimate p50 ms")  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for r in rows:
        print(f"| {r.db} | {r.queued:,} | {r.build_s:.1f} | {r.samples} | {r.refused} | {r.p50:.1f} | "
              f"{r.p95:.1f} | {r.mean:.1f} | {r.est_p50:.1f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
