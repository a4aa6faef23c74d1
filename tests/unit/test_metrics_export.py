"""GET /metrics over HTTP (docs/reference/metrics.md): after traffic that records every
instrument, the exposition holds each metric under its Prometheus name and type, and every label
is one of the known, bounded keys with a value from a fixed set (a route label is one of the app's
route templates). No request, generation or worker id, worker name, user name or key appears
anywhere in it (ids belong in logs), not even one sent in a path."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from horde_lite.metrics import (
    ANY_MODEL,
    HTTP_SECONDS_BUCKETS,
    JOB_EVENTS,
    OTHER_MODELS,
    SECONDS_BUCKETS,
    SIZE_BUCKETS,
    UNMATCHED_ROUTE,
    WAKE_SOURCES,
    WEBHOOK_OUTCOMES,
    WOKEN_OUTCOMES,
    WORKER_KINDS,
)
from tests.support.horde import ANON, HordeClient
from tests.support.prom import samples, value

MODEL = "m-12B"
BOOL = {"true", "false"}
SIZES = set(SIZE_BUCKETS)
REQUESTERS = {"anonymous", "registered", "shared_key"}
SCOPE = {"otel_scope_name": {"horde_lite"}, "otel_scope_version": {""}, "otel_scope_schema_url": {""}}
SHADOW = {"horde_worker_trusted": BOOL, "horde_size_bucket": SIZES, "horde_chat": BOOL}
WAIT = {"horde_requester": REQUESTERS, "horde_chat": BOOL}
LE = {"le": {str(float(b)) for b in (*SECONDS_BUCKETS, *HTTP_SECONDS_BUCKETS)} | {"+Inf"}}
MODELS = {MODEL, ANY_MODEL, OTHER_MODELS}
METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE", "_OTHER"}
STATUSES = {str(code) for code in range(100, 600)} | {"_OTHER"}
HTTP = "http_server_request_duration_seconds"

# Prometheus family name -> (type, allowed labels and their values). Every family horde_lite
# exports; anything else in the exposition is the exporter's own `target_info`.
FAMILIES: dict[str, tuple[str, dict[str, set[str]]]] = {
    "horde_text_gate_shadow_assignments": ("counter", SHADOW),
    "horde_text_gate_shadow_outcomes": (
        "counter",
        {**SHADOW, "outcome": {"completed", "faulted", "aborted"}},
    ),
    "horde_text_gate_shadow_service_seconds": ("histogram", SHADOW),
    "horde_pop_lease_capacity_limited": ("counter", SHADOW),
    "horde_text_free_allowance_decisions": (
        "counter",
        {
            "horde_requester": REQUESTERS,
            "horde_outcome": {"free", "funded", "refused", "downgraded"},
            "horde_requested_bucket": SIZES,
            "horde_allowance_bucket": SIZES,
            "horde_chat": BOOL,
        },
    ),
    "horde_text_free_allowance_estimated_wait_seconds": ("histogram", WAIT),
    "horde_text_queue_wait_seconds": ("histogram", WAIT),
    "horde_text_jobs": ("counter", {"horde_event": set(JOB_EVENTS), "horde_chat": BOOL}),
    # The route's values (the app's templates) are filled in by the test, from the app itself.
    HTTP: (
        "histogram",
        {"http_route": set(), "http_request_method": METHODS, "http_response_status_code": STATUSES},
    ),
    "horde_text_waiting_requests": ("gauge", {"horde_model": MODELS, "horde_chat": BOOL}),
    "horde_text_queued_tokens": ("gauge", {"horde_model": MODELS, "horde_chat": BOOL}),
    "horde_workers_online": ("gauge", {"horde_model": MODELS, "horde_worker_kind": set(WORKER_KINDS)}),
    "horde_webhook_outcomes": ("counter", {"outcome": set(WEBHOOK_OUTCOMES)}),
    "horde_pop_waiting": ("gauge", {}),
    "horde_pop_wakeups": ("counter", {"source": set(WAKE_SOURCES)}),
    "horde_pop_woken": ("counter", {"outcome": set(WOKEN_OUTCOMES)}),
    "horde_pop_remembered": ("counter", {}),
}
# The scrape-time gauges are not OpenTelemetry instruments: no otel_scope_* labels.
UNSCOPED = {"horde_text_waiting_requests", "horde_text_queued_tokens", "horde_workers_online"}


async def _traffic(client: HordeClient) -> set[str]:
    """Requests, pops, submits, a fault and a lapse that record every instrument; returns every
    id, name and key used, none of which may reach a label."""
    secrets: set[str] = set()
    owner = await client.user("owner-alice", kudos=10_000, trusted=True)
    requester = await client.user("requester-bob", kudos=10_000)
    shared = await client.http.post("/api/v2/sharedkeys", json={"kudos": -1}, headers={"apikey": requester})
    assert shared.status_code == 200, shared.text
    shared_key = shared.json()["id"]
    secrets |= {owner, requester, shared_key, "owner-alice", "requester-bob"}

    chat = {"max_completion_tokens": 1024, "max_context_tokens": 4096, "features": ["tools"]}
    worker = {"models": [MODEL], "max_length": 8192, "max_context_length": 16384, "chat": chat}
    assert (await client.pop(owner, "worker-carol", **worker)).status_code == 200
    await client.set_worker_speed("worker-carol", 4.0)  # capacity 480, below its declared 1024
    secrets.add("worker-carol")

    async def create(key: str, **body: Any) -> str | None:
        response = await client.create(key, models=[MODEL], **body)
        return response.json().get("id") if response.status_code == 202 else None

    ids = [
        await create(ANON, params={"max_length": 512}),  # free, anonymous
        await create(shared_key, params={"max_length": 600}),  # free, shared key
        await create(requester, params={"max_length": 5000, "max_context_length": 8192}),  # funded
        await create(requester, chat={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 700}),
    ]
    refused = await client.create(
        ANON, models=[MODEL], params={"max_length": 5000, "max_context_length": 8192}
    )
    assert refused.status_code in (403, 503), refused.text
    secrets |= {i for i in ids if i}

    jobs = []
    for _ in range(4):
        client.clock.advance(7)
        job = (await client.pop(owner, "worker-carol", **worker)).json()
        assert job["id"] is not None
        jobs.append(job["id"])
    secrets |= set(jobs)
    client.clock.advance(40)
    assert (await client.submit(owner, jobs[0], "x" * 400)).status_code == 200
    assert (await client.submit(owner, jobs[1], "", state="faulted")).status_code == 200
    client.clock.advance(151)
    await client.sweep()  # jobs 2 and 3 lapse
    workers = (await client.http.get("/api/v2/workers")).json()
    secrets |= {w["id"] for w in workers}
    # Ids and keys in paths: a route's template and "unmatched" are recorded, never the path.
    assert (await client.status(ids[0] or "")).status_code == 200
    assert (await client.http.get(f"/api/v2/no-such-route/{owner}")).status_code == 404
    return secrets


async def test_metrics_exposes_every_instrument_with_bounded_labels_only(client: HordeClient) -> None:
    secrets = await _traffic(client)
    routes = {route.path_format for route in client.http.app.routes} | {UNMATCHED_ROUTE}
    http_labels = FAMILIES[HTTP][1]
    expected = {**FAMILIES, HTTP: ("histogram", {**http_labels, "http_route": routes})}
    response = await client.http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text

    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, (kind, _) in expected.items():
        assert name in families, f"{name} missing from /metrics"
        assert families[name].type == kind
    assert set(families) - set(expected) <= {"target_info"}

    for sample_name, labels, _ in samples(text):
        if sample_name == "target_info":
            continue
        family = next(f for f in expected if sample_name.startswith(f))
        allowed = expected[family][1] if family in UNSCOPED else {**expected[family][1], **SCOPE}
        if sample_name.endswith("_bucket"):
            allowed = {**allowed, **LE}
        assert set(labels) <= set(allowed), (
            f"{sample_name} has unexpected labels {set(labels) - set(allowed)}"
        )
        assert set(expected[family][1]) <= set(labels), f"{sample_name} lacks labels: {labels}"
        for key, label_value in labels.items():
            assert label_value in allowed[key], f"{sample_name}: {key}={label_value!r} is not a bounded value"

    for secret in secrets:
        assert secret not in text, f"{secret!r} leaked into /metrics"

    # The traffic above recorded what it should, under the exported names.
    assert value(text, "horde_text_gate_shadow_assignments_total", horde_worker_trusted=True) == 4
    assert value(text, "horde_text_gate_shadow_outcomes_total", outcome="completed") == 1
    assert value(text, "horde_text_gate_shadow_outcomes_total", outcome="faulted") == 1
    assert value(text, "horde_text_gate_shadow_outcomes_total", outcome="aborted") == 2
    assert value(text, "horde_text_gate_shadow_service_seconds_count") == 1
    assert value(text, "horde_pop_lease_capacity_limited_total", horde_size_bucket="513-1024") == 4
    assert value(text, "horde_text_queue_wait_seconds_count") == 4
    decisions = "horde_text_free_allowance_decisions_total"
    assert value(text, decisions) == 5
    for requester in REQUESTERS:
        assert value(text, decisions, horde_requester=requester) >= 1
    assert value(text, decisions, horde_outcome="refused", horde_requester="anonymous") == 1
    assert value(text, decisions, horde_outcome="funded", horde_requested_bucket=">4096") == 1
    assert value(text, decisions, horde_chat=True) == 1
    jobs = "horde_text_jobs_total"
    assert value(text, jobs, horde_event="popped") == 4
    assert value(text, jobs, horde_event="submitted") == value(text, jobs, horde_event="faulted") == 1
    assert value(text, jobs, horde_event="aborted") == 2
    http = "http_server_request_duration_seconds_count"
    assert value(text, http, http_route="/api/v2/generate/text/status/{request_id}") == 1
    assert value(text, http, http_route=UNMATCHED_ROUTE, http_response_status_code=404) == 1
