"""horde_lite.metrics: exported names and labels, isolation between instances, bounded attributes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CONTENT_TYPE_LATEST

from horde_lite.metrics import (
    SECONDS_BUCKETS,
    SIZE_BUCKETS,
    Metrics,
    allowance_attributes,
    shadow_attributes,
    shadow_outcome_attributes,
    size_bucket,
    wait_attributes,
)
from tests.support.prom import samples, value


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
    )
    seen = 0
    for name, labels, _ in samples(_text(metrics)):
        if not name.startswith("horde_"):
            continue
        for key, label_value in labels.items():
            if key.startswith("horde_") or key == "outcome":
                assert label_value in bounded, (name, key, label_value)
                seen += 1
    assert seen > 0
