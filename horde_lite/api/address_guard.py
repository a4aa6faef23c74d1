"""The guard of the routes an address timeout shuts (operators/ip_timeouts.py): request creation on
both faces (dry runs included) and the worker calls (pop, submit, progress).

A guard runs before the body is read and before any handler or dependency: a timed-out caller
costs a lookup in the process's copy of the live timeouts, nothing more. Its refusal is a
`HordeError` (`TimeoutIP`, 403), answered in the shape of the face the route is mounted on. The
address is the one the rate limits count by (`ratelimit.client_address`: the connection's, or the
one a trusted proxy names)."""

from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from horde_lite.api.ratelimit import client_address
from horde_lite.core.context import Horde
from horde_lite.operators import ip_timeouts


async def address_guard(connection: ASGIConnection[Any, Any, Any, Any], route: BaseRouteHandler) -> None:
    horde: Horde = connection.app.state.horde
    await ip_timeouts.check(horde, client_address(connection))
