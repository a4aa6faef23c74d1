"""A pop behind many requests it may not take, over HTTP against one real `horde-lite run` process,
one pop at a time: wall time and the CPU the server and PostgreSQL spend per pop.

    .venv/bin/python -m bench.perf_behind                          # every case, both databases
    .venv/bin/python -m bench.perf_behind --db postgresql --case deny --ahead 1000
    .venv/bin/python -m bench.perf_behind --db sqlite --json rows.json     # the rows as JSON too

The cases: `ahead` requests at the head of the worker's part of the queue, then the measured pops:
- `running`: their jobs were all taken by another worker (being generated); `pops` takeable
  requests wait behind them, and each measured pop takes one;
- `nsfw`: they ask for NSFW workers, which the popping worker is not; each pop finds nothing;
- `deny`: their deny-list names the popping worker (the walk skips them through their refusals); each pop
  finds nothing;
- `target`: they name another worker as the only one allowed (targeting); each pop finds nothing;
- `models`: they ask for a model the popping worker does not serve, and it serves 8 others (so
  its walk reads the whole queue's order, not its models' entries); each pop finds nothing;
- `gate`: they are chat requests longer than the popping worker can finish inside a lease, and a
  worker that can is online (the speed gate, `prefer_capable`, refuses them); each pop finds
  nothing. The bench turns requests made through the horde API into chat requests in the database,
  since a chat request made through `/v1` holds its connection until it is served;
- `fleet`: as `gate`, with FLEET more slow chat workers online beside the popping one, as on a
  horde with a few fast workers among many slow ones (the speed gate asks, for each request it
  refuses, whether a worker that can is online);
- `gate-models`: as `gate`, and the popping worker serves 8 models, the requests' among them (so
  its walk reads the whole queue's order, as in `models`);
- `gate-deny`: as `gate`, and each request's deny-list names a worker that is not online (its
  refusals are read by the speed gate's question in the walk).

Before the measured pops the database's planner statistics are brought up to date (`VACUUM
ANALYZE`, SQLite's `ANALYZE`), as autovacuum keeps them on a horde that has run a while: without,
PostgreSQL plans for the empty tables the bench started from.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import insert, select, text, update

from bench.admission import BENCH_PG_DB, DEFAULT_PG
from bench.perf_cycles import CREATE, _cpu_seconds, _pop_body
from bench.soak import set_up_users
from bench.soak_servers import LIMITS_OFF, Server, free_port, fresh_postgres, server_env
from horde_lite.db import migrate
from horde_lite.db.engine import make_engine
from horde_lite.db.models import QueueEntry, TextRequest, Worker, WorkerModel
from horde_lite.queue.queue_index import MANY_MODELS
from horde_lite.settings import Settings

CASES = ("running", "nsfw", "deny", "target", "models", "gate", "fleet", "gate-models", "gate-deny")
POP = "/api/v2/generate/text/pop"
CREATE_PATH = "/api/v2/generate/text/async"


async def _database(db: str, pg_url: str, work: Path) -> str:
    if db == "sqlite":
        url = f"sqlite+aiosqlite:///{work / 'behind.db'}"
    else:
        from sqlalchemy.engine import make_url

        url = make_url(pg_url).set(database=BENCH_PG_DB).render_as_string(hide_password=False)
        await fresh_postgres(url)
    await asyncio.to_thread(migrate.upgrade, url)
    return url


# Both workers' chat declaration in the `gate` case; the requests ahead ask for GATE_LENGTH tokens,
# which the popping worker (capacity GATE_SLOW) cannot finish inside a lease and the other can.
GATE_CHAT = {"max_completion_tokens": 2048, "max_context_tokens": 8192}
GATE_LENGTH, GATE_SLOW, GATE_FAST = 512, 100, 10_000
FLEET = 200  # the `fleet` case's other slow workers
GATED = ("gate", "fleet", "gate-models", "gate-deny")  # the cases of chat requests the speed gate refuses


async def _chat_ahead(url: str, slow_id: str, fast_id: str, fleet: int) -> None:
    """The `gate` case: every waiting request becomes a chat request of GATE_LENGTH tokens (its
    queue entries too), and the two workers get their capacities; `fleet` copies of the slow worker
    (online, as it is) join them."""
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            chat = {"messages": [{"role": "user", "content": "hi"}]}
            await conn.execute(
                update(TextRequest)
                .where(TextRequest.state == "waiting")
                .values(is_chat=True, max_length=GATE_LENGTH, prompt_tokens=10, chat=chat)
            )
            await conn.execute(update(QueueEntry).values(is_chat=True, need_length=GATE_LENGTH,
                                                         need_context=GATE_LENGTH + 10))  # fmt: skip
            window = Settings().lease.generation_window_seconds  # the server runs the defaults
            for worker_id, capacity in ((slow_id, GATE_SLOW), (fast_id, GATE_FAST)):
                speed = capacity / window
                values = {"lease_speed": speed, "speed_samples": [speed], "capacity": capacity}
                await conn.execute(update(Worker).where(Worker.id == worker_id).values(**values))
            if fleet:
                slow = (
                    (await conn.execute(select(Worker.__table__).where(Worker.id == slow_id)))
                    .mappings()
                    .one()
                )
                links = (
                    await conn.execute(select(WorkerModel.model).where(WorkerModel.worker_id == slow_id))
                ).all()
                copies = [{**slow, "id": str(uuid.uuid4()), "name": f"slow-{i}", "name_key": f"slow-{i}"}
                          for i in range(fleet)]  # fmt: skip
                await conn.execute(insert(Worker.__table__), copies)
                served = [{"worker_id": c["id"], "model": m} for c in copies for (m,) in links]
                await conn.execute(insert(WorkerModel.__table__), served)
    finally:
        await engine.dispose()


async def _settle(url: str) -> None:
    """The planner's statistics, as autovacuum keeps them on a horde that has run a while."""
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                await conn.execute(text("COMMIT"))  # VACUUM runs outside a transaction
                await conn.execute(text("VACUUM ANALYZE"))
            else:
                await conn.execute(text("ANALYZE"))
                await conn.commit()
    finally:
        await engine.dispose()


