"""`horde-lite demo`: a whole horde in one command (docs/reference/worker.md, "The demo").

The server runs as a child process on a throwaway SQLite file (or the configured database); a
simulated fleet and a client load run in this process; the table refreshes every second. Ctrl-C
(or `--seconds`) stops the clients, then the workers (jobs in hand finish or are faulted), then
the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import click
import httpx

from horde_lite.demo.board import render, snapshot
from horde_lite.demo.fleet import Fleet
from horde_lite.demo.load import Load
from horde_lite.demo.server import Server, make_users


@click.command("demo", help="Start a server, a simulated fleet and a client load, and show it live.")
@click.option("--seconds", type=click.FloatRange(1), help="Stop by itself after this long (default: Ctrl-C).")
@click.option(
    "--configured-database",
    is_flag=True,
    help="Use the configured database (litestar.toml / HORDE_LITE_DATABASE__URL) instead of a "
    "throwaway SQLite file; users and workers get a random suffix.",
)
@click.option(
    "--refresh", type=click.FloatRange(0.2), default=1.0, show_default=True, help="Seconds between refreshes."
)
def demo(seconds: float | None, configured_database: bool, refresh: float) -> None:
    with tempfile.TemporaryDirectory(prefix="horde-lite-demo-") as tmp:
        work = Path(tmp)
        if configured_database:
            from horde_lite.settings import load_settings, masked

            url, suffix = load_settings().database.url, "-" + secrets.token_hex(2)
            click.echo(f"database: {masked(url)}", err=True)
        else:
            url, suffix = f"sqlite+aiosqlite:///{work / 'demo.db'}", ""
        logging.basicConfig(
            filename=work / "workers.log",
            level=logging.INFO,
            force=True,
            format="%(asctime)s %(levelname)s %(message)s",
        )
        logging.getLogger("httpx").setLevel(logging.WARNING)
        code = asyncio.run(_demo(work, url, suffix, seconds, refresh))
    sys.exit(code)


async def _demo(work: Path, url: str, suffix: str, seconds: float | None, refresh: float) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tty = sys.stdout.isatty()
    click.echo(f"horde-lite demo: starting the server (database {url.split('://')[0]}, files in {work})")
    keys = await make_users(url, {f"volunteer{suffix}": 0, f"alice{suffix}": 50_000})
    server = await Server.start(url, work / "server.log")
    fleet = Fleet.start(server.url, keys[f"volunteer{suffix}"], suffix)
    load = Load(server.url, keys[f"alice{suffix}"])
    loading = asyncio.create_task(load.run())
    started = time.monotonic()
    code = 0
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=10.0) as http:
            while not stop.is_set():
                elapsed = time.monotonic() - started
                if seconds is not None and elapsed >= seconds:
                    break
                limit = f" of {seconds:g}" if seconds else ""
                headline = (
                    f"horde_lite demo: {elapsed:.0f} s{limit}, server {server.url}, "
                    f"logs in {work} -- Ctrl-C stops"
                )
                served = {w.config.name: w.served for w in fleet.workers}
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    frame = render(await snapshot(http), load.tally, headline, served)
                    click.echo(("\x1b[H\x1b[2J" if tty else "\n") + frame)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), refresh)
    finally:
        click.echo("\nstopping: clients, then workers (jobs in hand finish or are faulted), then the server")
        loading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loading
        # Each step is bounded: a stop that hangs says which step and goes on, so the demo always ends.
        stuck = [name for name, ok in [
            ("clients", await _bounded(load.aclose(), STOP_CLIENTS_SECONDS)),
            ("workers", await _bounded(fleet.stop(), STOP_WORKERS_SECONDS)),
        ] if not ok]  # fmt: skip
        server.stop()
        for name in stuck:
            click.echo(f"the {name} did not stop in time and were abandoned (server log: {server.log})")
            code = 1
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    tally = load.tally
    failed = fleet.failed()
    click.echo(
        f"demo finished: served {tally.total('served')} requests, refused {tally.total('refused')}, "
        f"failed {tally.total('failed')}, workers stopped with an error: {len(failed)}"
    )
    log = work / "workers.log"
    if log.exists():
        click.echo("the workers' log ends with:")
        for line in log.read_text().splitlines()[-8:]:
            click.echo(f"  {line}")
    for error in tally.errors[:10]:
        click.echo(f"  error: {error}")
    if failed or tally.errors:
        code = 1
    return code


# Clients cancel their requests (one DELETE each); workers get their drain time, then fault what
# they hold (each fault report bounded by its own timeout).
STOP_CLIENTS_SECONDS = 15.0
STOP_WORKERS_SECONDS = 30.0


async def _bounded(stopping: Coroutine[Any, Any, None], seconds: float) -> bool:
    """Run one stop step for at most `seconds`; False when it had to be cancelled."""
    try:
        async with asyncio.timeout(seconds):
            await stopping
    except TimeoutError:
        return False
    return True
