"""Full job cycles of two versions side by side: a server running an earlier commit (A) and one
running this checkout (B), each on its own database, loaded at the same time by the same number of
simulated workers, for several rounds; prints each round and the median server CPU per cycle.

On a machine whose speed drifts from minute to minute (a shared virtual machine), two runs one
after the other differ by more than most changes do; two servers measured at once share the drift,
so their ratio is steady. Each server's CPU is its own process's; throughput is printed but not
compared (the two servers share the machine's cores).

    python -m bench.perf_ab --base HEAD~1            # PostgreSQL (127.0.0.1:5432), 8 workers each
    python -m bench.perf_ab --base main --db sqlite --rounds 4

The base is checked out in a temporary git worktree (removed afterwards); its own code migrates
its database and creates its users.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.admission import BENCH_PG_DB, DEFAULT_PG
from bench.perf import RESULTS
from bench.perf_cycles import CycleResult, _measure
from bench.soak_servers import LIMITS_OFF, Server, free_port, fresh_postgres, server_env

ROOT = Path(__file__).resolve().parent.parent

# Run by each version's own code (PYTHONPATH): migrate its database, create the bench's users,
# print their keys.
_PREPARE = """
import asyncio, json, sys
from bench.soak import set_up_users
from horde_lite.db import migrate
from horde_lite.db.engine import make_engine

async def main(url, workers):
    await asyncio.to_thread(migrate.upgrade, url)
    engine = make_engine(url)
    try:
        print(json.dumps(await set_up_users(engine, workers, workers)))
    finally:
        await engine.dispose()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


async def _database(db: str, pg_url: str, name: str, tmp: Path) -> str:
    if db == "sqlite":
        return f"sqlite+aiosqlite:///{tmp / f'{name}.db'}"
    from sqlalchemy.engine import make_url

    url = make_url(pg_url).set(database=f"{BENCH_PG_DB}_{name}").render_as_string(hide_password=False)
    await fresh_postgres(url)
    return url


def _prepare(url: str, workers: int, code: Path) -> dict[str, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    out = subprocess.run([sys.executable, "-c", _PREPARE, url, str(workers)], cwd=code, env=env,
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


async def run(
    base: str, db: str, pg_url: str, workers: int, seconds: float, rounds: int
) -> dict[str, object]:
    rev = _git("rev-parse", "--short", base)
    with tempfile.TemporaryDirectory(prefix="hl-ab-") as tmp_name:
        tmp = Path(tmp_name)
        tree = tmp / "base"
        _git("worktree", "add", "--detach", str(tree), rev)
        servers: list[Server] = []
        try:
            keys = []
            for name, code in (("a", tree), ("b", ROOT)):
                url = await _database(db, pg_url, name, tmp)
                keys.append(await asyncio.to_thread(_prepare, url, workers, code))
                env = server_env(url, LIMITS_OFF)  # the base must know these keys (this commit on)
                env["PYTHONPATH"] = str(code)
                (tmp / name).mkdir()
                servers.append(Server(len(servers), free_port(), tmp / name, env))
            await asyncio.gather(*(s.start() for s in servers))

            async def both(secs: float, flip: bool = False) -> tuple[CycleResult, ...]:
                # Which server's workers start first alternates, so that neither gets a head start.
                pairs = list(zip(servers, keys, strict=True))[:: -1 if flip else 1]
                done = await asyncio.gather(*(_measure([s], k, workers, secs, db, "ab") for s, k in pairs))
                return tuple(done[:: -1 if flip else 1])

            await both(3.0)  # warm-up: connections, prepared statements, the queue copy
            cpu: dict[str, list[float]] = {"a": [], "b": []}
            for i in range(rounds):
                a, b = await both(seconds, flip=i % 2 == 1)
                for name, r in (("a", a), ("b", b)):
                    if r.server_cpu_ms_per_cycle is not None:
                        cpu[name].append(r.server_cpu_ms_per_cycle)
                a_ms, b_ms = a.server_cpu_ms_per_cycle or 0.0, b.server_cpu_ms_per_cycle or 0.0
                print(f"round {i + 1}: A ({rev}) {a.per_second:.1f}/s {a_ms:.2f} ms,"
                      f" B (checkout) {b.per_second:.1f}/s {b_ms:.2f} ms, errors {a.errors} / {b.errors}",
                      flush=True)  # fmt: skip
        finally:
            for s in servers:
                s.stop()
            _git("worktree", "remove", "--force", str(tree))
    ma, mb = statistics.median(cpu["a"]), statistics.median(cpu["b"])
    return {"base": rev, "db": db, "workers": workers, "seconds": seconds, "rounds": rounds,
            "server_cpu_ms_per_cycle": cpu, "median_a": ma, "median_b": mb, "ratio": mb / ma}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="the commit server A runs (default HEAD)")
    parser.add_argument("--db", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="a server to create the two databases on")
    parser.add_argument("--workers", type=int, default=8, help="simulated workers per server")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of a round")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    result = asyncio.run(run(args.base, args.db, args.pg_url, args.workers, args.seconds, args.rounds))
    print(f"median server CPU ms per cycle: A {result['median_a']:.2f}, B {result['median_b']:.2f}, "
          f"B/A {result['ratio']:.3f}")  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"perf-ab-{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