async def run_case(db: str, case: str, ahead: int, pops: int, pg_url: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hl-behind-") as tmp:
        work = Path(tmp)
        url = await _database(db, pg_url, work)
        engine = make_engine(url)
        try:
            keys = await set_up_users(engine, 2, 1)
        finally:
            await engine.dispose()
        overrides = {**LIMITS_OFF, "request": {"max_waiting_per_user": ahead + pops + 10}}
        server = Server(0, free_port(), work, server_env(url, overrides))
        await server.start()
        owner, other, requester = keys["owners"][0], keys["owners"][1], keys["registered"][0]
        try:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:

                async def post(path: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
                    response = await http.post(path, json=body, headers={"apikey": key})
                    if response.status_code not in (200, 202):
                        raise SystemExit(f"perf_behind: {path}: {response.status_code} {response.text}")
                    return response.json()

                measured, others = _pop_body(0), _pop_body(1)
                if case == "models":
                    measured["models"] = [f"bench/Other-{i}" for i in range(MANY_MODELS)]
                if case == "gate-models":
                    measured["models"] += [f"bench/Other-{i}" for i in range(MANY_MODELS - 1)]
                if case in GATED:
                    measured["chat"] = others["chat"] = GATE_CHAT
                await post(POP, owner, measured)  # the measured worker exists, and the other
                await post(POP, other, others)
                workers = {w["name"]: w["id"] for w in (await http.get("/api/v2/workers")).json()}
                worker_id, other_id = workers[_pop_body(0)["name"]], workers[_pop_body(1)["name"]]
                refusing = {
                    "nsfw": {"nsfw": True},
                    "deny": {"workers": [worker_id], "worker_blacklist": True},
                    "target": {"workers": [other_id]},
                    "gate-deny": {"worker_blacklist": ["nobody"]},
                }.get(case, {})
                for _ in range(ahead):
                    await post(CREATE_PATH, requester, {**CREATE, **refusing})
                if case in GATED:
                    await _chat_ahead(url, worker_id, other_id, FLEET if case == "fleet" else 0)
                if case == "running":  # another worker takes every job ahead
                    for _ in range(ahead):
                        assert (await post(POP, other, _pop_body(1)))["id"] is not None
                    for _ in range(pops + 10):
                        await post(CREATE_PATH, requester, CREATE)
                await _settle(url)
                for _ in range(10):  # warm: statements built and prepared
                    await post(POP, owner, measured)
                pgids = {server.process.pid} if server.process is not None else set()
                (cpu0, pg0), began = _cpu_seconds(pgids), time.perf_counter()
                found = 0
                for _ in range(pops):
                    found += (await post(POP, owner, measured))["id"] is not None
                (cpu1, pg1), ended = _cpu_seconds(pgids), time.perf_counter()
        finally:
            server.stop()
    return {"db": db, "case": case, "ahead": ahead, "pops": pops, "found": found,
            "wall_ms": (ended - began) * 1000 / pops, "server_cpu_ms": (cpu1 - cpu0) * 1000 / pops,
            "postgres_cpu_ms": (pg1 - pg0) * 1000 / pops if db == "postgresql" else None}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--case", choices=[*CASES, "all"], default="all")
    parser.add_argument("--ahead", type=int, default=1000, help="requests ahead of the measured pops")
    parser.add_argument("--pops", type=int, default=100, help="measured pops")
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--json", type=Path, help="also write the rows (run_case's results) to this file")
    args = parser.parse_args(argv)
    kinds = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    cases = CASES if args.case == "all" else (args.case,)
    print("| database | case | ahead | pops (found) | wall ms / pop | server CPU ms / pop "
          "| PostgreSQL CPU ms / pop |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    rows = []
    for db in kinds:
        for case in cases:
            r = asyncio.run(run_case(db, case, args.ahead, args.pops, args.pg_url))
            rows.append(r)
            pg = "-" if r["postgres_cpu_ms"] is None else f"{r['postgres_cpu_ms']:.1f}"
            print(f"| {db} | {case} | {r['ahead']:,} | {r['pops']} ({r['found']}) | {r['wall_ms']:.1f} | "
                  f"{r['server_cpu_ms']:.1f} | {pg} |", flush=True)  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
