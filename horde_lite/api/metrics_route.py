"""GET /metrics: the OpenTelemetry instruments in Prometheus text format."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get

from horde_lite.api.common import horde_of


@get("/metrics", include_in_schema=False)
async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    body, content_type = horde_of(request).metrics.render()
    return Response(body, media_type=content_type)
