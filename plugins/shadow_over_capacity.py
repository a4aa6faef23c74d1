"""over_capacity (default): record every over-capacity assignment and how it ended.

Counters carry only bounded attributes (trust, size bucket, chat); the ids go to one INFO line.
"""

from __future__ import annotations

import logging

import msgspec

from horde_lite.metrics import Metrics, shadow_attributes, shadow_outcome_attributes
from horde_lite.policies.protocols import Assignment, Outcome, PopCheck

log = logging.getLogger("horde_lite.gate_shadow")


class OverCapacity(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    def on_assignment(self, metrics: Metrics, assignment: Assignment) -> None:
        if not assignment.over_capacity:
            return
        metrics.gate_shadow_assignments.add(
            1, shadow_attributes(assignment.worker_trusted, assignment.max_length, assignment.is_chat)
        )
        log.info(
            "over-capacity assignment generation=%s request=%s worker=%s "
            "max_length=%d capacity=%d speed=%.3f chat=%s",
            assignment.generation_id,
            assignment.request_id,
            assignment.worker_id,
            assignment.max_length,
            assignment.capacity,
            assignment.speed,
            assignment.is_chat,
        )

    def on_outcome(self, metrics: Metrics, outcome: Outcome) -> None:
        metrics.gate_shadow_outcomes.add(
            1,
            shadow_outcome_attributes(
                outcome.worker_trusted,
                outcome.max_length,
                outcome.is_chat,
                outcome.outcome,  # type: ignore[arg-type]
            ),
        )
        if outcome.outcome == "completed" and outcome.service_seconds is not None:
            metrics.gate_shadow_service_seconds.record(
                outcome.service_seconds,
                shadow_attributes(outcome.worker_trusted, outcome.max_length, outcome.is_chat),
            )

    def on_pop(self, metrics: Metrics, pop: PopCheck) -> None:
        declared = pop.chat_max_completion_tokens
        if declared is not None and pop.capacity < declared:
            metrics.pop_lease_capacity_limited.add(1, shadow_attributes(pop.worker_trusted, declared, True))
