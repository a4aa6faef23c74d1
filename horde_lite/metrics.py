"""horde_lite's OpenTelemetry instruments: the one place their names and attributes are defined.

Names and attribute keys are a contract (docs/reference/metrics.md): dashboards
and tests read them. Callers build attribute sets only through the helpers below, so a key cannot
be misspelt and a value cannot be unbounded (ids belong in logs, never in metric attributes).

`Metrics` owns its whole pipeline (a `CollectorRegistry`, a `PrometheusMetricReader` and a
`MeterProvider`) and touches no global state, because tests build many apps in one process and a
factory may be called more than once. `render()` is what `/metrics` serves.

Prometheus rendering (opentelemetry-exporter-prometheus 0.66b2, prometheus-client 0.26.0): dots
become underscores, counters gain `_total`, unit "s" maps to the `_seconds` suffix (not doubled
since the names already end in it), histograms expose `_bucket`/`_count`/`_sum`; attribute keys
become labels with dots as underscores and booleans render as "true"/"false". See
`tests/support/prom.py` for the full table.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

__all__ = [
    "ALLOWANCE_OUTCOMES",
    "METER_NAME",
    "REQUESTER_KINDS",
    "SECONDS_BUCKETS",
    "SHADOW_OUTCOMES",
    "SIZE_BUCKETS",
    "AllowanceOutcome",
    "Attributes",
    "Metrics",
    "RequesterKind",
    "ShadowOutcome",
    "SizeBucket",
    "allowance_attributes",
    "shadow_attributes",
    "shadow_outcome_attributes",
    "size_bucket",
    "wait_attributes",
]

METER_NAME: Final = "horde_lite"

# One set of boundaries for every seconds histogram, 0 s to an hour. 60 and 300 are the allowance
# curve's thresholds (and 120/180/240 its worked values), 150 the base lease, so each of those
# questions is answered by a bucket edge rather than by interpolation.
SECONDS_BUCKETS: Final[tuple[float, ...]] = (
    0.5,
    1.0,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    150.0,
    180.0,
    240.0,
    300.0,
    600.0,
    900.0,
    1800.0,
    3600.0,
)

SizeBucket = Literal["<=512", "513-1024", "1025-2048", "2049-4096", ">4096"]
ShadowOutcome = Literal["completed", "faulted", "aborted"]
AllowanceOutcome = Literal["free", "funded", "refused", "downgraded"]
RequesterKind = Literal["anonymous", "registered", "shared_key"]

SIZE_BUCKETS: Final[tuple[SizeBucket, ...]] = get_args(SizeBucket)
SHADOW_OUTCOMES: Final[frozenset[str]] = frozenset(get_args(ShadowOutcome))
ALLOWANCE_OUTCOMES: Final[frozenset[str]] = frozenset(get_args(AllowanceOutcome))
REQUESTER_KINDS: Final[frozenset[str]] = frozenset(get_args(RequesterKind))

Attributes = dict[str, str | bool]

# Attribute keys, named once.
_WORKER_TRUSTED: Final = "horde.worker_trusted"
_SIZE_BUCKET: Final = "horde.size_bucket"
_CHAT: Final = "horde.chat"
# The shadow outcome attribute is plainly `outcome`, not `horde.outcome` (docs/reference/metrics.md).
_SHADOW_OUTCOME: Final = "outcome"
_REQUESTER: Final = "horde.requester"
_OUTCOME: Final = "horde.outcome"
_REQUESTED_BUCKET: Final = "horde.requested_bucket"
_ALLOWANCE_BUCKET: Final = "horde.allowance_bucket"


def size_bucket(tokens: int) -> SizeBucket:
    """Map a token count to one of five fixed buckets (inclusive upper edges), keeping labels bounded."""
    if tokens <= 512:
        return "<=512"
    if tokens <= 1024:
        return "513-1024"
    if tokens <= 2048:
        return "1025-2048"
    if tokens <= 4096:
        return "2049-4096"
    return ">4096"


def _check(value: str, allowed: frozenset[str], what: str) -> None:
    # Literal types catch a typo under a type checker; this catches it at run time too, so an
    # unbounded or misspelt value never reaches an exported series.
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; expected one of {sorted(allowed)}")


def shadow_attributes(worker_trusted: bool, max_length: int, chat: bool) -> Attributes:
    """Attributes of every gate-shadow record: assignments and service seconds (decision 0001)."""
    return {_WORKER_TRUSTED: worker_trusted, _SIZE_BUCKET: size_bucket(max_length), _CHAT: chat}


def shadow_outcome_attributes(
    worker_trusted: bool, max_length: int, chat: bool, outcome: ShadowOutcome
) -> Attributes:
    """Attributes of a `gate_shadow_outcomes` record: the shadow set plus `outcome`."""
    _check(outcome, SHADOW_OUTCOMES, "shadow outcome")
    return {**shadow_attributes(worker_trusted, max_length, chat), _SHADOW_OUTCOME: outcome}


def allowance_attributes(
    requester: RequesterKind, outcome: AllowanceOutcome, requested: int, allowance: int, chat: bool
) -> Attributes:
    """Attributes of a free-allowance decision (decision 0002): who asked, what happened, both sizes."""
    _check(requester, REQUESTER_KINDS, "requester kind")
    _check(outcome, ALLOWANCE_OUTCOMES, "allowance outcome")
    return {
        _REQUESTER: requester,
        _OUTCOME: outcome,
        _REQUESTED_BUCKET: size_bucket(requested),
        _ALLOWANCE_BUCKET: size_bucket(allowance),
        _CHAT: chat,
    }


def wait_attributes(requester: RequesterKind, chat: bool) -> Attributes:
    """Attributes of the two wait histograms, so waits can be read per requester kind (decision 0002)."""
    _check(requester, REQUESTER_KINDS, "requester kind")
    return {_REQUESTER: requester, _CHAT: chat}


class Metrics:
    """One app's instruments with a private registry, provider and reader.

    Nothing here is global: two instances never share a series, and `shutdown()` releases this
    one's provider and detaches its collector from its registry.
    """

    def __init__(self) -> None:
        self.registry: Final = CollectorRegistry()
        self._reader = PrometheusMetricReader(registry=self.registry)
        # shutdown_on_exit=False: the default registers an atexit hook holding every provider ever
        # built, which would keep each test's app alive until interpreter exit.
        self._provider = MeterProvider(
            metric_readers=[self._reader],
            resource=Resource.create({"service.name": METER_NAME}),
            shutdown_on_exit=False,
        )
        self._shut_down = False
        meter = self._provider.get_meter(METER_NAME)

        self.gate_shadow_assignments = meter.create_counter(
            "horde.text.gate_shadow.assignments",
            unit="{assignment}",
            description="Text jobs assigned to a worker whose capacity is below their max_length.",
        )
        self.gate_shadow_outcomes = meter.create_counter(
            "horde.text.gate_shadow.outcomes",
            unit="{job}",
            description="Ends of over-capacity text jobs, by outcome (completed, faulted, aborted).",
        )
        self.gate_shadow_service_seconds = meter.create_histogram(
            "horde.text.gate_shadow.service_seconds",
            unit="s",
            description="Pop-to-submit time of completed over-capacity text jobs.",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        self.pop_lease_capacity_limited = meter.create_counter(
            "horde.pop.lease_capacity_limited",
            unit="{pop}",
            description="Pops by a worker whose capacity is below its declared max_completion_tokens.",
        )
        self.free_allowance_decisions = meter.create_counter(
            "horde.text.free_allowance.decisions",
            unit="{request}",
            description="Free output allowance decisions at text and chat request creation.",
        )
        self.free_allowance_estimated_wait_seconds = meter.create_histogram(
            "horde.text.free_allowance.estimated_wait_seconds",
            unit="s",
            description="Estimated wait used to size the free output allowance.",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        self.queue_wait_seconds = meter.create_histogram(
            "horde.text.queue_wait_seconds",
            unit="s",
            description="Time from text request creation to each of its assignments.",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition of this instance's registry, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def shutdown(self) -> None:
        """Release the provider; idempotent because the SDK warns on a second shutdown."""
        if self._shut_down:
            return
        self._shut_down = True
        self._provider.shutdown()
