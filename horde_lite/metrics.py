"""horde_lite's OpenTelemetry instruments: the one place their names and attributes are defined.

Names and attribute keys are a contract (docs/reference/metrics.md): dashboards
and tests read them. Callers build attribute sets only through the helpers below, so a key cannot
be misspelt and a value cannot be unbounded (ids belong in logs, never in metric attributes).

`Metrics` owns its whole pipeline (a `CollectorRegistry`, a `PrometheusMetricReader` and a
`MeterProvider`) and touches no global state, because tests build many apps in one process and a
factory may be called more than once. `render()` is what `/metrics` serves.

The operational families (docs/reference/metrics.md, "Operations") are present from start-up: the
job counter starts with a zero series for each of its fixed label sets, the scrape-time gauges are
built from an `OpsSnapshot` read at each scrape (always with their "(other)" zero series), and a
family that has no sample yet (the HTTP histogram before its first request) is still written with
its HELP and TYPE lines, because the OpenTelemetry exporter leaves out an instrument with no data.

Prometheus rendering (opentelemetry-exporter-prometheus 0.66b2, prometheus-client 0.26.0): dots
become underscores, counters gain `_total`, unit "s" maps to the `_seconds` suffix (not doubled
since the names already end in it), histograms expose `_bucket`/`_count`/`_sum`; attribute keys
become labels with dots as underscores and booleans render as "true"/"false". See
`tests/support/prom.py` for the full table.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final, Literal, get_args

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from horde_lite.requests.admission_rule import ADMISSION_OUTCOMES, AdmissionOutcome

__all__ = [
    "ALLOWANCE_OUTCOMES",
    "ANY_MODEL",
    "HTTP_SECONDS_BUCKETS",
    "JOB_EVENTS",
    "METER_NAME",
    "MODEL_SERIES_CAP",
    "OTHER_MODELS",
    "REQUESTER_KINDS",
    "SECONDS_BUCKETS",
    "SHADOW_OUTCOMES",
    "SIZE_BUCKETS",
    "UNMATCHED_ROUTE",
    "WAKE_SOURCES",
    "WEBHOOK_OUTCOMES",
    "WOKEN_OUTCOMES",
    "WORKER_KINDS",
    "AllowanceOutcome",
    "Attributes",
    "JobEvent",
    "Metrics",
    "OnlineCount",
    "OpsSnapshot",
    "RequesterKind",
    "ShadowOutcome",
    "SizeBucket",
    "WaitingCount",
    "WakeSource",
    "WebhookOutcome",
    "WokenOutcome",
    "WorkerKind",
    "allowance_attributes",
    "http_attributes",
    "job_attributes",
    "model_labels",
    "ops_families",
    "shadow_attributes",
    "shadow_outcome_attributes",
    "size_bucket",
    "wait_attributes",
    "wake_attributes",
    "webhook_attributes",
    "woken_attributes",
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
AllowanceOutcome = AdmissionOutcome
RequesterKind = Literal["anonymous", "registered", "shared_key"]

SIZE_BUCKETS: Final[tuple[SizeBucket, ...]] = get_args(SizeBucket)
SHADOW_OUTCOMES: Final[frozenset[str]] = frozenset(get_args(ShadowOutcome))
ALLOWANCE_OUTCOMES: Final[frozenset[str]] = frozenset(ADMISSION_OUTCOMES)
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
_EVENT: Final = "horde.event"
# The HTTP histogram's keys are OpenTelemetry's semantic conventions for HTTP servers.
_ROUTE: Final = "http.route"
_METHOD: Final = "http.request.method"
_STATUS: Final = "http.response.status_code"


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
    """Attributes of every gate-shadow record: assignments and service seconds."""
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
    """Attributes of a free-allowance decision: who asked, what happened, both sizes."""
    _check(requester, REQUESTER_KINDS, "requester kind")
    _check(outcome, ALLOWANCE_OUTCOMES, "allowance outcome")
    return {
        _REQUESTER: requester,
        _OUTCOME: str(outcome),  # the value, not the enum member
        _REQUESTED_BUCKET: size_bucket(requested),
        _ALLOWANCE_BUCKET: size_bucket(allowance),
        _CHAT: chat,
    }


def wait_attributes(requester: RequesterKind, chat: bool) -> Attributes:
    """Attributes of the two wait histograms, so waits can be read per requester kind."""
    _check(requester, REQUESTER_KINDS, "requester kind")
    return {_REQUESTER: requester, _CHAT: chat}


# --- operational metrics -------------------------------------------------------------------------

JobEvent = Literal["popped", "submitted", "faulted", "aborted"]
WorkerKind = Literal["chat", "legacy"]

JOB_EVENTS: Final[tuple[JobEvent, ...]] = get_args(JobEvent)
WORKER_KINDS: Final[tuple[WorkerKind, ...]] = get_args(WorkerKind)
_JOB_EVENT_SET: Final[frozenset[str]] = frozenset(JOB_EVENTS)
# A job's end as the settlement names it (jobs/settlement.py) -> the event counted.
_END_EVENTS: Final[dict[str, JobEvent]] = {
    "completed": "submitted",
    "faulted": "faulted",
    "aborted": "aborted",
}

# Per-model series: at most this many named models per family, plus ANY_MODEL and OTHER_MODELS.
# Model names come from workers' and clients' declarations, so the rest are folded into one label.
MODEL_SERIES_CAP: Final = 20
ANY_MODEL: Final = "(any)"  # requests naming no model; workers declaring none
OTHER_MODELS: Final = "(other)"  # every model past the cap, summed
_RESERVED_MODELS: Final = frozenset((ANY_MODEL, OTHER_MODELS))

UNMATCHED_ROUTE: Final = "unmatched"  # a path no route matches (404, 405): never the raw path
# The methods the semantic conventions name; any other is recorded as "_OTHER".
_HTTP_METHODS: Final = frozenset(
    ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE")
)
_OTHER: Final = "_OTHER"  # a method outside that set, a status code outside 100-599
# Most answers take milliseconds; a long poll, a blocking chat completion or a stream takes up to
# minutes (150 s is the base lease), so the buckets reach 5 minutes.
HTTP_SECONDS_BUCKETS: Final[tuple[float, ...]] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 150.0, 300.0,
)  # fmt: skip

# Names and help texts, shared by the instruments and the families written before any sample.
_JOBS_HELP: Final = "Real text and chat jobs: handed out by a pop, and their ends (each job ends once)."
_HTTP_HELP: Final = "Duration of HTTP requests, by route template, method and status code."
_WAITING_REQUESTS: Final = "horde_text_waiting_requests"
_WAITING_REQUESTS_HELP: Final = "Requests with jobs not yet handed out, by model (read at scrape)."
_QUEUED_TOKENS: Final = "horde_text_queued_tokens"
_QUEUED_TOKENS_HELP: Final = (
    "Output tokens of the jobs not yet handed out (max_length x jobs left), by model (read at scrape)."
)
_WORKERS_ONLINE: Final = "horde_workers_online"
_WORKERS_ONLINE_HELP: Final = "Online workers, by model and kind (read at scrape)."


def job_attributes(event: JobEvent, chat: bool) -> Attributes:
    """Attributes of a `horde.text.jobs` record."""
    _check(event, _JOB_EVENT_SET, "job event")
    return {_EVENT: event, _CHAT: chat}


# How a generation's webhook ended (webhooks/delivery.py): delivered (a 2xx answer), given up after
# its attempts, dropped (the process's queue was full, or the process stopped first) or refused
# (its host resolved to an address webhooks may not reach). Upstream's metric and outcome names.
WebhookOutcome = Literal["ok", "giveup", "dropped", "refused"]
WEBHOOK_OUTCOMES: Final[tuple[WebhookOutcome, ...]] = get_args(WebhookOutcome)
_WEBHOOK_OUTCOME_SET: Final[frozenset[str]] = frozenset(WEBHOOK_OUTCOMES)
# Plainly `outcome`, as upstream's `horde.webhook.outcomes` has it.
_WEBHOOK_OUTCOME: Final = "outcome"


def webhook_attributes(outcome: WebhookOutcome) -> Attributes:
    """Attributes of a `horde.webhook.outcomes` record."""
    _check(outcome, _WEBHOOK_OUTCOME_SET, "webhook outcome")
    return {_WEBHOOK_OUTCOME: outcome}


# Where a waiting pop's wake-up came from: this process's commit (local), another process's NOTIFY
# (remote), the watcher that re-checks the database where no channel says (poll), a switch of
# the horde's policies or modes (switch), or a woken pop that found nothing handing it on (handed).
WakeSource = Literal["local", "remote", "poll", "switch", "handed"]
WAKE_SOURCES: Final[tuple[WakeSource, ...]] = get_args(WakeSource)
_WAKE_SOURCE_SET: Final[frozenset[str]] = frozenset(WAKE_SOURCES)
# How a woken pop's new try ended: with a job, or with nothing (another took it, or a rule refused).
WokenOutcome = Literal["job", "empty"]
WOKEN_OUTCOMES: Final[tuple[WokenOutcome, ...]] = get_args(WokenOutcome)
_WOKEN_OUTCOME_SET: Final[frozenset[str]] = frozenset(WOKEN_OUTCOMES)


def wake_attributes(source: WakeSource) -> Attributes:
    """Attributes of a `horde.pop.wakeups` record."""
    _check(source, _WAKE_SOURCE_SET, "wake source")
    return {"source": source}


def woken_attributes(outcome: WokenOutcome) -> Attributes:
    """Attributes of a `horde.pop.woken` record."""
    _check(outcome, _WOKEN_OUTCOME_SET, "woken pop outcome")
    return {"outcome": outcome}


def http_attributes(route: str | None, method: str, status: int) -> Attributes:
    """Attributes of one HTTP request: the route's template (None: no route matched), a known
    method or "_OTHER", the status code; none of them can take a value a client chose."""
    return {
        _ROUTE: route or UNMATCHED_ROUTE,
        _METHOD: method if method in _HTTP_METHODS else _OTHER,
        _STATUS: str(status) if 100 <= status <= 599 else _OTHER,
    }


@dataclass(frozen=True, slots=True)
class WaitingCount:
    """Requests with jobs not yet handed out, for one model they name (None: they name none)."""

    model: str | None
    chat: bool
    requests: int
    tokens: int  # max_length x jobs not yet handed out, summed


@dataclass(frozen=True, slots=True)
class OnlineCount:
    """Online workers declaring one model (None: they declare none), of one kind."""

    model: str | None
    kind: WorkerKind
    workers: int


@dataclass(frozen=True, slots=True)
class OpsSnapshot:
    """What the scrape-time gauges show, as read from the database (operators/ops_metrics.py)."""

    waiting: Sequence[WaitingCount] = ()
    online: Sequence[OnlineCount] = ()


def model_labels(snapshot: OpsSnapshot, cap: int = MODEL_SERIES_CAP) -> dict[str | None, str]:
    """Each model of a snapshot -> its label. The `cap` busiest named models keep their name
    (busiest: most waiting requests plus online workers, ties by name, so the choice is stable
    within a scrape and the same for every family); no model is ANY_MODEL; every other model, and
    one literally named like a reserved label, is OTHER_MODELS."""
    score: dict[str, int] = {}
    for waiting in snapshot.waiting:
        if waiting.model is not None:
            score[waiting.model] = score.get(waiting.model, 0) + waiting.requests
    for online in snapshot.online:
        if online.model is not None:
            score[online.model] = score.get(online.model, 0) + online.workers
    named = sorted((m for m in score if m not in _RESERVED_MODELS), key=lambda m: (-score[m], m))[:cap]
    labels: dict[str | None, str] = dict.fromkeys(score, OTHER_MODELS)
    labels.update((m, m) for m in named)
    labels[None] = ANY_MODEL
    return labels


def _flag(value: bool) -> str:
    return "true" if value else "false"  # as the exporter renders a boolean attribute


def ops_families(snapshot: OpsSnapshot, cap: int = MODEL_SERIES_CAP) -> list[Metric]:
    """The scrape-time gauges of one snapshot, models folded by `model_labels`. OTHER_MODELS is
    always written (0 when nothing is folded), so each family has a sample on a fresh server and a
    `sum by` over it never sees an empty vector."""
    labels = model_labels(snapshot, cap)
    waiting: dict[tuple[str, bool], list[int]] = {(OTHER_MODELS, chat): [0, 0] for chat in (False, True)}
    for row in snapshot.waiting:
        sums = waiting.setdefault((labels[row.model], row.chat), [0, 0])
        sums[0] += row.requests
        sums[1] += row.tokens
    online: dict[tuple[str, str], int] = {(OTHER_MODELS, kind): 0 for kind in WORKER_KINDS}
    for worker in snapshot.online:
        key = (labels[worker.model], worker.kind)
        online[key] = online.get(key, 0) + worker.workers

    requests = GaugeMetricFamily(
        _WAITING_REQUESTS, _WAITING_REQUESTS_HELP, labels=["horde_model", "horde_chat"]
    )
    tokens = GaugeMetricFamily(_QUEUED_TOKENS, _QUEUED_TOKENS_HELP, labels=["horde_model", "horde_chat"])
    for (model, chat), (count, queued) in sorted(waiting.items()):
        requests.add_metric([model, _flag(chat)], count)
        tokens.add_metric([model, _flag(chat)], queued)
    workers = GaugeMetricFamily(
        _WORKERS_ONLINE, _WORKERS_ONLINE_HELP, labels=["horde_model", "horde_worker_kind"]
    )
    for (model, kind), count in sorted(online.items()):
        workers.add_metric([model, kind], count)
    return [requests, tokens, workers]


def _empty_families() -> list[Metric]:
    """Every operational family with no sample: what a scrape writes for one that has none yet."""
    return [
        CounterMetricFamily("horde_text_jobs", _JOBS_HELP),
        HistogramMetricFamily("http_server_request_duration_seconds", _HTTP_HELP),
        GaugeMetricFamily(_WAITING_REQUESTS, _WAITING_REQUESTS_HELP),
        GaugeMetricFamily(_QUEUED_TOKENS, _QUEUED_TOKENS_HELP),
        GaugeMetricFamily(_WORKERS_ONLINE, _WORKERS_ONLINE_HELP),
    ]


class _Scrape:
    """One scrape's collector: the instruments, the gauges of `snapshot` (when read), then the
    operational families still missing, with no sample."""

    def __init__(self, registry: CollectorRegistry, snapshot: OpsSnapshot | None) -> None:
        self._registry = registry
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        seen: set[str] = set()
        gauges = ops_families(self._snapshot) if self._snapshot is not None else []
        for family in [*self._registry.collect(), *gauges]:
            seen.add(family.name)
            yield family
        yield from (family for family in _empty_families() if family.name not in seen)


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
        self._operational(meter)

    def _operational(self, meter: Meter) -> None:
        """The operational instruments (the scrape-time gauges are not instruments: see
        `ops_families`)."""
        self.jobs = meter.create_counter("horde.text.jobs", unit="{job}", description=_JOBS_HELP)
        for event in JOB_EVENTS:  # every fixed label set present, at 0, from start-up
            for chat in (False, True):
                self.jobs.add(0, job_attributes(event, chat))
        self.webhook_outcomes = meter.create_counter(
            "horde.webhook.outcomes",
            unit="{delivery}",
            description="Generation webhooks, by how each ended (ok, giveup, dropped, refused).",
        )
        for outcome in WEBHOOK_OUTCOMES:  # every outcome present, at 0, from start-up
            self.webhook_outcomes.add(0, webhook_attributes(outcome))
        self.pops_waiting = meter.create_up_down_counter(
            "horde.pop.waiting", unit="{pop}", description="Pops waiting for a job now (this process)."
        )
        self.pops_waiting.add(0)
        self.pop_wakeups = meter.create_counter(
            "horde.pop.wakeups",
            unit="{wakeup}",
            description="Waiting pops woken to try again, by where the wake-up came from.",
        )
        for source in WAKE_SOURCES:
            self.pop_wakeups.add(0, wake_attributes(source))
        self.pops_woken = meter.create_counter(
            "horde.pop.woken",
            unit="{pop}",
            description="Tries of woken pops, by outcome (job: answered with a job by the wake-up).",
        )
        for outcome in WOKEN_OUTCOMES:
            self.pops_woken.add(0, woken_attributes(outcome))
        self.pops_remembered = meter.create_counter(
            "horde.pop.remembered",
            unit="{pop}",
            description="Idle pops answered again from this process's memory, without a statement.",
        )
        self.pops_remembered.add(0)
        self.http_request_duration = meter.create_histogram(
            "http.server.request.duration",
            unit="s",
            description=_HTTP_HELP,
            explicit_bucket_boundaries_advisory=HTTP_SECONDS_BUCKETS,
        )

    def job_event(self, event: JobEvent, chat: bool, jobs: int = 1) -> None:
        """Count `jobs` real jobs of one event (a pop of n jobs counts n)."""
        self.jobs.add(jobs, job_attributes(event, chat))

    def job_ended(self, outcome: str, chat: bool) -> None:
        """Count a real job's end, named as the settlement names it (completed, faulted, aborted)."""
        self.job_event(_END_EVENTS[outcome], chat)

    def webhook_ended(self, outcome: WebhookOutcome, deliveries: int = 1) -> None:
        """Count `deliveries` generation webhooks that ended with `outcome`."""
        self.webhook_outcomes.add(deliveries, webhook_attributes(outcome))

    def http_request(self, route: str | None, method: str, status: int, seconds: float) -> None:
        """Record one answered HTTP request (see `http_attributes`)."""
        self.http_request_duration.record(max(0.0, seconds), http_attributes(route, method, status))

    def render(self, snapshot: OpsSnapshot | None = None) -> tuple[bytes, str]:
        """The Prometheus text exposition of this instance's instruments, the gauges of `snapshot`
        (None: not read, so those families are written without samples), and its content type."""
        if self._shut_down:
            return b"", CONTENT_TYPE_LATEST
        return generate_latest(_Scrape(self.registry, snapshot)), CONTENT_TYPE_LATEST

    def shutdown(self) -> None:
        """Release the provider; idempotent because the SDK warns on a second shutdown."""
        if self._shut_down:
            return
        self._shut_down = True
        self._provider.shutdown()
