"""horde_lite.metrics: exported names and labels, isolation between instances, bounded attributes,
the operational families present from start-up and the folding of model labels."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from horde_lite.metrics import (
    ANY_MODEL,
    HTTP_SECONDS_BUCKETS,
    JOB_EVENTS,
    MODEL_SERIES_CAP,
    OTHER_MODELS,
    SECONDS_BUCKETS,
    SIZE_BUCKETS,
    WAKE_SOURCES,
    WEBHOOK_OUTCOMES,
    WOKEN_OUTCOMES,
    WORKER_KINDS,
    Metrics,
    OnlineCount,
    OpsSnapshot,
    WaitingCount,
    allowance_attributes,
    http_attributes,
    job_attributes,
    model_labels,
    ops_families,
    shadow_attributes,
    shadow_outcome_attributes,
    size_bucket,
    wait_attributes,
)
from tests.support.prom import OPERATIONAL_FAMILIES, samples, value


@pytest.fixture
def metrics() -> Iterator[Metrics]:
    m = Metrics()
    yield m
    m.shutdown()


def _text(m: Metrics) -> str:
    body, _ = m.render()
    return body.decode()


def _labels_of(text: str, name: str) -> list[dict[str, str]]:
    return [labels for sample_name, labels, _ in samples(text) if sample_name == name]


@pytest.mark.parametrize(
    ("tokens", "bucket"),
    [
        (0, "<=512"),
        (512, "<=512"),
        (513, "513-1024"),
        (1024, "513-1024"),
        (1025, "1025-2048"),
        (2048, "1025-2048"),
        (2049, "2049-4096"),
        (4096, "2049-4096"),
        (4097, ">4096"),
        (16384, ">4096"),
    ],
)
def test_size_bucket_edges_are_inclusive(tokens: int, bucket: str) -> None:
    assert size_bucket(tokens) == bucket


def test_size_buckets_lists_every_bucket_in_order() -> None:
    assert SIZE_BUCKETS == ("<=512", "513-1024", "1025-2048", "2049-4096", ">4096")


def test_attribute_helpers_give_the_contract_keys() -> None:
    assert shadow_attributes(worker_trusted=True, max_length=600, chat=False) == {
        "horde.worker_trusted": True,
        "horde.size_bucket": "513-1024",
        "horde.chat": False,
    }
    assert shadow_outcome_attributes(False, 5000, True, "aborted") == {
        "horde.worker_trusted": False,
        "horde.size_bucket": ">4096",
        "horde.chat": True,
        "outcome": "aborted",
    }
    assert allowance_attributes("anonymous", "downgraded", requested=3000, allowance=512, chat=False) == {
        "horde.requester": "anonymous",
        "horde.outcome": "downgraded",
        "horde.requested_bucket": "2049-4096",
        "horde.allowance_bucket": "<=512",
        "horde.chat": False,
    }
    assert wait_attributes("shared_key", chat=True) == {"horde.requester": "shared_key", "horde.chat": True}


@pytest.mark.parametrize(
    "call",
    [
        lambda: shadow_outcome_attributes(True, 10, False, "timeout"),  # type: ignore[arg-type]
        lambda: allowance_attributes("user-42", "free", 10, 10, False),  # type: ignore[arg-type]
        lambda: allowance_attributes("anonymous", "Free", 10, 10, False),  # type: ignore[arg-type]
        lambda: wait_attributes("worker", False),  # type: ignore[arg-type]
        lambda: job_attributes("completed", False),  # type: ignore[arg-type]
    ],
)
def test_attribute_helpers_refuse_values_outside_the_bounded_sets(call: object) -> None:
    with pytest.raises(ValueError, match="unknown"):
        call()  # type: ignore[operator]


def test_render_returns_prometheus_text_and_its_content_type(metrics: Metrics) -> None:
    metrics.pop_lease_capacity_limited.add(1)
    body, content_type = metrics.render()
    assert isinstance(body, bytes)
    assert content_type == CONTENT_TYPE_LATEST
    assert b"# TYPE horde_pop_lease_capacity_limited_total counter" in body


def test_unrecorded_instruments_are_absent_and_read_as_zero(metrics: Metrics) -> None:
    text = _text(metrics)
    assert "horde_text_gate_shadow_assignments_total" not in text
    assert value(text, "horde_text_gate_shadow_assignments_total") == 0.0


def test_two_instances_do_not_share_state() -> None:
    first, second = Metrics(), Metrics()
    try:
        assert first.registry is not second.registry
        first.gate_shadow_assignments.add(3, shadow_attributes(True, 100, False))
        second.gate_shadow_assignments.add(1, shadow_attributes(True, 100, False))
        first.queue_wait_seconds.record(42.0, wait_attributes("registered", False))

        first_text, second_text = _text(first), _text(second)
        assert value(first_text, "horde_text_gate_shadow_assignments_total") == 3.0
        assert value(second_text, "horde_text_gate_shadow_assignments_total") == 1.0
        assert value(first_text, "horde_text_queue_wait_seconds_count") == 1.0
        assert "horde_text_queue_wait_seconds" not in second_text
    finally:
        first.shutdown()
        second.shutdown()


def test_shutdown_detaches_the_collector_and_is_idempotent() -> None:
    m = Metrics()
    m.pop_lease_capacity_limited.add(1)
    assert value(_text(m), "horde_pop_lease_capacity_limited_total") == 1.0
    m.shutdown()
    m.shutdown()
    assert m.render()[0] == b""


def test_gate_shadow_assignments_render_with_shadow_labels(metrics: Metrics) -> None:
    metrics.gate_shadow_assignments.add(1, shadow_attributes(worker_trusted=True, max_length=512, chat=False))
    metrics.gate_shadow_assignments.add(2, shadow_attributes(worker_trusted=False, max_length=513, chat=True))
    text = _text(metrics)
    name = "horde_text_gate_shadow_assignments_total"
    assert value(text, name) == 3.0
    assert (
        value(text, name, horde_worker_trusted="true", horde_size_bucket="<=512", horde_chat="false") == 1.0
    )
    assert value(text, name, horde_worker_trusted=False, horde_size_bucket="513-1024", horde_chat=True) == 2.0
    for labels in _labels_of(text, name):
        assert labels["otel_scope_name"] == "horde_lite"
        assert {"horde_worker_trusted", "horde_size_bucket", "horde_chat"} <= labels.keys()


def test_gate_shadow_outcomes_render_with_outcome_label(metrics: Metrics) -> None:
    for outcome in ("completed", "faulted", "aborted", "aborted"):
        metrics.gate_shadow_outcomes.add(1, shadow_outcome_attributes(True, 2048, True, outcome))
    text = _text(metrics)
    name = "horde_text_gate_shadow_outcomes_total"
    assert value(text, name, outcome="completed", horde_size_bucket="1025-2048", horde_chat=True) == 1.0
    assert value(text, name, outcome="faulted") == 1.0
    assert value(text, name, outcome="aborted") == 2.0
    assert {labels["outcome"] for labels in _labels_of(text, name)} == {"completed", "faulted", "aborted"}


def test_gate_shadow_service_seconds_histogram_count_sum_and_buckets(metrics: Metrics) -> None:
    attrs = shadow_attributes(worker_trusted=False, max_length=4096, chat=False)
    for seconds in (35.0, 141.0, 160.0):
        metrics.gate_shadow_service_seconds.record(seconds, attrs)
    text = _text(metrics)
    base = "horde_text_gate_shadow_service_seconds"
    labels = {"horde_worker_trusted": "false", "horde_size_bucket": "2049-4096", "horde_chat": "false"}
    assert value(text, f"{base}_count", **labels) == 3.0
    assert value(text, f"{base}_sum", **labels) == pytest.approx(336.0)
    # Cumulative buckets: the base lease (150 s) is an edge, so "ran past the lease" is readable.
    assert value(text, f"{base}_bucket", le="30.0", **labels) == 0.0
    assert value(text, f"{base}_bucket", le="60.0", **labels) == 1.0
    assert value(text, f"{base}_bucket", le="150.0", **labels) == 2.0
    assert value(text, f"{base}_bucket", le="180.0", **labels) == 3.0
    assert value(text, f"{base}_bucket", le="+Inf", **labels) == 3.0


def test_histograms_use_the_seconds_buckets(metrics: Metrics) -> None:
    metrics.queue_wait_seconds.record(1.0, wait_attributes("anonymous", False))
    edges = [labels["le"] for labels in _labels_of(_text(metrics), "horde_text_queue_wait_seconds_bucket")]
    assert edges == [str(edge) for edge in SECONDS_BUCKETS] + ["+Inf"]
    assert SECONDS_BUCKETS[-1] == 3600.0
    assert {60.0, 150.0, 300.0} <= set(SECONDS_BUCKETS)


def test_pop_lease_capacity_limited_renders_as_counter(metrics: Metrics) -> None:
    metrics.pop_lease_capacity_limited.add(1)
    metrics.pop_lease_capacity_limited.add(1)
    assert value(_text(metrics), "horde_pop_lease_capacity_limited_total") == 2.0


def test_free_allowance_decisions_render_with_allowance_labels(metrics: Metrics) -> None:
    metrics.free_allowance_decisions.add(1, allowance_attributes("anonymous", "free", 400, 4096, False))
    metrics.free_allowance_decisions.add(1, allowance_attributes("registered", "funded", 8000, 512, True))
    metrics.free_allowance_decisions.add(1, allowance_attributes("anonymous", "refused", 3000, 1408, True))
    text = _text(metrics)
    name = "horde_text_free_allowance_decisions_total"
    assert value(text, name) == 3.0
    assert (
        value(
            text,
            name,
            horde_requester="anonymous",
            horde_outcome="free",
            horde_requested_bucket="<=512",
            horde_allowance_bucket="2049-4096",
            horde_chat="false",
        )
        == 1.0
    )
    assert value(text, name, horde_outcome="funded", horde_requested_bucket=">4096", horde_chat=True) == 1.0
    assert value(text, name, horde_requester="anonymous") == 2.0
    assert value(text, name, horde_allowance_bucket="1025-2048", horde_outcome="refused") == 1.0


def test_free_allowance_estimated_wait_histogram(metrics: Metrics) -> None:
    metrics.free_allowance_estimated_wait_seconds.record(180.0, wait_attributes("anonymous", False))
    metrics.free_allowance_estimated_wait_seconds.record(20.0, wait_attributes("anonymous", False))
    text = _text(metrics)
    base = "horde_text_free_allowance_estimated_wait_seconds"
    assert value(text, f"{base}_count", horde_requester="anonymous", horde_chat="false") == 2.0
    assert value(text, f"{base}_sum") == pytest.approx(200.0)
    assert value(text, f"{base}_bucket", le="60.0") == 1.0


def test_queue_wait_histogram_by_requester(metrics: Metrics) -> None:
    metrics.queue_wait_seconds.record(5.0, wait_attributes("registered", True))
    metrics.queue_wait_seconds.record(700.0, wait_attributes("anonymous", False))
    text = _text(metrics)
    base = "horde_text_queue_wait_seconds"
    assert value(text, f"{base}_count") == 2.0
    assert value(text, f"{base}_count", horde_requester="registered", horde_chat=True) == 1.0
    assert value(text, f"{base}_sum", horde_requester="anonymous") == pytest.approx(700.0)
    assert value(text, f"{base}_bucket", le="600.0", horde_requester="anonymous") == 0.0
    assert value(text, f"{base}_bucket", le="900.0", horde_requester="anonymous") == 1.0


def test_no_attribute_carries_an_unbounded_value(metrics: Metrics) -> None:
    """Every exported label value comes from a fixed set (ids belong in logs, never in metrics)."""
    metrics.gate_shadow_assignments.add(1, shadow_attributes(True, 123_456, True))
    metrics.gate_shadow_outcomes.add(1, shadow_outcome_attributes(True, 7, False, "completed"))
    metrics.free_allowance_decisions.add(1, allowance_attributes("shared_key", "free", 99_999, 1, True))
    metrics.queue_wait_seconds.record(1.0, wait_attributes("shared_key", True))
    bounded = (
        set(SIZE_BUCKETS)
        | {"true", "false", "completed", "faulted", "aborted", "free", "funded", "refused", "downgraded"}
        | {"anonymous", "registered", "shared_key"}
        | set(JOB_EVENTS)
        | set(WEBHOOK_OUTCOMES)
        | set(WOKEN_OUTCOMES)
        | set(WAKE_SOURCES)
    )
    seen = 0
    for name, labels, _ in samples(_text(metrics)):
        if not name.startswith("horde_"):
            continue
        for key, label_value in labels.items():
            if key.startswith("horde_") or key in ("outcome", "source"):
                assert label_value in bounded, (name, key, label_value)
                seen += 1
    assert seen > 0


# --- operational families --------------------------------------------------------------------------


def _families(text: str) -> dict[str, object]:
    return {family.name: family for family in text_string_to_metric_families(text)}


class _Collected:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def _gauges(snapshot: OpsSnapshot, cap: int = MODEL_SERIES_CAP) -> str:
    """The exposition of a snapshot's gauges alone."""
    return generate_latest(_Collected(ops_families(snapshot, cap))).decode()  # type: ignore[arg-type]


