"""The OpenAPI 3.1 schema Litestar generates from the typed handlers, and its docs page.

Served at `/api/swagger.json` (the AI Horde's path) and `/schema/openapi.json`; Swagger UI at `/api/`
and `/schema`. The page's JavaScript and CSS come from the installed `litestar-offline-docs` wheel
and are served by the app itself, so the docs work on a host with no internet access.

Every operation documents each error status it may answer with its face's error body
(`HordeErrorBody` on the horde API, `OpenAIErrorBody` on /v1), with the `rc` codes of that status
from `Rc`, unless its handler documents that status itself.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from pathlib import Path
from typing import Any

import litestar_offline_docs
from litestar import Request, Response, Router, get
from litestar.enums import MediaType
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.plugins import JsonRenderPlugin, SwaggerRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme
from litestar.plugins import ReceiveRoutePlugin
from litestar.routes import BaseRoute, HTTPRoute

from horde_lite import __version__
from horde_lite.api.body_schemas import describe_bodies
from horde_lite.api.errors import OPENAI_CODES, OPENAI_STATUSES, HordeErrorBody, OpenAIErrorBody
from horde_lite.api.static_files import static_files_router
from horde_lite.rc import Rc

ASSETS_PATH = "/api/docs-assets"
ASSETS_DIR = Path(litestar_offline_docs.__file__).parent / "static"

SWAGGER = SwaggerRenderPlugin(
    js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
    css_url=f"{ASSETS_PATH}/swagger-ui.css",
    standalone_preset_js_url=f"{ASSETS_PATH}/swagger-ui-standalone-preset.js",
    favicon="",  # Litestar's default favicon is fetched from a CDN
    path="/",
)

DESCRIPTION = """A self-hosted broker for crowd-sourced text generation.

* `/api/v2`: the AI Horde's text API. Authenticate with the `apikey` header (the anonymous key is
  `0000000000`). Errors are `{"message", "rc"}`.
* `/v1`: an OpenAI-compatible front on the same queue. Authenticate with `Authorization: Bearer KEY`.
  Errors are `{"error": {"message", "type", "param", "code"}}`.

429 and 503 answers carry `Retry-After`.
"""


def openapi_config() -> OpenAPIConfig:
    return OpenAPIConfig(
        title="horde_lite",
        version=__version__,
        description=DESCRIPTION,
        render_plugins=[SWAGGER, JsonRenderPlugin()],
        # Litestar's /schema routes, behind a hook that describes the bodies on first use.
        openapi_router=Router(
            "/schema", route_handlers=[], include_in_schema=False, before_request=_described
        ),
        components=Components(
            security_schemes={
                "apikey": SecurityScheme(type="apiKey", name="apikey", security_scheme_in="header"),
                "bearer": SecurityScheme(type="http", scheme="bearer"),
            }
        ),
    )


async def _described(request: Request[Any, Any, Any]) -> None:
    """Describe the bodies (building the whole schema) when a schema path is first asked for, not
    at each start-up: most processes, and every test's app, never serve it."""
    describe_bodies(request.app)


def _schema(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The schema Litestar's own /schema routes serve, rendered from the same object (the app's
    public `openapi_schema`) once per app."""
    state = request.app.state
    if "openapi_document" not in state:
        describe_bodies(request.app)
        state.openapi_document = request.app.openapi_schema.to_schema()
    return state.openapi_document


@get("/api/swagger.json", include_in_schema=False, sync_to_thread=False)
def swagger_json(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    return Response(_schema(request), media_type=MediaType.JSON)


@get("/api", include_in_schema=False, sync_to_thread=False, media_type=MediaType.HTML)
def docs_page(request: Request[Any, Any, Any]) -> bytes:
    return SWAGGER.render(request, _schema(request))


def docs_routes() -> list[Any]:
    assets = static_files_router(ASSETS_PATH, ASSETS_DIR, "docs_assets")
    return [swagger_json, docs_page, assets]


# Codes no operation answers with a status of its own: 405 is the router's; HTTPError takes the
# status of the Litestar error it reports; Locked is raised only by `horde-lite users delete`.
UNDOCUMENTED = frozenset({Rc.MethodNotAllowed, Rc.HTTPError, Rc.Locked})


@functools.cache  # read for every route of every app; Rc is fixed
def _statuses(v1: bool) -> dict[int, list[Rc]]:
    by_status: dict[int, list[Rc]] = defaultdict(list)
    for rc in Rc:
        status = OPENAI_STATUSES.get(rc, rc.status) if v1 else rc.status
        if status >= 400 and rc not in UNDOCUMENTED:
            by_status[status].append(rc)
    return dict(sorted(by_status.items()))


def error_responses(v1: bool) -> dict[int, ResponseSpec]:
    """Each error status with the face's body and the codes it may carry."""
    out: dict[int, ResponseSpec] = {}
    for status, rcs in _statuses(v1).items():
        if v1:
            codes = sorted({OPENAI_CODES[rc][1] for rc in rcs if rc in OPENAI_CODES} or {"see message"})
            text = "Error; `code` is one of: " + ", ".join(f"`{c}`" for c in codes)
        else:
            text = "Error; `rc` is one of: " + ", ".join(f"`{rc}`" for rc in rcs)
        body = OpenAIErrorBody if v1 else HordeErrorBody
        out[status] = ResponseSpec(data_container=body, description=text, generate_examples=False)
    return out


class ErrorResponsesPlugin(ReceiveRoutePlugin):
    """Adds the face's error responses to every operation in the schema as its route is registered."""

    def receive_route(self, route: BaseRoute) -> None:
        if not isinstance(route, HTTPRoute):
            return
        defaults = error_responses(v1=route.path.startswith("/v1"))
        for handler, _ in route.route_handler_map.values():
            if handler.resolve_include_in_schema():
                handler.responses = {**defaults, **(handler.responses or {})}
