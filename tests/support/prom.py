"""Read Prometheus text exposition (what `Metrics.render()` and `/metrics` return) in tests.

Tests assert on the exported names, not on SDK internals, so a renaming in the exporter shows up
as a failing test. How opentelemetry-exporter-prometheus 0.66b2 (with prometheus-client 0.26.0)
renames things, which is what you pass to `value()`:

Metric names: every character outside ``[a-zA-Z0-9:]`` becomes ``_`` (so dots become underscores);
a counter's samples gain ``_total``; the unit is mapped (``s`` -> ``seconds``) and appended as a
suffix only when the name does not already end in it; annotation units such as ``{pop}`` add
nothing; a histogram exposes ``_bucket`` (label ``le``, upper edges as floats: ``"60.0"``,
``"+Inf"``), ``_count`` and ``_sum``. No ``_created`` samples are emitted.

Instrument (OpenTelemetry name, kind, unit) -> Prometheus sample names:

- horde.text.gate_shadow.assignments (counter) -> ``horde_text_gate_shadow_assignments_total``
- horde.text.gate_shadow.outcomes (counter) -> ``horde_text_gate_shadow_outcomes_total``
- horde.pop.lease_capacity_limited (counter) -> ``horde_pop_lease_capacity_limited_total``
- horde.text.free_allowance.decisions (counter) -> ``horde_text_free_allowance_decisions_total``
- horde.text.gate_shadow.service_seconds (histogram, s) ->
  ``horde_text_gate_shadow_service_seconds_bucket`` / ``_count`` / ``_sum``
- horde.text.free_allowance.estimated_wait_seconds (histogram, s) ->
  ``horde_text_free_allowance_estimated_wait_seconds_bucket`` / ``_count`` / ``_sum``
- horde.text.queue_wait_seconds (histogram, s) ->
  ``horde_text_queue_wait_seconds_bucket`` / ``_count`` / ``_sum``
- horde.text.jobs (counter) -> ``horde_text_jobs_total``
- horde.webhook.outcomes (counter) -> ``horde_webhook_outcomes_total``
- http.server.request.duration (histogram, s) ->
  ``http_server_request_duration_seconds_bucket`` / ``_count`` / ``_sum``

The scrape-time gauges are not OpenTelemetry instruments (horde_lite/metrics.py `ops_families`):
``horde_text_waiting_requests``, ``horde_text_queued_tokens`` and ``horde_workers_online`` are
written as they are named, with the labels ``horde_model``, ``horde_chat`` / ``horde_worker_kind``
and no ``otel_scope_*`` labels.

Label names: every character outside ``[a-zA-Z0-9]`` becomes ``_``: ``horde.worker_trusted`` ->
``horde_worker_trusted``, ``horde.size_bucket`` -> ``horde_size_bucket``, ``horde.chat`` ->
``horde_chat``, ``outcome`` -> ``outcome``, ``horde.requester`` -> ``horde_requester``,
``horde.outcome`` -> ``horde_outcome``, ``horde.requested_bucket`` -> ``horde_requested_bucket``,
``horde.allowance_bucket`` -> ``horde_allowance_bucket``, ``horde.event`` -> ``horde_event``,
``http.route`` -> ``http_route``, ``http.request.method`` -> ``http_request_method``,
``http.response.status_code`` -> ``http_response_status_code``.

Label values: strings as they are (``"<=512"``); anything else is JSON-encoded, so booleans are
``"true"``/``"false"``. `value()` accepts Python booleans and ints and encodes them the same way.
Every sample also carries ``otel_scope_name="horde_lite"``, ``otel_scope_version=""`` and
``otel_scope_schema_url=""``; a ``target_info`` gauge carries the resource (``service_name``).

An instrument that has recorded nothing is absent from the exposition, so `value()` returns 0.0;
the operational families (`OPERATIONAL_FAMILIES`) are always written, with HELP and TYPE lines
at least.
"""

from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, dict[str, str], float]

# Every operational family, as the parser names it (a counter without `_total`) -> its type.
OPERATIONAL_FAMILIES: dict[str, str] = {
    "horde_text_jobs": "counter",
    "http_server_request_duration_seconds": "histogram",
    "horde_text_waiting_requests": "gauge",
    "horde_text_queued_tokens": "gauge",
    "horde_workers_online": "gauge",
    "horde_webhook_outcomes": "counter",
    "horde_pop_waiting": "gauge",
    "horde_pop_wakeups": "counter",
    "horde_pop_woken": "counter",
}


def samples(text: str) -> list[Sample]:
    """Every sample in an exposition as (sample name, labels, value)."""
    return [
        (sample.name, dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def _label_value(value: str | bool | int | float) -> str:
    # The exporter JSON-encodes non-string attribute values (True -> "true"); mirror it.
    return value if isinstance(value, str) else json.dumps(value)


def value(text: str, name: str, **labels: str | bool | int | float) -> float:
    """Sum of the samples called `name` whose labels include `labels`; 0.0 when none match.

    Summing lets a test ask for a total across the labels it does not name (e.g. all outcomes).
    """
    wanted = {key: _label_value(val) for key, val in labels.items()}
    return sum(
        (
            sample_value
            for sample_name, sample_labels, sample_value in samples(text)
            if sample_name == name and all(sample_labels.get(k) == v for k, v in wanted.items())
        ),
        0.0,
    )
