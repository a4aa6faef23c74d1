"""GET /metrics: the OpenTelemetry instruments in Prometheus text format."""

from __future__ import annotations

from litestar import Response, get

from horde_lite.api.deps import HordeDep


@get("/metrics", include_in_schema=False)
async def metrics(horde: HordeDep) -> Response[bytes]:
    body, content_type = horde.metrics.render()
    return Response(body, media_type=content_type)
