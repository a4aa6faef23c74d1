"""Waiting pops: how long from a request's creation to the answer of a pop that waits for it, in
one process, across two processes (PostgreSQL: the NOTIFY; SQLite: the change-log watcher), and
how many pops one new request wakes when many wait on one process.

    .venv/bin/python -m bench.waiting_pops --db sqlite
    .venv/bin/python -m bench.waiting_pops --db postgresql+asyncpg://postgres@127.0.0.1:5432/horde_lite_bench_wait

Real `horde-lite run` processes on loopback ports, a fresh database (a PostgreSQL database named
for the bench is dropped and recreated). Each round: a waiting pop (`wait_seconds` 20) until the
server counts it waiting, then one request; the time is from sending the request to the pop's
answer, and from sending the request to its own answer. It prints numbers; it asserts nothing
about them. Bounded: a few rounds, each at most the pop's wait.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.soak_servers import LIMITS_OFF, Server, free_port, fresh_postgres, is_postgres, server_env
from horde_lite.demo.server import make_users

ANON = "0000000000"
POP = "/api/v2/generate/text/pop"
CREATE = "/api/v2/generate/text/async"


def _gauge(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            head, _, number = line.rpartition(" ")
            if head == name or head.startswith(name + "{"):
                total += float(number)
    return total


async def _until_waiting(http: httpx.AsyncClient, base: str, count: int) -> None:
    deadline = time.monotonic() + 60
    while _gauge((await http.get(f"{base}/metrics")).text, "horde_pop_waiting") < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: never {count} waiting pops on {base}")
        await asyncio.sleep(0.02)


async def _round(
    http: httpx.AsyncClient, pop_base: str, create_base: str, key: str, name: str
) -> tuple[float, float]:
    body = {"name": name, "models": ["m"], "wait_seconds": 20}
    pop = asyncio.create_task(http.post(f"{pop_base}{POP}", json=body, headers={"apikey": key}))
    await _until_waiting(http, pop_base, 1)
    sent = time.perf_counter()
    created = await http.post(f"{create_base}{CREATE}", json={"prompt": "Hi.", "models": ["m"]})
    admitted = time.perf_counter() - sent
    answer = (await pop).json()
    answered = time.perf_counter() - sent
    if created.status_code != 202 or answer.get("id") is None:
        raise SystemExit(f"bench: the waiting pop got no job: {created.text} / {answer}")
    # Hand the job back finished, so the next round's queue is empty again.
    done = {"id": answer["id"], "generation": "ok", "state": "ok"}
    await http.post(f"{pop_base}/api/v2/generate/text/submit", json=done, headers={"apikey": key})
    return admitted, answered


async def _herd(base: str, key: str, waiters: int) -> tuple[float, float, float]:
    """`waiters` pops wait; one request of one job: the time to its job's answer, and the woken
    tries and wake-ups it cost. A client of its own: one connection per waiting pop."""
    limits = httpx.Limits(max_connections=waiters + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as http:
        before = (await http.get("/metrics")).text
        body = {"models": ["m"], "wait_seconds": 20}
        pops = [
            asyncio.create_task(http.post(POP, json={"name": f"h{i}", **body}, headers={"apikey": key}))
            for i in range(waiters)
        ]
        await _until_waiting(http, base, waiters)
        sent = time.perf_counter()
        await http.post(CREATE, json={"prompt": "Hi.", "models": ["m"]})
        first = None
        for done in asyncio.as_completed(pops):
            answer = (await done).json()
            if answer.get("id") is not None and first is None:
                first = time.perf_counter() - sent
        after = (await http.get("/metrics")).text
    tries = _gauge(after, "horde_pop_woken_total") - _gauge(before, "horde_pop_woken_total")
    wakes = _gauge(after, "horde_pop_wakeups_total") - _gauge(before, "horde_pop_wakeups_total")
    return first or float("nan"), tries, wakes


def _ms(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    p50, most = statistics.median(values), max(values)
    return f"p50 {p50 * 1000:7.1f} ms  p90 {p90 * 1000:7.1f} ms  max {most * 1000:7.1f} ms"


async def run(db_url: str, rounds: int, waiters: int, workdir: Path) -> None:
    if is_postgres(db_url):
        await fresh_postgres(db_url)
    keys = await make_users(db_url, {"bench": 0})
    key = keys["bench"]
    overrides = {**LIMITS_OFF, "pops": {"wait_poll_seconds": 1.0}}
    env = server_env(db_url, overrides)
    servers = [Server(i, free_port(), workdir, env) for i in range(2)]
    for server in servers:
        await server.start()
    one, other = (s.base_url for s in servers)
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            await asyncio.sleep(1.0)  # the listeners connect after the heartbeat answers
            kind = "PostgreSQL" if is_postgres(db_url) else "SQLite"
            for label, create_base in (("same process", one), ("other process", other)):
                admitted, answered = [], []
                for i in range(rounds):
                    a, b = await _round(http, one, create_base, key, f"w{i % 4}")
                    admitted.append(a)
                    answered.append(b)
                print(f"{kind}, request created in the {label}, {rounds} rounds:")
                print(f"  request's own answer:       {_ms(admitted)}")
                print(f"  waiting pop's answer (job): {_ms(answered)}")
            first, tries, wakes = await _herd(one, key, waiters)
            print(
                f"{kind}, {waiters} pops waiting on one process, one request of one job: the job "
                f"answered after {first * 1000:.1f} ms; {wakes:.0f} pops woken, {tries:.0f} woken tries"
            )
    finally:
        for server in servers:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", default="sqlite", help="sqlite (a temporary file) or a PostgreSQL URL")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--waiters", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="horde-lite-bench-wait-") as tmp:
        workdir = Path(tmp)
        url = f"sqlite+aiosqlite:///{workdir / 'bench.db'}" if args.db == "sqlite" else args.db
        asyncio.run(run(url, max(1, min(args.rounds, 200)), max(1, min(args.waiters, 2000)), workdir))


if __name__ == "__main__":
    main()
