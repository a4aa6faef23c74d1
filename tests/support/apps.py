"""One app per test process for each shape of settings, started on each test's own database.

Building the app (Litestar registers and checks every route) costs more than most tests' own work,
so `app_for` builds one app for each value of `horde_lite.app.built_from` and, for a later test,
points its plugin at the new settings and clock (`HordeLitePlugin.serve`), gives it empty stores
(the in-process rate limits' counts) and configures its logging again, as building it would.
Each test still starts the app (its lifespan: engine, migrations check, policies, metrics) and
stops it, as a server does.

An app that is running when another is asked for with the same shape (a test's second "host") is
not handed out again: that call builds a new app of its own.
"""

from __future__ import annotations

from litestar import Litestar
from litestar.stores.registry import StoreRegistry

from horde_lite.api.ratelimit import store_kind
from horde_lite.app import built_from, create_app
from horde_lite.clock import Clock
from horde_lite.core_plugin import HordeLitePlugin
from horde_lite.settings import Settings

_BUILT: dict[bytes, Litestar] = {}
_RUNNING: set[int] = set()  # id() of the shared apps between their start-up and shutdown


def app_for(settings: Settings, clock: Clock) -> Litestar:
    """An app (without the sweep task) that serves `settings` on `clock` at its next start-up."""
    if store_kind(settings) == "redis":  # its store is the app's own, built with it
        return create_app(settings, clock, run_sweeper=False)
    key = built_from(settings)
    app = _BUILT.get(key)
    if app is None:
        app = _BUILT[key] = create_app(settings, clock, run_sweeper=False)
        app.on_startup.insert(0, lambda: _RUNNING.add(id(app)))
        app.on_shutdown.append(lambda: _RUNNING.discard(id(app)))
        return app
    if id(app) in _RUNNING:
        return create_app(settings, clock, run_sweeper=False)
    app.plugins.get(HordeLitePlugin).serve(settings, clock)
    app.stores = StoreRegistry()
    if app.logging_config is not None:
        # As at construction: the log handlers write to this test's stderr (pytest's capture), not
        # to the stream of the test that built the app.
        app.get_logger = app.logging_config.configure()
    return app
