"""`horde-lite demo`: a whole horde in one command (docs/reference/worker.md, "The demo").

The server runs as a child process on a throwaway SQLite file (or the configured database); a
fleet (simulated, or bridging a model server) and a client load run in this process; the start-up
says each step, then the board refreshes every second and explains each notable decision. Ctrl-C
(or `--seconds`) stops the clients, then the workers (jobs in hand finish or are faulted), then
the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import httpx

from horde_lite.demo.board import render, snapshot
from horde_lite.demo.decisions import Explainer, fit, wrapped
from horde_lite.demo.fleet import FLEET, MODEL, Fleet, bridging, model_fleet, simulated
from horde_lite.demo.load import Load
from horde_lite.demo.server import Server, make_users, migrate_database
from horde_lite.worker.backends.base import BackendDown, BackendError
from horde_lite.worker.backends.openai import OpenAIBackend


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
@click.option(
    "--model-server",
    metavar="URL",
    help="An OpenAI-compatible model server (e.g. http://127.0.0.1:8000/v1): the fleet bridges it "
    "instead of simulating (two workers, chat and legacy, on its first model).",
)
@click.option(
    "--model-context",
    type=click.IntRange(256),
    help="The model server's context in tokens, needed when it does not say (llama-cpp-python's server).",
)
def demo(
    seconds: float | None,
    configured_database: bool,
    refresh: float,
    model_server: str | None,
    model_context: int | None,
) -> None:
    with tempfile.TemporaryDirectory(prefix="horde-lite-demo-") as tmp:
        work = Path(tmp)
        if configured_database:
            from horde_lite.settings import load_settings, masked

            url, suffix = load_settings().database.url, "-" + secrets.token_hex(2)
            click.echo(fit(f"database: {masked(url)}"), err=True)
        else:
            url, suffix = f"sqlite+aiosqlite:///{work / 'demo.db'}", ""
        logging.basicConfig(
            filename=work / "workers.log",
            level=logging.INFO,
            force=True,
            format="%(asctime)s %(levelname)s %(message)s",
        )
        logging.getLogger("httpx").setLevel(logging.WARNING)
        options = Options(seconds, refresh, model_server, model_context)
        code = asyncio.run(_demo(work, url, suffix, options))
    sys.exit(code)


@dataclass(frozen=True)
class Options:
    seconds: float | None
    refresh: float
    model_server: str | None
    model_context: int | None


class Steps:
    """The start-up, one line per step, with the time since the demo started."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self, what: str) -> None:
        click.echo(fit(f"[{time.monotonic() - self.started:5.1f} s] {what}"))


async def _model(options: Options, say: Steps) -> tuple[str, int] | None:
    """The model server's first model and its context (None: it cannot be used, said why)."""
    assert options.model_server is not None
    backend = OpenAIBackend(options.model_server)
    try:
        found = await backend.discover([])
    except BackendDown as e:
        say(f"the model server at {options.model_server} does not answer: {e}")
        return None
    except BackendError as e:  # not a URL it can read (no http://), or not an OpenAI-style answer
        say(f"the model server at {options.model_server} cannot be read: {e}")
        return None
    finally:
        await backend.aclose()
    if not found.models:
        say(f"the model server at {options.model_server} lists no model (GET /v1/models)")
        return None
    context = options.model_context or found.context
    if context is None:  # the worker's rule: never declare a context nobody stated
        say("the model server says no context: give it with --model-context N")
        return None
    say(f"model server: {found.models[0]}, context {context:,} tokens")
    return found.models[0], context


