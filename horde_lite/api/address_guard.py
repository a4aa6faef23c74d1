"""The guard of the routes an address timeout shuts (operators/ip_timeouts.py): request creation on
both faces (dry runs included) and the worker calls (pop, submit, progress).

It is the routes' `before_request` hook rather than a Litestar guard: a hook runs at the same point
for a route's own handler (before the body is read and before any dependency), while Litestar
hands each guard call a copy of the route handler, a cost every worker poll would pay for nothing
this check reads. A timed-out caller costs a lookup in the process's copy of the live timeouts,
nothing more. Its refusal is a `HordeError` (`TimeoutIP`, 403), answered in the shape of the face
the route is mounted on. The address is the one the rate limits count by
(`ratelimit.client_address`: the connection's, or the one a trusted proxy names)."""

from __future__ import annotations

from typing import Any

from litestar import Request

from horde_lite.api.ratelimit import client_address
from horde_lite.core.context import Horde
from horde_lite.operators import ip_timeouts


async def address_guard(request: Request[Any, Any, Any]) -> None:
    """A `before_request` hook: returns nothing, so the handler runs (a value would answer instead)."""
    horde: Horde = request.app.state.horde
    await ip_timeouts.check(horde, client_address(request))