def test_a_fresh_instance_shows_every_operational_family(metrics: Metrics) -> None:
    """Nothing recorded and no snapshot read: each family is still written (the exporter would
    leave out an instrument with no data), the job counter with a zero series per label set."""
    text = _text(metrics)
    families = _families(text)
    for name, kind in OPERATIONAL_FAMILIES.items():
        assert name in families, f"{name} missing"
        assert families[name].type == kind  # type: ignore[attr-defined]
    jobs = [labels for name, labels, _ in samples(text) if name == "horde_text_jobs_total"]
    assert sorted((j["horde_event"], j["horde_chat"]) for j in jobs) == sorted(
        (event, flag) for event in JOB_EVENTS for flag in ("false", "true")
    )
    assert value(text, "horde_text_jobs_total") == 0.0
    # Not read: the gauges and the HTTP histogram have HELP and TYPE lines and no sample.
    for name in ("horde_text_waiting_requests", "horde_text_queued_tokens", "horde_workers_online"):
        assert families[name].samples == []  # type: ignore[attr-defined]
    assert families["http_server_request_duration_seconds"].samples == []  # type: ignore[attr-defined]
    assert "# TYPE http_server_request_duration_seconds histogram" in text


def test_an_empty_snapshot_gives_the_other_zero_series(metrics: Metrics) -> None:
    body, _ = metrics.render(OpsSnapshot())
    text = body.decode()
    waiting = [labels for name, labels, _ in samples(text) if name == "horde_text_waiting_requests"]
    assert waiting == [
        {"horde_model": OTHER_MODELS, "horde_chat": "false"},
        {"horde_model": OTHER_MODELS, "horde_chat": "true"},
    ]
    online = [labels for name, labels, _ in samples(text) if name == "horde_workers_online"]
    assert online == [{"horde_model": OTHER_MODELS, "horde_worker_kind": kind} for kind in WORKER_KINDS]
    assert value(text, "horde_text_queued_tokens") == 0.0
    assert text.count("# TYPE horde_workers_online gauge") == 1  # written once, not also as empty


