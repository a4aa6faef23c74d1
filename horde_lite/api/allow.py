"""`OPTIONS` answers with every method of its path in `Allow`.

Litestar 2 makes the automatic OPTIONS handler when a path's first handler is registered and binds
it to that first route; a later handler on the same path (a PATCH beside a GET, registered one by
one by a Router) builds a new route, but the OPTIONS handler kept answers with the first route's
methods (litestar#4169, fixed in Litestar 3). This middleware rewrites `Allow` on every OPTIONS
answer from the app's routes for the matched path, which is what the 405 answer lists too.
"""

from __future__ import annotations

from litestar.enums import ScopeType
from litestar.middleware import ASGIMiddleware
from litestar.routes import HTTPRoute
from litestar.types import ASGIApp, Message, Receive, Scope, Send


def allowed_methods(scope: Scope) -> str:
    """The methods of every HTTP route with the matched path's template, as `Allow` lists them."""
    template = scope.get("path_template")
    methods = {
        method
        for route in scope["app"].routes
        if isinstance(route, HTTPRoute) and route.path_format == template
        for method in route.methods
    }
    return ", ".join(sorted(methods))


class AllowEveryMethod(ASGIMiddleware):
    scopes = (ScopeType.HTTP,)

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        if scope.get("method") != "OPTIONS":
            await next_app(scope, receive, send)
            return
        allow = allowed_methods(scope)

        async def send_allow(message: Message) -> None:
            if message["type"] == "http.response.start" and allow:
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"allow"]
                message = {**message, "headers": [*headers, (b"allow", allow.encode())]}
            await send(message)

        await next_app(scope, receive, send_allow)
