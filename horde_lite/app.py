"""The app factory: `litestar --app horde_lite.app:create_app run` (or `horde-lite run`).

Litestar may call a factory more than once, so it has no side effects: the engine, metrics and
background sweep are created by the core plugin's lifespan when the app starts.
"""

from __future__ import annotations

import logging

import msgspec
from litestar import Litestar
from litestar.config.cors import CORSConfig

from horde_lite.api.allow import AllowEveryMethod
from horde_lite.api.logfilter import logging_config
from horde_lite.api.openapi import ErrorResponsesPlugin, docs_routes, openapi_config
from horde_lite.api.operator import ROUTES as operator_routes
from horde_lite.api.ratelimit import RateLimits, store_kind
from horde_lite.clock import Clock
from horde_lite.core_plugin import HordeLitePlugin
from horde_lite.dashboard.routes import DashboardPlugin
from horde_lite.settings import HttpSettings, Settings, load_settings

# Headers a browser client's JavaScript may read from an answer (CORS hides the others).
EXPOSED_HEADERS = ["Retry-After", "x-should-retry", "RateLimit-Limit", "RateLimit-Remaining",
                   "RateLimit-Reset", "RateLimit-Policy"]  # fmt: skip


def cors_config(http: HttpSettings) -> CORSConfig | None:
    """Browsers may call the API from the listed origins (any with "*"), sending any header (the
    horde's `apikey` and `Client-Agent`, OpenAI's `Authorization`); no list, no CORS."""
    if not http.cors_origins:
        return None
    origins = list(http.cors_origins)
    return CORSConfig(allow_origins=origins, allow_headers=["*"], expose_headers=EXPOSED_HEADERS)


def built_from(settings: Settings) -> bytes:
    """The part of `settings` that `create_app` builds into the app itself (the rate limits'
    middleware and where they count, CORS); the plugin reads the rest at each start-up
    (`HordeLitePlugin.serve`). Two settings with the same value here can share one app."""
    return msgspec.json.encode([settings.ratelimit, store_kind(settings), settings.http])


def create_app(
    settings: Settings | None = None, clock: Clock | None = None, *, run_sweeper: bool = True
) -> Litestar:
    settings = settings or load_settings()
    limits = RateLimits(settings)
    return Litestar(
        plugins=[
            HordeLitePlugin(settings, clock, run_sweeper=run_sweeper),
            ErrorResponsesPlugin(),
            DashboardPlugin(),  # /dashboard (docs/reference/dashboard.md)
        ],
        route_handlers=[*docs_routes(), *operator_routes],
        middleware=[AllowEveryMethod(), *limits.middleware],
        stores=limits.stores,
        on_startup=[limits.start],
        cors_config=cors_config(settings.http),
        logging_config=logging_config(
            root={"level": logging.getLevelName(logging.INFO), "handlers": ["queue_listener"]},
            log_exceptions="debug",
            disable_stack_trace={404, 400, 401, 403, 409, 429, 503},
        ),
        request_max_body_size=4 * 1024 * 1024,
        openapi_config=openapi_config(),
    )
