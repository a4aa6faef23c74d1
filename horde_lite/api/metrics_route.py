"""GET /metrics: the OpenTelemetry instruments in Prometheus text format, with the operational
gauges (waiting requests, queued tokens, online workers) read from the database at each scrape."""

from __future__ import annotations

from litestar import Response, get

from horde_lite.api.deps import HordeDep
from horde_lite.operators import ops_metrics


@get("/metrics", include_in_schema=False)
async def metrics(horde: HordeDep) -> Response[bytes]:
    snapshot = await ops_metrics.read(horde)
    body, content_type = horde.metrics.render(snapshot)
    return Response(body, media_type=content_type)
