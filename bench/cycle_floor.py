"""What the stack alone costs a job cycle: a stand-in server on the horde's own libraries (Litestar
on uvicorn, msgspec bodies, SQLAlchemy's asyncio engine over asyncpg) that sends a cycle's HTTP
calls, round trips and transactions with trivial statements and no horde logic, loaded as
`bench.perf_cycles` loads `horde-lite run`, and measured the same way (server CPU per cycle).

    .venv/bin/python -m bench.cycle_floor                 # the floor, then horde-lite, 3 rounds
    .venv/bin/python -m bench.cycle_floor --mode session  # statements through an AsyncSession

The stand-in's cycle is the horde's on PostgreSQL (docs/explanation/hot_path.md): a creation sends
the estimate copy's catch-up read, then a transaction of three statements (the requester locked,
its waiting count, the writes); a pop one read outside a transaction, then a transaction of three
(the page, the claim, the job's rows); a submit a transaction of four (the job and its request
locked, the worker locked, the balances, the other writes). `--mode core` runs them on an
`AsyncConnection`, the cheapest way through SQLAlchemy; `--mode session` through an `AsyncSession`,
as the horde does. What horde-lite costs above the floor is its own logic, its ORM loads and its
middleware; what the floor costs, no change to that logic can remove.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
from litestar import Litestar, get, post
from litestar.datastructures import State
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine

from bench.admission import BENCH_PG_DB, DEFAULT_PG
from bench.perf_cycles import CycleResult, _measure, run_cycles
from bench.soak_servers import LOOPBACK, Server, free_port, fresh_postgres

FLOOR_DB = f"{BENCH_PG_DB}_floor"
MODE_ENV = "HORDE_LITE_FLOOR_MODE"
URL_ENV = "HORDE_LITE_FLOOR_URL"
USERS = 128  # half of them workers' owners: at most 64 workers, as bench.perf's largest run
ROOT = str(Path(__file__).resolve().parents[1])  # where `bench` is: the server runs elsewhere

SCHEMA = (
    "DROP TABLE IF EXISTS floor_ledger, floor_jobs, floor_users",
    "CREATE TABLE floor_users (id int PRIMARY KEY, kudos float NOT NULL, seen float NOT NULL DEFAULT 0)",
    "CREATE TABLE floor_jobs (id uuid PRIMARY KEY, user_id int NOT NULL REFERENCES floor_users, "
    "state text NOT NULL, worker_id int, prompt text NOT NULL, params jsonb NOT NULL, "
    "created_at float NOT NULL, text text)",
    "CREATE INDEX floor_jobs_waiting ON floor_jobs (created_at) WHERE state = 'waiting'",
    "CREATE TABLE floor_ledger (id bigserial PRIMARY KEY, user_id int NOT NULL, amount float NOT NULL, "
    "job_id uuid NOT NULL)",
)


class CreateBody(msgspec.Struct):
    prompt: str
    models: list[str]
    params: dict[str, Any]


class PopBody(msgspec.Struct):
    name: str
    models: list[str]
    max_length: int = 80
    max_context_length: int = 1024
    bridge_agent: str = ""


class SubmitBody(msgspec.Struct):
    id: str
    generation: str
    state: str = "ok"


class Created(msgspec.Struct):
    id: str
    kudos: float


class Popped(msgspec.Struct):
    id: str | None
    ids: list[str]
    payload: dict[str, Any]


class Submitted(msgspec.Struct):
    reward: float


def _user(key: str | None) -> int:
    return int(key or "0") % USERS


class Floor:
    """The engine, and one way of sending statements (a connection or a session)."""

    def __init__(self, engine: AsyncEngine, mode: str) -> None:
        self.engine = engine
        self.mode = mode
        # Autocommit set once, as the horde's reading connections have it (`db/engine._reader`),
        # not on each connection after its checkout.
        self.reader = engine.execution_options(isolation_level="AUTOCOMMIT")

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection | AsyncSession]:
        if self.mode == "session":
            async with AsyncSession(self.engine, expire_on_commit=False) as session, session.begin():
                yield session
        else:
            async with self.engine.begin() as conn:
                yield conn

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[AsyncConnection]:
        async with self.reader.connect() as conn:
            yield conn


LOCK_USER = text("SELECT id, kudos FROM floor_users WHERE id = :u FOR UPDATE")
COUNT = text("SELECT count(*) FROM floor_jobs WHERE user_id = :u AND state = 'waiting'")
INSERT = text(
    "INSERT INTO floor_jobs (id, user_id, state, prompt, params, created_at) "
    "VALUES (:id, :u, 'waiting', :prompt, CAST(:params AS jsonb), :now)"
)
CATCH_UP = text("SELECT count(*) FROM floor_jobs WHERE created_at > :since")
LOOK = text(
    "SELECT EXISTS (SELECT 1 FROM floor_jobs WHERE state = 'waiting'), "
    "(SELECT seen FROM floor_users WHERE id = :w)"
)
PAGE = text("SELECT id FROM floor_jobs WHERE state = 'waiting' ORDER BY created_at LIMIT 32")
CLAIM = text(
    "UPDATE floor_jobs SET state = 'popped', worker_id = :w WHERE id = (SELECT id FROM floor_jobs "
    "WHERE state = 'waiting' ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED) "
    "RETURNING id, prompt, params"
)
SEEN = text("UPDATE floor_users SET seen = :now WHERE id = :w")
JOB = text("SELECT id, user_id, state FROM floor_jobs WHERE id = :id FOR UPDATE")
WORKER = text("SELECT id, kudos FROM floor_users WHERE id IN (:u, :w) ORDER BY id FOR UPDATE")
MOVE = text(
    "UPDATE floor_users SET kudos = kudos + CASE WHEN id = :w THEN CAST(:r AS float) "
    "ELSE -CAST(:r AS float) END WHERE id IN (:u, :w)"
)
SETTLE = text(
    "WITH l AS (INSERT INTO floor_ledger (user_id, amount, job_id) "
    "VALUES (:u, -CAST(:r AS float), :id), (:w, CAST(:r AS float), :id)) "
    "UPDATE floor_jobs SET state = 'done', text = :t WHERE id = :id"
)


@post("/api/v2/generate/text/async", status_code=202)
async def create(data: CreateBody, headers: dict[str, str], state: State) -> Created:
    floor: Floor = state.floor
    user, now = _user(headers.get("apikey")), time.time()
    async with floor.reading() as conn:
        await conn.execute(CATCH_UP, {"since": now - 1})
    async with floor.transaction() as tx:
        kudos = (await tx.execute(LOCK_USER, {"u": user})).one()[1]
        (await tx.execute(COUNT, {"u": user})).scalar_one()
        job = uuid.uuid4()
        params = msgspec.json.encode(data.params).decode()
        await tx.execute(INSERT, {"id": job, "u": user, "prompt": data.prompt, "params": params, "now": now})
    return Created(id=str(job), kudos=kudos)


@post("/api/v2/generate/text/pop", status_code=200)
async def pop(data: PopBody, headers: dict[str, str], state: State) -> Popped:
    floor: Floor = state.floor
    worker = _user(headers.get("apikey"))
    async with floor.reading() as conn:
        found = (await conn.execute(LOOK, {"w": worker})).one()[0]
    if not found:
        return Popped(id=None, ids=[], payload={})
    async with floor.transaction() as tx:
        (await tx.execute(PAGE)).all()
        row = (await tx.execute(CLAIM, {"w": worker})).first()
        await tx.execute(SEEN, {"w": worker, "now": time.time()})
    if row is None:
        return Popped(id=None, ids=[], payload={})
    return Popped(id=str(row[0]), ids=[str(row[0])], payload={"prompt": row[1], **row[2]})


@post("/api/v2/generate/text/submit", status_code=200)
async def submit(data: SubmitBody, headers: dict[str, str], state: State) -> Submitted:
    floor: Floor = state.floor
    worker = _user(headers.get("apikey"))
    async with floor.transaction() as tx:
        job = (await tx.execute(JOB, {"id": data.id})).one()
        users = sorted({job[1], worker})
        (await tx.execute(WORKER, {"u": users[0], "w": users[-1]})).all()  # the lock order: ascending ids
        await tx.execute(MOVE, {"u": job[1], "w": worker, "r": 1.0})
        await tx.execute(SETTLE, {"u": job[1], "w": worker, "r": 1.0, "id": data.id, "t": data.generation})
    return Submitted(reward=1.0)


@get("/api/v2/status/heartbeat", sync_to_thread=False)
def heartbeat() -> dict[str, str]:
    return {"message": "OK"}


@asynccontextmanager
async def _lifespan(app: Litestar) -> AsyncIterator[None]:
    engine = create_async_engine(os.environ[URL_ENV], pool_size=20, max_overflow=0)
    app.state.floor = Floor(engine, os.environ.get(MODE_ENV, "core"))
    try:
        yield
    finally:
        await engine.dispose()


def make_app() -> Litestar:
    """The stand-in, built in its server's process only: a Litestar app configures logging when it is
    built, and the bench's own process would then log each of its client's calls."""
    handlers = [create, pop, submit, heartbeat]
    return Litestar(route_handlers=handlers, lifespan=[_lifespan], openapi_config=None)


# --- the load ---------------------------------------------------------------------------------


async def _fresh_database(pg_url: str) -> str:
    url = make_url(pg_url).set(database=FLOOR_DB).render_as_string(hide_password=False)
    await fresh_postgres(url)
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            for statement in SCHEMA:
                await conn.execute(text(statement))
            users = text("INSERT INTO floor_users (id, kudos) SELECT g, 1e9 FROM generate_series(0, :n) g")
            await conn.execute(users, {"n": USERS - 1})
    finally:
        await engine.dispose()
    return url


async def run_floor(pg_url: str, mode: str, workers: int, seconds: float) -> CycleResult:
    """The stand-in under `bench.perf_cycles`' load: each worker's key is its user's id, and each
    requester's another's (so at most half of USERS workers)."""
    if workers > USERS // 2:
        raise ValueError(f"the floor serves at most {USERS // 2} workers (got {workers})")
    url = await _fresh_database(pg_url)
    keys = {
        "owners": [str(i) for i in range(workers)],
        "registered": [str(USERS // 2 + i) for i in range(workers)],
    }
    with tempfile.TemporaryDirectory(prefix="hl-floor-") as tmp:
        port = free_port()
        where = ["--app-dir", ROOT, "--host", LOOPBACK, "--port", str(port)]
        command = [sys.executable, "-m", "uvicorn", "--factory", "bench.cycle_floor:make_app", *where]
        env = {**os.environ, URL_ENV: url, MODE_ENV: mode}
        server = Server(0, port, Path(tmp), env, command=command)
        await server.start()
        try:
            return await _measure([server], keys, workers, seconds, "postgresql", f"floor-{mode}")
        finally:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("core", "session"), default="core")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="a server to create the benches' databases on")
    args = parser.parse_args(argv)
    floors: list[float] = []
    hordes: list[float] = []
    for n in range(args.rounds):  # interleaved: the machine's speed drifts
        floor = asyncio.run(run_floor(args.pg_url, args.mode, args.workers, args.seconds))
        [horde] = asyncio.run(run_cycles("postgresql", args.pg_url, 1, [args.workers], args.seconds))
        if floor.errors or horde.errors:
            print(f"round {n + 1}: errors: {floor.errors_seen or horde.errors_seen}", file=sys.stderr)
            return 1
        floors.append(floor.server_cpu_ms_per_cycle or float("nan"))
        hordes.append(horde.server_cpu_ms_per_cycle or float("nan"))
        print(f"round {n + 1}: server CPU ms per cycle: floor ({args.mode}) {floors[-1]:.2f} "
              f"({floor.cycles} cycles), horde-lite {hordes[-1]:.2f} ({horde.cycles} cycles)",
              flush=True)  # fmt: skip
    f, h = statistics.median(floors), statistics.median(hordes)
    print(f"median of {args.rounds}: floor ({args.mode}) {f:.2f}, horde-lite {h:.2f} ms of server CPU "
          f"per cycle; floor / horde-lite {f / h:.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