def test_job_events_and_ends_count_under_their_event(metrics: Metrics) -> None:
    metrics.job_event("popped", chat=False, jobs=3)
    metrics.job_event("popped", chat=True)
    metrics.job_ended("completed", chat=False)
    metrics.job_ended("faulted", chat=True)
    metrics.job_ended("aborted", chat=False)
    metrics.job_ended("aborted", chat=False)
    text = _text(metrics)
    name = "horde_text_jobs_total"
    assert value(text, name, horde_event="popped", horde_chat=False) == 3
    assert value(text, name, horde_event="popped", horde_chat=True) == 1
    assert value(text, name, horde_event="submitted") == 1  # a stored submit is a "completed" end
    assert value(text, name, horde_event="faulted", horde_chat=True) == 1
    assert value(text, name, horde_event="aborted", horde_chat=False) == 2
    with pytest.raises(KeyError):
        metrics.job_ended("cancelled", chat=False)


def test_http_attributes_are_bounded() -> None:
    assert http_attributes("/api/v2/generate/text/status/{id:str}", "GET", 404) == {
        "http.route": "/api/v2/generate/text/status/{id:str}",
        "http.request.method": "GET",
        "http.response.status_code": "404",
    }
    # No route matched, a method a client made up, a status outside HTTP's range.
    assert http_attributes(None, "BREW", 1000) == {
        "http.route": "unmatched",
        "http.request.method": "_OTHER",
        "http.response.status_code": "_OTHER",
    }


