"""The app factory: `litestar --app horde_lite.app:create_app run` (or `horde-lite run`).

Litestar may call a factory more than once, so it has no side effects: the engine, metrics and
background sweep are created by the core plugin's lifespan when the app starts.
"""

from __future__ import annotations

import logging

from litestar import Litestar
from litestar.logging import LoggingConfig

from horde_lite.clock import Clock
from horde_lite.core_plugin import HordeLitePlugin
from horde_lite.settings import Settings, load_settings


def create_app(
    settings: Settings | None = None, clock: Clock | None = None, *, run_sweeper: bool = True
) -> Litestar:
    settings = settings or load_settings()
    return Litestar(
        plugins=[HordeLitePlugin(settings, clock, run_sweeper=run_sweeper)],
        logging_config=LoggingConfig(
            root={"level": logging.getLevelName(logging.INFO), "handlers": ["queue_listener"]},
            log_exceptions="debug",
            disable_stack_trace={404, 400, 401, 403, 409, 429, 503},
        ),
        request_max_body_size=4 * 1024 * 1024,
        openapi_config=None,
    )
