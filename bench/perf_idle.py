"""What an idle pop costs the server: a known worker polling with nothing to do, over HTTP as a
worker calls it, against one real `horde-lite run` process on a fresh database.

One worker serves a model no request asks for while `--queued` requests wait for another; it polls
`--pops` times in a row on one keep-alive connection, for `--rounds` rounds. Each round reads the
server process's user + system CPU (Linux /proc) before and after, so a figure is the whole request
through the server: uvicorn, Litestar, the middleware, the pop's reads, the answer. A heartbeat
round (the smallest call the app answers) is measured alike, for the floor of the HTTP stack.

    python -m bench.perf_idle                       # both databases
    python -m bench.perf_idle --db postgresql --pops 1000 --rounds 7
    python -m bench.perf_idle --db postgresql --idle-answer-seconds 0   # every pop reads the database

On PostgreSQL the horde answers a known worker's idle poll again from memory while nothing arrives
for its models (`[pops] idle_answer_seconds`): with the default, nearly every pop here is such an
answer; with 0, each reads the database, as a poll after a new request does.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.admission import BENCH_PG_DB, DEFAULT_PG, pct
from bench.perf_cycles import _cpu_seconds
from bench.soak import set_up_users
from bench.soak_servers import LIMITS_OFF, Server, free_port, fresh_bench_database, server_env
from horde_lite.db.engine import make_engine

WANTED, UNWANTED = "bench/Wanted-8B", "bench/Idle-8B"
POP = {"name": "idle-worker", "models": [UNWANTED], "max_length": 512, "max_context_length": 2048,
       "bridge_agent": "perf:1:bench"}  # fmt: skip


async def _round(http: httpx.AsyncClient, server: Server, calls: int, call: Any) -> tuple[float, float]:
    """(server CPU ms per call, wall p50 ms) of `calls` calls in a row."""
    assert server.process is not None
    pgids = {server.process.pid}
    walls: list[float] = []
    cpu0, _ = _cpu_seconds(pgids)
    for _ in range(calls):
        began = time.perf_counter()
        response = await call(http)
        walls.append((time.perf_counter() - began) * 1000)
        if response.status_code != 200:
            raise SystemExit(f"perf_idle: {response.status_code} {response.text[:300]}")
    cpu1, _ = _cpu_seconds(pgids)
    return (cpu1 - cpu0) * 1000 / calls, pct(walls, 0.5)


async def run(
    db: str, pg_url: str, pops: int, rounds: int, queued: int, remember: float | None = None
) -> dict[str, Any]:
    """`remember`: the server's `[pops] idle_answer_seconds` (None: its default)."""
    with tempfile.TemporaryDirectory(prefix="hl-idle-") as tmp:
        work = Path(tmp)
        url = await fresh_bench_database(db, pg_url, BENCH_PG_DB, work, "idle.db")
        engine = make_engine(url)
        try:
            keys = await set_up_users(engine, 1, 1)
        finally:
            await engine.dispose()
        overrides = dict(LIMITS_OFF)
        if remember is not None:
            overrides["pops"] = {"idle_answer_seconds": remember}
        server = Server(0, free_port(), work, server_env(url, overrides))
        await server.start()
        owner, requester = keys["owners"][0], keys["registered"][0]
        try:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:

                async def pop(h: httpx.AsyncClient) -> httpx.Response:
                    return await h.post("/api/v2/generate/text/pop", json=POP, headers={"apikey": owner})

                async def heartbeat(h: httpx.AsyncClient) -> httpx.Response:
                    return await h.get("/api/v2/status/heartbeat")

                await pop(http)  # the worker is known from here on
                # Creations need a worker for their model: one checks in, then leaves it to them.
                await http.post("/api/v2/generate/text/pop", headers={"apikey": owner},
                                json={**POP, "name": "busy-worker", "models": [WANTED]})  # fmt: skip
                for _ in range(queued):
                    body = {"prompt": "Once", "models": [WANTED], "params": {"max_length": 64}}
                    created = await http.post(
                        "/api/v2/generate/text/async", json=body, headers={"apikey": requester}
                    )
                    if created.status_code != 202:
                        raise SystemExit(f"perf_idle: create {created.status_code} {created.text[:300]}")
                answer = (await pop(http)).json()
                if answer.get("id") is not None:
                    raise SystemExit("perf_idle: the idle worker was handed a job")
                await _round(http, server, pops, pop)  # warm-up
                idle = [await _round(http, server, pops, pop) for _ in range(rounds)]
                floor = [await _round(http, server, pops, heartbeat) for _ in range(rounds)]
        finally:
            server.stop()
    return {
        "db": db,
        "idle_cpu_ms": statistics.median(c for c, _ in idle),
        "idle_wall_ms": statistics.median(w for _, w in idle),
        "heartbeat_cpu_ms": statistics.median(c for c, _ in floor),
        "heartbeat_wall_ms": statistics.median(w for _, w in floor),
        "rounds": [round(c, 3) for c, _ in idle],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--pops", type=int, default=500, help="calls per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--queued", type=int, default=20, help="requests waiting for another model")
    remember = "the server's [pops] idle_answer_seconds (0: every pop reads the database)"
    parser.add_argument("--idle-answer-seconds", type=float, default=None, help=remember)
    args = parser.parse_args(argv)
    kinds = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    print("| database | idle pop: server CPU ms / wall p50 ms | heartbeat: server CPU ms / wall p50 ms "
          "| rounds (CPU ms) |")  # fmt: skip
    print("|---|---|---|---|")
    for kind in kinds:
        r = asyncio.run(run(kind, args.pg_url, args.pops, args.rounds, args.queued, args.idle_answer_seconds))
        print(f"| {r['db']} | {r['idle_cpu_ms']:.2f} / {r['idle_wall_ms']:.2f} | "
              f"{r['heartbeat_cpu_ms']:.2f} / {r['heartbeat_wall_ms']:.2f} | {r['rounds']} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
