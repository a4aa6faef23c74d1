"""The one plugin that wires horde_lite into Litestar: routes, error mapping, the horde state
(engine, policies, metrics) built at start-up, migrations when the database is behind, the lease
sweep, and the `horde-lite` CLI commands."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from litestar.config.app import AppConfig
from litestar.plugins import CLIPluginProtocol, InitPluginProtocol

from horde_lite import __version__
from horde_lite.api import http_metrics
from horde_lite.api.body_rules import BodyRules
from horde_lite.api.db_errors import database_unavailable
from horde_lite.api.deps import DEPENDENCIES
from horde_lite.api.errors import UNROUTED_HANDLERS
from horde_lite.api.horde import router as horde_router
from horde_lite.api.metrics_route import metrics
from horde_lite.clock import Clock
from horde_lite.core.context import Horde
from horde_lite.core.notify import start_listener
from horde_lite.db import migrate, statistics
from horde_lite.db.engine import make_engine, make_sessionmaker
from horde_lite.heap import freeze_startup_objects
from horde_lite.jobs import lease
from horde_lite.metrics import Metrics
from horde_lite.operators import policy_state
from horde_lite.policies.registry import load_policies
from horde_lite.settings import Settings, masked
from horde_lite.startup import VERBOSE_ENV, verbose

if TYPE_CHECKING:
    from click import Group
    from litestar import Litestar

log = logging.getLogger("horde_lite")

# How long a stopping process waits for its detached tasks (a cancel is a few milliseconds; one
# queued behind SQLite's busy timeout could take longer, and is left to expire instead).
DRAIN_SECONDS = 10.0


class HordeLitePlugin(InitPluginProtocol, CLIPluginProtocol):
    def __init__(self, settings: Settings, clock: Clock | None = None, *, run_sweeper: bool = True) -> None:
        self.run_sweeper = run_sweeper
        self.serve(settings, clock)

    def serve(self, settings: Settings, clock: Clock | None = None) -> None:
        """What the app's next start-up serves: `settings`' database, policies and options, on
        `clock`. The app itself keeps what `create_app` built from the settings it was given (the
        rate limits' middleware, CORS), so a process that starts one app on several databases in
        turn (the test suite) changes only settings that agree on those."""
        self.settings = settings
        self.clock = clock or Clock()
        # Fail here (in the factory) on a policy name or option that cannot load, not at start-up.
        self.policies = load_policies(settings.policies)

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        from horde_lite.api.openai import ROUTES as openai_routes

        app_config.route_handlers.extend([horde_router, metrics, *openai_routes])
        # Each face's router maps its own errors; these answer what no router's route matched.
        app_config.exception_handlers.update(UNROUTED_HANDLERS)
        app_config.middleware.append(BodyRules())  # raw-input hygiene before any decoding
        app_config.on_startup.append(http_metrics.install)  # outside the router: sees 404s too
        app_config.dependencies.update(DEPENDENCIES)
        app_config.lifespan.append(self._lifespan)
        return app_config

    @asynccontextmanager
    async def _lifespan(self, app: Litestar) -> AsyncIterator[None]:
        database = self.settings.database
        url, pgbouncer = database.url, database.pgbouncer
        await self._migrate(url, pgbouncer)
        engine = make_engine(url, echo=database.echo, null_pool=database.null_pool, pgbouncer=pgbouncer)
        await self._guarded("planner statistics at start-up", statistics.at_start(engine))
        horde = Horde(
            settings=self.settings,
            policies=self.policies,
            metrics=Metrics(),
            clock=self.clock,
            engine=engine,
            sessionmaker=make_sessionmaker(engine),
        )
        app.state.horde = horde
        # The policy in force is the database's; switches reach this process.
        policy_watch = await policy_state.start(horde)
        # Each server process (one per --wc worker) says what it runs; the policies are the database's.
        in_force = " ".join(f"{kind}={name}" for kind, name in horde.policies.names.items())
        log.info("horde-lite %s process %d: database %s; policies in force: %s",
                 __version__, os.getpid(), masked(url), in_force)  # fmt: skip
        sweeper = asyncio.create_task(self._sweep_forever(horde)) if self.run_sweeper else None
        listener = start_listener(horde.notifier, database.listener_url)  # wake-ups from other processes
        if pgbouncer and database.listener_url is None:
            log.warning("[database] pgbouncer without listen_url: no LISTEN connection, so waiters see "
                        "other processes' changes within [chat] poll_seconds (%g s), and waiting and "
                        "idle pops their jobs within [pops] wait_poll_seconds (%g s)",
                        self.settings.chat.poll_seconds, self.settings.pops.wait_poll_seconds)  # fmt: skip
        freeze_startup_objects()  # no long full collections under load (horde_lite/heap.py)
        try:
            yield
        finally:
            # Abandons of clients that left as the server stopped finish before the database
            # closes, or their requests would wait (and hold kudos) until they expire.
            if left := await horde.drain(within=DRAIN_SECONDS):
                log.warning("stopping with %d detached database task(s) still running", left)
            await policy_watch.stop()
            await horde.pop_waiters.stop()
            if listener is not None:
                await listener.stop()
            if sweeper is not None:
                sweeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sweeper
            # Webhooks under way get one attempt's time; those still waiting are dropped (counted).
            await horde.webhooks.close(within=self.settings.webhooks.timeout_seconds)
            await horde.mirror.close()
            horde.metrics.shutdown()
            await engine.dispose()

    @staticmethod
    async def _migrate(url: str, pgbouncer: bool) -> None:
        """Bring a database that is behind up to date, said in one line (each migration on its own
        line too with `horde-lite run --verbose`, i.e. HORDE_LITE_VERBOSE=1)."""
        with migrate.alembic_lines(verbose()):
            applied = await migrate.current(url, pgbouncer=pgbouncer)
            if applied in migrate.heads():
                return
            steps = migrate.pending(applied)
            await asyncio.to_thread(migrate.upgrade, url, pgbouncer=pgbouncer)
        listed = "" if verbose() else f" (`horde-lite run --verbose` or {VERBOSE_ENV}=1 lists them)"
        log.info("database %s: %d migration(s) applied, %s -> %s%s",
                 "created" if applied is None else "migrated", len(steps), applied or "empty",
                 steps[-1] if steps else applied, listed)  # fmt: skip

    async def _sweep_forever(self, horde: Horde) -> None:
        """The lease sweep, and beside it the planner's statistics every `statistics.REFRESH_SECONDS`."""
        interval = self.settings.lease.sweep_seconds
        if interval <= 0:
            return
        refreshed = asyncio.get_running_loop().time()
        while True:
            await asyncio.sleep(interval)
            await self._guarded("lease sweep", lease.sweep(horde))
            if asyncio.get_running_loop().time() - refreshed >= statistics.REFRESH_SECONDS:
                refreshed = asyncio.get_running_loop().time()
                await self._guarded("statistics refresh", statistics.refresh(horde))

    @staticmethod
    async def _guarded(what: str, work: Coroutine[Any, Any, None]) -> None:
        """Work that must not stop the process: a failure is logged; the sweep and the refresh
        try again at their next pass (the refresh also covers a failed start-up analysis)."""
        try:
            await work
        except Exception as exc:  # keep going
            if database_unavailable(exc):
                log.warning("%s skipped: the database is unavailable (%s)", what, exc)
            else:
                log.exception("%s failed", what)

    def on_cli_init(self, cli: Group) -> None:
        from horde_lite.cli import register_commands

        register_commands(cli)
