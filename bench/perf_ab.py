"""Two versions side by side, an earlier commit (A) and this checkout (B), on a machine whose
speed drifts: full job cycles (`--bench cycles`), `bench.perf_behind`'s pops (`--bench behind`), or
both, for several rounds; prints each round, the medians of A and B and their ratio B/A.

On a machine whose speed drifts from minute to minute (a shared virtual machine), two runs one
after the other differ by more than most changes do; two servers measured at once share the drift,
so their ratio is steady. Each server's CPU is its own process's; throughput is printed but not
compared (the two servers share the machine's cores).

`--bench cycles`: a server running A and one running B, each on its own database, loaded at the
same time by the same number of simulated workers; the median server CPU per cycle.

`--bench idle`: in each round, the base's own `bench.perf_idle` and this checkout's, one after the
other, the first of the two alternating; the medians of the idle pop's and the heartbeat's server
CPU per call.

`--bench behind`: in each round, the base's own `bench.perf_behind` (its code, run from the base's
worktree: its loaders, its server) and this checkout's, one after the other, the first of the two
alternating from round to round; per case, the medians of the wall time, the server's CPU and (on
PostgreSQL) PostgreSQL's CPU per pop.

    python -m bench.perf_ab --base HEAD~1            # cycles, PostgreSQL (127.0.0.1:5432), 8 workers each
    python -m bench.perf_ab --base main --db sqlite --rounds 4
    python -m bench.perf_ab --base a76ee58 --bench behind --db sqlite --rounds 2 --behind-pops 20
    python -m bench.perf_ab --base HEAD~1 --bench both
    python -m bench.perf_ab --base main --bench idle --db sqlite --rounds 4

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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.admission import BENCH_PG_DB, DEFAULT_PG
from bench.perf import RESULTS
from bench.perf_cycles import CycleResult, _measure
from bench.soak_servers import LIMITS_OFF, Server, free_port, fresh_postgres, server_env

ROOT = Path(__file__).resolve().parent.parent
CYCLE_ROUNDS = 6
# Fewer requests ahead than perf_behind's own default (1,000), so that a `both` run stays short:
# building them, not the measured pops, is most of each case's run. Its 100 pops are kept: CPU is
# read in clock ticks (10 ms), so a figure per pop is only as fine as 10 ms / pops.
BEHIND_ROUNDS, BEHIND_AHEAD, BEHIND_POPS = 3, 200, 100

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


# The interpreter each tree runs with (`--base-python` for the base): a base whose entry points
# (its policies) differ from this checkout's needs an install of its own.
_INTERPRETERS: dict[Path, str] = {}


def _python(code: Path) -> str:
    return _INTERPRETERS.get(code, sys.executable)


def _prepare(url: str, workers: int, code: Path) -> dict[str, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    out = subprocess.run([_python(code), "-c", _PREPARE, url, str(workers)], cwd=code, env=env,
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


@contextmanager
def _base_tree(base: str) -> Iterator[tuple[str, Path, Path]]:
    """The base's short hash, the base checked out in a temporary git worktree, and a scratch
    directory beside it; the worktree is removed at the end."""
    rev = _git("rev-parse", "--short", base)
    with tempfile.TemporaryDirectory(prefix="hl-ab-") as tmp_name:
        tmp = Path(tmp_name)
        tree = tmp / "base"
        _git("worktree", "add", "--detach", str(tree), rev)
        try:
            for code in (tree, ROOT):
                _check_code(code)
            yield rev, tree, tmp
        finally:
            _git("worktree", "remove", "--force", str(tree))


def _check_code(code: Path) -> None:
    """With PYTHONPATH set to `code`, Python imports that tree's horde_lite and bench, not an
    installed copy; otherwise the comparison would measure one version twice."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    script = "import bench, horde_lite; print(bench.__file__); print(horde_lite.__file__)"
    out = subprocess.run([_python(code), "-c", script], cwd=code, env=env, check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    for line in out.split():
        if not Path(line).resolve().is_relative_to(code.resolve()):
            raise SystemExit(f"perf_ab: with PYTHONPATH={code}, Python imports {line}")


async def run_cycles(
    rev: str, tree: Path, tmp: Path, db: str, pg_url: str, workers: int, seconds: float, rounds: int
) -> dict[str, Any]:
    """Full cycles: a server running the base (`tree`) and one running this checkout, loaded at once."""
    servers: list[Server] = []
    try:
        keys = []
        for name, code in (("a", tree), ("b", ROOT)):
            url = await _database(db, pg_url, name, tmp)
            keys.append(await asyncio.to_thread(_prepare, url, workers, code))
            env = server_env(url, LIMITS_OFF)  # the base must know these keys (this commit on)
            env["PYTHONPATH"] = str(code)
            (tmp / name).mkdir()
            servers.append(Server(len(servers), free_port(), tmp / name, env, python=_python(code)))
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
            print(f"cycles round {i + 1}: A ({rev}) {a.per_second:.1f}/s {a_ms:.2f} ms,"
                  f" B (checkout) {b.per_second:.1f}/s {b_ms:.2f} ms, errors {a.errors} / {b.errors}",
                  flush=True)  # fmt: skip
    finally:
        for s in servers:
            s.stop()
    ma, mb = statistics.median(cpu["a"]), statistics.median(cpu["b"])
    return {"workers": workers, "seconds": seconds, "rounds": rounds,
            "server_cpu_ms_per_cycle": cpu, "median_a": ma, "median_b": mb, "ratio": mb / ma}  # fmt: skip


# perf_behind's per-pop figures compared, as its rows name them; postgres_cpu_ms is None on SQLite.
BEHIND_FIGURES = ("wall_ms", "server_cpu_ms", "postgres_cpu_ms")


def _behind_table(out: str) -> list[dict[str, Any]]:
    """perf_behind's rows read back from its printed Markdown table, for versions without `--json`
    (a76ee58 and before): `| database | case | ahead | pops (found) | wall ms / pop | server CPU ms /
    pop | PostgreSQL CPU ms / pop |`, the figures to 0.1 ms, `-` for PostgreSQL's CPU on SQLite."""
    rows = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 7 or cells[0] not in ("sqlite", "postgresql"):
            continue  # the header, its rule, anything else printed
        db, case, ahead, pops_found, wall, server, pg = cells
        pops, found = pops_found.rstrip(")").split(" (")
        rows.append({"db": db, "case": case, "ahead": int(ahead.replace(",", "")), "pops": int(pops),
                     "found": int(found), "wall_ms": float(wall), "server_cpu_ms": float(server),
                     "postgres_cpu_ms": None if pg == "-" else float(pg)})  # fmt: skip
    return rows


def _run_behind(
    code: Path, db: str, case: str, ahead: int, pops: int, pg_url: str, out: Path
) -> list[dict[str, Any]]:
    """One run of the perf_behind of the code in `code` (that tree's own module, on PYTHONPATH),
    every case asked for; its rows, from its `--json` file when it has the option, else its table."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    command = [_python(code), "-m", "bench.perf_behind", "--db", db, "--case", case,
               "--ahead", str(ahead), "--pops", str(pops), "--pg-url", pg_url]  # fmt: skip
    has_json = '"--json"' in (code / "bench" / "perf_behind.py").read_text()
    if has_json:
        command += ["--json", str(out)]
    done = subprocess.run(command, cwd=code, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"perf_ab: {' '.join(command)} in {code} exited {done.returncode}:\n"
                         f"{done.stdout[-2000:]}{done.stderr[-3000:]}")  # fmt: skip
    rows = json.loads(out.read_text()) if has_json else _behind_table(done.stdout)
    if not rows:
        raise SystemExit(f"perf_ab: no rows from perf_behind in {code}:\n{done.stdout[-2000:]}")
    return rows


async def run_behind(
    rev: str, tree: Path, tmp: Path, db: str, pg_url: str, case: str, ahead: int, pops: int, rounds: int
) -> dict[str, Any]:
    """perf_behind of the base (`tree`) and of this checkout, one after the other in each round."""
    cases: dict[str, dict[str, Any]] = {}
    for i in range(rounds):
        order = [("a", tree), ("b", ROOT)][:: -1 if i % 2 else 1]  # which goes first alternates
        rows: dict[str, dict[str, dict[str, Any]]] = {}
        for name, code in order:
            out = tmp / f"behind-{name}-{i}.json"
            got = await asyncio.to_thread(_run_behind, code, db, case, ahead, pops, pg_url, out)
            rows[name] = {r["case"]: r for r in got}
        for c in [c for c in rows["b"] if c in rows["a"]]:  # the cases both versions have
            figures = cases.setdefault(c, {"found": {"a": [], "b": []}})
            for name in ("a", "b"):
                figures["found"][name].append(rows[name][c]["found"])
                for f in BEHIND_FIGURES:
                    if rows[name][c].get(f) is not None:
                        figures.setdefault(f, {"a": [], "b": []})[name].append(rows[name][c][f])
            a, b = rows["a"][c], rows["b"][c]
            shown = ", ".join(f"{f} {a[f]:.2f} / {b[f]:.2f}" for f in BEHIND_FIGURES
                              if a.get(f) is not None and b.get(f) is not None)  # fmt: skip
            print(f"behind round {i + 1} ({'B' if i % 2 else 'A'} first) {c}: A ({rev}) / B (checkout) "
                  f"{shown}, found {a['found']} / {b['found']}", flush=True)  # fmt: skip
        for c in sorted(set(rows["a"]) ^ set(rows["b"])):
            print(f"behind round {i + 1}: case {c} only in {'A' if c in rows['a'] else 'B'}, not compared")
    for figures in cases.values():
        for f in BEHIND_FIGURES:
            if f in figures and figures[f]["a"] and figures[f]["b"]:
                ma, mb = statistics.median(figures[f]["a"]), statistics.median(figures[f]["b"])
                figures[f].update(median_a=ma, median_b=mb, ratio=mb / ma if ma else None)
    return {"ahead": ahead, "pops": pops, "case": case, "rounds": rounds, "cases": cases}


def _print_behind(rev: str, result: dict[str, Any]) -> None:
    print(f"perf_behind medians per pop, ms: A ({rev}), B (checkout)")
    print("| case | figure | A | B | B/A |")
    print("|---|---|---|---|---|")
    for case, figures in result["cases"].items():
        for f in BEHIND_FIGURES:
            if "median_a" in figures.get(f, {}):
                x = figures[f]
                ratio = "-" if x["ratio"] is None else f"{x['ratio']:.3f}"
                print(f"| {case} | {f} | {x['median_a']:.2f} | {x['median_b']:.2f} | {ratio} |")
        if figures["found"]["a"] != figures["found"]["b"]:
            print(f"| {case} | found differs: A {figures['found']['a']}, B {figures['found']['b']} | | | |")


IDLE_ROUNDS = 4
IDLE_FIGURES = ("idle_cpu_ms", "heartbeat_cpu_ms")


def _run_idle(code: Path, db: str, pg_url: str) -> dict[str, float]:
    """One run of the perf_idle of the code in `code`: its idle pop's and heartbeat's server CPU
    per call, read back from its printed table (`| database | idle pop: CPU / wall | heartbeat:
    CPU / wall | rounds |`)."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    command = [_python(code), "-m", "bench.perf_idle", "--db", db, "--pg-url", pg_url, "--rounds", "3"]
    done = subprocess.run(command, cwd=code, env=env, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if done.returncode == 0 and len(cells) == 4 and cells[0] == db:
            idle, heartbeat = (float(cell.split("/")[0]) for cell in cells[1:3])
            return {"idle_cpu_ms": idle, "heartbeat_cpu_ms": heartbeat}
    raise SystemExit(f"perf_ab: {' '.join(command)} in {code} exited {done.returncode}:\n"
                     f"{done.stdout[-2000:]}{done.stderr[-3000:]}")  # fmt: skip


def run_idle(rev: str, tree: Path, db: str, pg_url: str, rounds: int) -> dict[str, Any]:
    """perf_idle of the base (`tree`) and of this checkout, one after the other in each round."""
    figures: dict[str, Any] = {f: {"a": [], "b": []} for f in IDLE_FIGURES}
    for i in range(rounds):
        order = [("a", tree), ("b", ROOT)][:: -1 if i % 2 else 1]  # which goes first alternates
        got = {name: _run_idle(code, db, pg_url) for name, code in order}
        for f in IDLE_FIGURES:
            for name in ("a", "b"):
                figures[f][name].append(got[name][f])
        print(
            f"idle round {i + 1} ({'B' if i % 2 else 'A'} first): A ({rev}) / B (checkout) "
            + ", ".join(f"{f} {got['a'][f]:.2f} / {got['b'][f]:.2f}" for f in IDLE_FIGURES),
            flush=True,
        )
    for f in IDLE_FIGURES:
        ma, mb = statistics.median(figures[f]["a"]), statistics.median(figures[f]["b"])
        figures[f].update(median_a=ma, median_b=mb, ratio=mb / ma)
        print(f"median {f}: A {ma:.2f}, B {mb:.2f}, B/A {mb / ma:.3f}", flush=True)
    return {"rounds": rounds, **figures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="the commit A runs (default HEAD)")
    parser.add_argument("--bench", choices=["cycles", "behind", "both", "idle"], default="cycles")
    parser.add_argument("--db", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="a server to create the databases on")
    parser.add_argument("--rounds", type=int, help=f"rounds (default {CYCLE_ROUNDS} of cycles, "
                        f"{BEHIND_ROUNDS} of perf_behind, {IDLE_ROUNDS} of perf_idle)")  # fmt: skip
    parser.add_argument("--workers", type=int, default=8, help="cycles: simulated workers per server")
    parser.add_argument("--seconds", type=float, default=10.0, help="cycles: length of a round")
    parser.add_argument("--behind-case", default="all", help="perf_behind's --case (default all)")
    parser.add_argument("--behind-ahead", type=int, default=BEHIND_AHEAD, help="perf_behind's --ahead")
    parser.add_argument("--behind-pops", type=int, default=BEHIND_POPS, help="perf_behind's --pops")
    parser.add_argument("--base-python", help="the interpreter the base runs with (default this one): "
                        "an install of the base's own, when its policies' entry points differ")  # fmt: skip
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"base": None, "db": args.db, "bench": args.bench}
    with _base_tree(args.base) as (rev, tree, tmp):
        result["base"] = rev
        if args.base_python:
            _INTERPRETERS[tree] = args.base_python
        if args.bench in ("cycles", "both"):
            rounds = args.rounds or CYCLE_ROUNDS
            cycles = asyncio.run(
                run_cycles(rev, tree, tmp, args.db, args.pg_url, args.workers, args.seconds, rounds)
            )
            result.update(cycles)  # at the top level, as before perf_behind was compared
            print(f"median server CPU ms per cycle: A {cycles['median_a']:.2f}, B {cycles['median_b']:.2f}, "
                  f"B/A {cycles['ratio']:.3f}", flush=True)  # fmt: skip
        if args.bench in ("behind", "both"):
            rounds = args.rounds or BEHIND_ROUNDS
            behind = run_behind(rev, tree, tmp, args.db, args.pg_url, args.behind_case, args.behind_ahead,
                                args.behind_pops, rounds)  # fmt: skip
            result["behind"] = asyncio.run(behind)
            _print_behind(rev, result["behind"])
        if args.bench == "idle":
            result["idle"] = run_idle(rev, tree, args.db, args.pg_url, args.rounds or IDLE_ROUNDS)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"perf-ab-{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
