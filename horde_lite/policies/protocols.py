"""What a policy plugin supplies. A policy class may be a frozen msgspec Struct whose fields are
its options: `[policies.<kind>.options]` in litestar.toml is converted into it, so a wrong option
names the exact key at start-up."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from sqlalchemy.sql.elements import ColumnElement

from horde_lite.metrics import Metrics
from horde_lite.policies.kinds import PolicyKind
from horde_lite.settings import AllowanceSettings

# --- speed gate --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GateInputs:
    """What the gate decides on for one (worker, request) pair, in Python."""

    is_chat: bool
    max_length: int
    capacity: int
    capable_worker_online: bool


@dataclass(frozen=True, slots=True)
class GateSql:
    """The same inputs as SQL expressions, inside a query over a worker and a request row.

    `capable_worker_online()` builds the correlated EXISTS over capable workers for the request;
    a policy that does not call it adds no subquery to the pop.
    """

    is_chat: ColumnElement[bool]
    max_length: ColumnElement[int]
    capacity: ColumnElement[int]
    capable_worker_online: Callable[[], ColumnElement[bool]]


@runtime_checkable
class SpeedGate(Protocol):
    """One offer rule written twice: `admits` in Python, `admits_sql` as a WHERE clause. The contract
    test (horde_lite.testing.speed_gate_contract) proves they agree on SQLite and PostgreSQL.

    That is all a gate writes. The pop's walk asks `admits_sql` of the queue's entries too: where
    an entry cannot tell whether a capable worker is online, it admits what the gate admits under
    either answer, so the walk never skips an entry the claim would take, whatever the gate."""

    def admits(self, inputs: GateInputs) -> bool: ...

    def admits_sql(self, sql: GateSql) -> ColumnElement[bool]: ...


# The speed gate's former names, upstream's jargon: a gate still using one is refused at start-up
# with the new name rather than with a bare "not a speed_gate policy". (A former class attribute,
# `capable_monotone`, is no longer read: a gate that sets it loads as any other.)
SPEED_GATE_RENAMED = {
    "can_generate_with_eligibility_inputs": "admits",
    "text_wp_speed_gate_clause": "admits_sql",
}


# --- allowance curve ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AllowanceInputs:
    """What a curve may read, measured once when the request is created."""

    estimated_wait_seconds: float | None  # None: no eligible worker
    competing_jobs: int  # jobs ahead that the request's eligible workers could take
    eligible_threads: int
    online_text_threads: int  # horde-wide
    queued_text_requests: int  # horde-wide
    settings: AllowanceSettings


@runtime_checkable
class AllowanceCurve(Protocol):
    """A curve may set a class attribute `reads_horde_totals = False` when it ignores
    `online_text_threads` and `queued_text_requests`: admission then skips counting them."""

    def allowance(self, inputs: AllowanceInputs) -> int: ...


# --- shadow metrics ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Assignment:
    generation_id: str
    request_id: str
    worker_id: str
    worker_trusted: bool
    is_chat: bool
    max_length: int
    capacity: int
    speed: float
    over_capacity: bool


@dataclass(frozen=True, slots=True)
class Outcome:
    """The end of a job that was over capacity at assignment."""

    generation_id: str
    worker_trusted: bool
    is_chat: bool
    max_length: int
    outcome: str  # completed | faulted | aborted
    service_seconds: float | None  # pop to submit, for completed jobs


@dataclass(frozen=True, slots=True)
class PopCheck:
    worker_id: str
    worker_trusted: bool
    capacity: int
    chat_max_completion_tokens: int | None


@runtime_checkable
class ShadowMetrics(Protocol):
    def on_assignment(self, metrics: Metrics, assignment: Assignment) -> None: ...

    def on_outcome(self, metrics: Metrics, outcome: Outcome) -> None: ...

    def on_pop(self, metrics: Metrics, pop: PopCheck) -> None: ...


PROTOCOLS: dict[PolicyKind, type[Any]] = {
    PolicyKind.SPEED_GATE: SpeedGate,
    PolicyKind.ALLOWANCE_CURVE: AllowanceCurve,
    PolicyKind.SHADOW_METRICS: ShadowMetrics,
}
