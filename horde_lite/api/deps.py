"""The request's context, as Litestar dependencies every handler of both faces can ask for by
name: `horde` (the running horde) and `caller` (the key, client agent and address it came with)."""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide

from horde_lite.core.context import Caller, Horde


def provide_horde(state: State) -> Horde:
    return state.horde


def apikey_of(request: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    """The `apikey` header (the horde API's), else an `Authorization: Bearer` token (OpenAI's)."""
    key = request.headers.get("apikey")
    if key:
        return key.strip()
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return None


def provide_caller(request: Request[Any, Any, Any], horde: NamedDependency[Horde]) -> Caller:
    # `horde` is not read: asking for it makes Litestar resolve the two dependencies one after the
    # other. Two independent ones are resolved concurrently, in an anyio task group per request,
    # which cost about 7 % of the server's CPU in a create-pop-submit cycle (bench/perf.py).
    del horde
    agent = request.headers.get("client-agent") or request.headers.get("client_agent") or ""
    address = request.client.host if request.client else ""
    return Caller(apikey=apikey_of(request), client_agent=agent, address=address)


# What a handler's `horde` and `caller` parameters are annotated with: name-based injection, marked
# explicitly (Litestar deprecates inferring it from the parameter's name alone).
HordeDep = NamedDependency[Horde]
CallerDep = NamedDependency[Caller]

DEPENDENCIES: dict[str, Provide] = {
    "horde": Provide(provide_horde, sync_to_thread=False),
    "caller": Provide(provide_caller, sync_to_thread=False),
}
