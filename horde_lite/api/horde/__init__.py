"""The horde API under /api/v2, wire-compatible with the AI Horde's text routes."""

from __future__ import annotations

from litestar import Router

from horde_lite.api.horde import generate, progress, status, users, workers

router = Router(
    path="/api/v2",
    route_handlers=[
        *generate.HANDLERS,
        *progress.HANDLERS,
        *status.HANDLERS,
        *workers.HANDLERS,
        *users.HANDLERS,
    ],
)