async def _demo(work: Path, url: str, suffix: str, options: Options) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tty = sys.stdout.isatty()
    say = Steps()
    say(f"horde-lite demo: files in {work}")
    model, specs, backend = MODEL, FLEET, simulated
    if options.model_server:
        found = await _model(options, say)
        if found is None:
            return 2
        model, context = found
        specs, backend = model_fleet(context), bridging(options.model_server)
    say(f"database: {url.split('://')[0]}, migrating")
    await migrate_database(url)
    volunteer, alice, operator = f"volunteer{suffix}", f"alice{suffix}", f"operator{suffix}"
    users = {volunteer: 0.0, alice: 50_000.0, operator: 0.0}
    keys = await make_users(url, users, moderators=(operator,), migrated=True)
    say("database: migrated")
    say(f"users: {volunteer} (runs the workers)")
    say(f"users: {alice} (a client with 50,000 kudos)")
    say(f"users: {operator} (a moderator: reads the decisions)")
    say("server: starting horde-lite run")
    server = await Server.start(
        url, work / "server.log", waiting=lambda s: say(f"server: starting ({s:.0f} s)")
    )
    say(f"server: up at {server.url}")
    fleet = Fleet.start(server.url, keys[volunteer], suffix, model=model, specs=specs, backend=backend)
    load = Load(server.url, keys[alice], model=model, real_model=bool(options.model_server))
    explainer = Explainer(after=0.0 if suffix == "" else time.time())  # a shared database: ours only
    loading: asyncio.Task[None] | None = None
    started = time.monotonic()
    refreshes = 0
    frame = ""
    code = 0
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=10.0) as http:
            await _registered(http, [s.name + suffix for s in specs], stop, say)
            say("clients: starting (legacy and chat requests, some too big)")
            loading = asyncio.create_task(load.run())
            while not stop.is_set():
                elapsed = time.monotonic() - started
                if options.seconds is not None and elapsed >= options.seconds:
                    break
                limit = f"/{options.seconds:g}" if options.seconds else ""
                headline = f"horde-lite demo {elapsed:.0f}{limit} s  {server.url}  Ctrl-C stops"
                served = {w.config.name: w.served for w in fleet.workers}
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                    snap = await snapshot(http)
                    new = await explainer.read(http, keys[operator], snap["workers"])
                    answers = [("streaming", *load.streaming), ("last answer", *load.answer)]
                    frame = render(snap, load.tally, headline, served, explainer, answers)
                    if tty:
                        click.echo("\x1b[H\x1b[2J" + frame)
                    else:  # a log: the new decisions as they come, the board every ten refreshes
                        for line in new:
                            click.echo(fit(f"  {line}"))
                        if refreshes % BOARD_EVERY == 0:
                            click.echo("\n" + frame + "\n")
                    refreshes += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), options.refresh)
            if frame and not tty:  # the board as it ended
                click.echo("\n" + frame)
    finally:
        click.echo("\nstopping: clients, then workers (jobs in hand end), then the server")
        if loading is not None:
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
            click.echo(fit(f"the {name} did not stop in time and were abandoned (log: {server.log})"))
            code = 1
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    tally = load.tally
    failed = fleet.failed()
    click.echo(
        f"demo finished: served {tally.total('served')}, refused {tally.total('refused')}, "
        f"failed {tally.total('failed')}; workers stopped by an error: {len(failed)}"
    )
    counted = ", ".join(f"{kind} {n}" for kind, n in sorted(explainer.counts.items()))
    for part in wrapped(f"decisions explained: {counted or 'none'}"):
        click.echo(part)
    log = work / "workers.log"
    if log.exists():
        click.echo("the workers' log ends with:")
        for line in log.read_text().splitlines()[-8:]:
            for part in wrapped("  " + _UUID.sub(lambda m: m.group(1), line[11:])):  # no date, short ids
                click.echo(part)
    for error in tally.errors[:10]:
        for part in wrapped(f"  error: {error}"):
            click.echo(part)
    if failed or tally.errors:
        code = 1
    return code


async def _registered(http: httpx.AsyncClient, names: list[str], stop: asyncio.Event, say: Steps) -> None:
    """Wait until the fleet's workers have popped once (the server lists them), saying who came."""
    seen: set[str] = set()
    deadline = time.monotonic() + REGISTER_SECONDS
    while not stop.is_set() and len(seen) < len(names) and time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            listed = {w["name"] for w in (await http.get("/api/v2/workers")).json()}
            for name in sorted((listed & set(names)) - seen):
                seen.add(name)
                say(f"workers: {name} registered ({len(seen)} of {len(names)})")
        await asyncio.sleep(0.2)
    if len(seen) < len(names):
        say(f"workers: {len(seen)} of {len(names)} registered; going on (workers' log: workers.log)")


# Clients cancel their requests (one DELETE each); workers get their drain time, then fault what
# they hold (each fault report bounded by its own timeout).
STOP_CLIENTS_SECONDS = 15.0
STOP_WORKERS_SECONDS = 30.0
REGISTER_SECONDS = 60.0  # a model server may be slow to answer the workers' first look
_UUID = re.compile(r"\b([0-9a-f]{8})-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
BOARD_EVERY = 10  # without a terminal, the board every this many refreshes (decisions as they come)


async def _bounded(stopping: Coroutine[Any, Any, None], seconds: float) -> bool:
    """Run one stop step for at most `seconds`; False when it had to be cancelled."""
    try:
        async with asyncio.timeout(seconds):
            await stopping
    except TimeoutError:
        return False
    return True