def test_http_requests_render_by_route_method_and_status(metrics: Metrics) -> None:
    metrics.http_request("/metrics", "GET", 200, 0.003)
    metrics.http_request("/metrics", "GET", 200, 0.2)
    metrics.http_request(None, "POST", 404, 0.001)
    text = _text(metrics)
    base = "http_server_request_duration_seconds"
    assert value(text, f"{base}_count", http_route="/metrics", http_request_method="GET") == 2
    assert value(text, f"{base}_sum", http_route="/metrics") == pytest.approx(0.203)
    assert value(text, f"{base}_bucket", http_route="/metrics", le="0.005") == 1
    assert value(text, f"{base}_count", http_route="unmatched", http_response_status_code=404) == 1
    edges = [labels["le"] for name, labels, _ in samples(text) if name == f"{base}_bucket"][:16]
    assert edges == [str(edge) for edge in HTTP_SECONDS_BUCKETS] + ["+Inf"]


def test_gauges_sum_rows_of_one_label_and_name_requests_without_a_model_any() -> None:
    snapshot = OpsSnapshot(
        waiting=[
            WaitingCount("m-a", chat=False, requests=2, tokens=500),
            WaitingCount("m-a", chat=True, requests=1, tokens=300),
            WaitingCount(None, chat=False, requests=4, tokens=40),
        ],
        online=[OnlineCount("m-a", "chat", 2), OnlineCount(None, "legacy", 1)],
    )
    text = _gauges(snapshot)
    assert value(text, "horde_text_waiting_requests", horde_model="m-a", horde_chat=False) == 2
    assert value(text, "horde_text_queued_tokens", horde_model="m-a", horde_chat=True) == 300
    assert value(text, "horde_text_waiting_requests", horde_model=ANY_MODEL) == 4
    assert value(text, "horde_workers_online", horde_model="m-a", horde_worker_kind="chat") == 2
    assert value(text, "horde_workers_online", horde_model=ANY_MODEL, horde_worker_kind="legacy") == 1
    assert value(text, "horde_text_waiting_requests", horde_model=OTHER_MODELS) == 0


