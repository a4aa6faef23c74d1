"""Short transactions and reads through horde_lite's `Horde.transaction()` / `Horde.reading()`
and through advanced-alchemy's Litestar session handling (its `SQLAlchemyAsyncConfig`: a session
per request from `provide_session`, committed or rolled back and closed by its autocommit
`before_send_handler` when the response starts), on SQLite and PostgreSQL.

    .venv/bin/python -m bench.sessions --db both

Each call reads one user's kudos, or reads them (FOR UPDATE on PostgreSQL) and writes them plus
one, in a transaction of its own. Three ways: horde_lite's; the plugin's session handling on
horde_lite's engine (db/engine.py: SQLite's pragmas and BEGIN IMMEDIATE, PostgreSQL's begin at
checkout), so the difference is the session handling alone; and the plugin on the engine it
makes itself from the URL. Printed per way and operation, medians over `--rounds` rounds that
take the ways in turn: the mean time of a call made one at a time, the statements the engine
sent for one call (`Counter`), and, for writes, `--tasks` concurrent writers: calls per second,
the 99th percentile of a call, the calls that failed and the increments lost (the user's kudos
short of the committed writes). bench/README.md has the results.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig
from litestar.datastructures import State
from sqlalchemy import event, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from bench.admission import fresh_pg
from horde_lite.clock import Clock
from horde_lite.core.context import Horde
from horde_lite.db import migrate
from horde_lite.db.engine import make_engine, make_sessionmaker
from horde_lite.db.models import User
from horde_lite.metrics import Metrics
from horde_lite.policies.registry import load_policies
from horde_lite.settings import Settings

BENCH_PG_DB = "hl_bench_sessions"
DEFAULT_PG = os.environ.get(
    "HORDE_LITE_BENCH_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)

Session = Callable[[], Any]  # an async context manager yielding an AsyncSession


def fresh_database(kind: str, pg_url: str, tmp: Path) -> str:
    url = (
        f"sqlite+aiosqlite:///{tmp / 'sessions.db'}"
        if kind == "sqlite"
        else asyncio.run(fresh_pg(pg_url, BENCH_PG_DB))
    )
    migrate.upgrade(url)
    return url


class Counter:
    """The statements an engine sends: its cursor executes (SQLite's BEGIN IMMEDIATE among them)
    and its commits. Not counted: PostgreSQL's BEGIN, or the `;` before a read, which go with the
    pool's check at checkout (db/engine.py), and the rollback that closes a read, which sends
    nothing on a connection in autocommit."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.sent = 0
        for name in ("before_cursor_execute", "commit"):
            event.listen(engine.sync_engine, name, self._count)

    def _count(self, *_args: Any, **_kwargs: Any) -> None:
        self.sent += 1


def plugin_session(config: SQLAlchemyAsyncConfig, state: State) -> Session:
    """A session as advanced-alchemy's Litestar plugin hands one to a route: made on first use in
    the request's scope, committed (2xx) and closed as the response starts."""

    @asynccontextmanager
    async def request() -> AsyncIterator[AsyncSession]:
        scope: dict[str, Any] = {}
        session = config.provide_session(state, scope)  # type: ignore[arg-type]
        yield session
        handler = config.before_send_handler
        assert callable(handler)
        await handler({"type": "http.response.start", "status": 200, "headers": []}, scope)  # type: ignore[arg-type]

    return request


@dataclass
class Way:
    """One way to open sessions, with a user row of its own and the writes it committed."""

    reader: Session
    writer: Session
    counter: Counter
    user_id: int
    committed: int = 0


async def read(way: Way) -> None:
    async with way.reader() as s:
        (await s.execute(select(User.kudos).where(User.id == way.user_id))).scalar_one()


async def write(way: Way) -> None:
    """Read, then write what was read (as the ledger and a pop's claim do): a lost update shows
    as kudos short of the committed writes."""
    async with way.writer() as s:
        found = select(User.kudos).where(User.id == way.user_id).with_for_update()
        kudos = (await s.execute(found)).scalar_one()
        await s.execute(update(User).where(User.id == way.user_id).values(kudos=kudos + 1))
    way.committed += 1


async def sequential(op: Callable[[Way], Awaitable[None]], way: Way, calls: int) -> float:
    for _ in range(min(20, calls)):  # warm the pool and the statement caches
        await op(way)
    started = time.perf_counter()
    for _ in range(calls):
        await op(way)
    return (time.perf_counter() - started) / calls


async def concurrent(way: Way, tasks: int, calls: int, latencies: list[float]) -> tuple[float, int]:
    """Calls per second of `tasks` writers making `calls` in all (each call's time appended to
    `latencies`), and how many calls failed."""
    done = len(latencies)
    failed = 0

    async def writer() -> None:
        nonlocal failed
        for _ in range(calls // tasks):
            started = time.perf_counter()
            try:
                await write(way)
            except Exception:
                failed += 1
                continue
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(tasks)))
    return (len(latencies) - done) / (time.perf_counter() - started), failed


