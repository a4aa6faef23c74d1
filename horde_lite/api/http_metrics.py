"""HTTP requests and their latency, by route template, method and status code, for /metrics.

A pure ASGI wrapper around the app's whole handler, installed at start-up (`install`, an
`on_startup` hook). It is outside Litestar's router on purpose: middleware given to Litestar runs
inside a matched route, so it never sees a path that matches none (404) or a method a route does
not take (405). After the app has answered, the router has left the matched route's template in
the scope (`path_template`, e.g. `/api/v2/generate/text/status/{id:str}`); with none, the request
is labelled "unmatched", so no raw path ever becomes a label.

Why not Litestar's OpenTelemetry plugin (opentelemetry-instrumentation-asgi): its metrics label
requests with the Host header (`http.server_name`, `http.host`: whatever a client sends) under the
default semantic conventions, and with `http.route` only under the newer ones, which are switched
on process-wide by an environment variable and which the plugin fills with the raw path; it also
starts a span per request. Litestar's Prometheus plugin keeps its metrics in class-level state on
prometheus_client's global registry.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from litestar.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from litestar import Litestar


class HttpMetrics:
    """Times every HTTP request the app answers and records it in the running horde's metrics."""

    def __init__(self, app: ASGIApp, litestar: Litestar) -> None:
        self.app = app
        self._litestar = litestar

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what the server answers when the app raises before it answers

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            # Looked up per request: the horde (and its metrics) is made by the lifespan.
            horde = self._litestar.state.get("horde")
            if horde is not None:
                route = scope.get("path_template")  # set by the router once a route matched
                method = scope.get("method", "")
                horde.metrics.http_request(route, method, status, time.perf_counter() - start)


def install(app: Litestar) -> None:
    """Wrap the app's ASGI handler once (a second start-up of the same app must not count twice)."""
    if not isinstance(app.asgi_handler, HttpMetrics):
        app.asgi_handler = HttpMetrics(app.asgi_handler, app)
