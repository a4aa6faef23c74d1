"""The horde API under /api/v2, wire-compatible with the AI Horde's text routes."""

from __future__ import annotations

from litestar import Router

from horde_lite.api.errors import HORDE_HANDLERS
from horde_lite.api.horde import (
    filters,
    generate,
    kudos,
    operations,
    progress,
    register,
    stats,
    status,
    teams,
    users,
    worker_messages,
    workers,
)
from horde_lite.api.strict_body import StrictBody

router = Router(
    path="/api/v2",
    # Bodies (`data`) decode strictly into their structs; answers are encoded as returned.
    dto=StrictBody,
    return_dto=None,
    exception_handlers=HORDE_HANDLERS,  # errors as `{"message", "rc"}`
    route_handlers=[
        *generate.HANDLERS,
        *progress.HANDLERS,
        *status.HANDLERS,
        *worker_messages.HANDLERS,
        *workers.HANDLERS,
        *users.HANDLERS,
        *stats.HANDLERS,
        *kudos.HANDLERS,
        *teams.HANDLERS,
        *register.HANDLERS,
        *operations.HANDLERS,
        *filters.HANDLERS,
    ],
)