async def measure(url: str, calls: int, tasks: int, rounds: int) -> list[str]:
    settings = Settings()
    engine = make_engine(url)
    horde = Horde(
        settings=settings,
        policies=load_policies(settings.policies),
        metrics=Metrics(),
        clock=Clock(),
        engine=engine,
        sessionmaker=make_sessionmaker(engine),
    )
    # The plugin's session handling on horde_lite's engine, and on the engine it makes itself.
    ours = SQLAlchemyAsyncConfig(
        engine_instance=engine, session_maker=make_sessionmaker(engine), before_send_handler="autocommit"
    )
    own = SQLAlchemyAsyncConfig(connection_string=url, before_send_handler="autocommit")
    ours_session = plugin_session(ours, State(ours.create_app_state_items()))
    own_session = plugin_session(own, State(own.create_app_state_items()))
    counter = Counter(engine)
    ways = {
        "Horde": Way(horde.reading, horde.transaction, counter, 1),
        "aa, our engine": Way(ours_session, ours_session, counter, 2),
        "aa, its engine": Way(own_session, own_session, Counter(own.get_engine()), 3),
    }
    async with horde.transaction() as s:
        for way in ways.values():
            row = {"id": way.user_id, "username": f"bench{way.user_id}", "created_at": 0.0}
            await s.execute(insert(User).values(api_key_hash=f"{way.user_id:064}", **row))
    means: dict[tuple[str, str], list[float]] = {}
    sent: dict[tuple[str, str], int] = {}
    rates: dict[str, list[float]] = {}
    latencies: dict[str, list[float]] = {}
    failed: dict[str, int] = {}
    lost: dict[str, int] = {}
    try:
        # Rounds, each way in turn: a machine's drift meets every way alike (medians printed).
        for _ in range(rounds):
            for name, way in ways.items():
                for op in (read, write):
                    means.setdefault((name, op.__name__), []).append(
                        await sequential(op, way, calls // rounds)
                    )
                    before = way.counter.sent
                    await op(way)
                    sent[name, op.__name__] = way.counter.sent - before
                rate, errors = await concurrent(way, tasks, calls // rounds, latencies.setdefault(name, []))
                rates.setdefault(name, []).append(rate)
                failed[name] = failed.get(name, 0) + errors
        async with horde.reading() as s:
            for name, way in ways.items():
                kudos = (await s.execute(select(User.kudos).where(User.id == way.user_id))).scalar_one()
                lost[name] = way.committed - int(kudos)
    finally:
        await engine.dispose()
        await own.get_engine().dispose()
    rows = []
    for (name, op), samples in means.items():
        row = f"  {name:<15} {op:<6} {statistics.median(samples) * 1e6:7.0f} us  {sent[name, op]:>4}"
        if op == "write":
            p99 = statistics.quantiles(latencies[name], n=100)[98] * 1000
            row += f"  {statistics.median(rates[name]):6.0f}/s  p99 {p99:7.1f} ms"
            row += f"  {failed[name]} failed, {lost[name]} lost"
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--calls", type=int, default=2000, help="calls per way and operation")
    parser.add_argument("--tasks", type=int, default=16, help="concurrent writers")
    parser.add_argument("--rounds", type=int, default=5, help="rounds the calls are split into")
    parser.add_argument("--pg-url", default=DEFAULT_PG, help=f"a server to create {BENCH_PG_DB} on")
    args = parser.parse_args()
    kinds = ("sqlite", "postgresql") if args.db == "both" else (args.db,)
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            url = fresh_database(kind, args.pg_url, Path(tmp))
            print(f"{kind}: {args.calls} calls one at a time; writes also by {args.tasks} tasks at once")
            print(f"  {'way':<15} {'op':<6} {'mean':>9}  {'sent':>4}  concurrent writes")
            for row in asyncio.run(measure(url, args.calls, args.tasks, args.rounds)):
                print(row)


if __name__ == "__main__":
    main()