def test_models_past_the_cap_fold_into_other_busiest_first() -> None:
    # 30 models; model i has i waiting requests, so the 20 busiest are 10..29.
    snapshot = OpsSnapshot(
        waiting=[WaitingCount(f"m{i:02d}", False, requests=i, tokens=10 * i) for i in range(1, 31)]
    )
    labels = model_labels(snapshot)
    kept = {m for m, label in labels.items() if label == m}
    assert kept == {f"m{i:02d}" for i in range(11, 31)}
    assert len(kept) == MODEL_SERIES_CAP
    assert {labels[f"m{i:02d}"] for i in range(1, 11)} == {OTHER_MODELS}
    text = _gauges(snapshot)
    assert value(text, "horde_text_waiting_requests", horde_model=OTHER_MODELS) == sum(range(1, 11))


def test_a_model_named_like_a_reserved_label_is_folded() -> None:
    snapshot = OpsSnapshot(online=[OnlineCount(ANY_MODEL, "chat", 1), OnlineCount(OTHER_MODELS, "chat", 1)])
    assert model_labels(snapshot)[ANY_MODEL] == OTHER_MODELS
    text = _gauges(snapshot)
    assert value(text, "horde_workers_online", horde_model=OTHER_MODELS, horde_worker_kind="chat") == 2
    assert value(text, "horde_workers_online", horde_model=ANY_MODEL) == 0


_models = st.one_of(st.none(), st.sampled_from([ANY_MODEL, OTHER_MODELS]), st.text(min_size=1, max_size=12))


@given(
    waiting=st.lists(
        st.tuples(_models, st.booleans(), st.integers(1, 50), st.integers(1, 10_000)), max_size=80
    ),
    online=st.lists(st.tuples(_models, st.sampled_from(WORKER_KINDS), st.integers(1, 20)), max_size=80),
    cap=st.integers(0, 25),
)
def test_model_labels_stay_bounded_and_totals_are_kept(
    waiting: list[tuple[str | None, bool, int, int]], online: list[tuple[str | None, str, int]], cap: int
) -> None:
    """Whatever models are declared, each family has at most `cap` named models plus "(any)" and
    "(other)", and folding moves counts between labels without losing or adding any."""
    snapshot = OpsSnapshot(
        waiting=[WaitingCount(m, c, r, t) for m, c, r, t in waiting],
        online=[OnlineCount(m, k, n) for m, k, n in online],  # type: ignore[arg-type]
    )
    text = _gauges(snapshot, cap)
    for name in ("horde_text_waiting_requests", "horde_workers_online"):
        models = {labels["horde_model"] for sample, labels, _ in samples(text) if sample == name}
        assert OTHER_MODELS in models
        assert len(models - {ANY_MODEL, OTHER_MODELS}) <= cap
    assert value(text, "horde_text_waiting_requests") == sum(r for _, _, r, _ in waiting)
    assert value(text, "horde_text_queued_tokens") == sum(t for *_, t in waiting)
    assert value(text, "horde_workers_online") == sum(n for *_, n in online)
    labels = model_labels(snapshot, cap)
    kept = {m: label for m, label in labels.items() if label not in (ANY_MODEL, OTHER_MODELS)}
    assert len(kept) <= cap
    assert all(label == m for m, label in kept.items())  # a kept model is labelled by its own name
    assert labels.get(ANY_MODEL, OTHER_MODELS) == OTHER_MODELS  # a real "(any)" is never ANY_MODEL
