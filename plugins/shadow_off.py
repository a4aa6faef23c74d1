"""off: record nothing (the generation row still stores its over-capacity marker)."""

from __future__ import annotations

import msgspec

from horde_lite.metrics import Metrics
from horde_lite.policies.protocols import Assignment, Outcome, PopCheck


class ShadowOff(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    def on_assignment(self, metrics: Metrics, assignment: Assignment) -> None:
        return None

    def on_outcome(self, metrics: Metrics, outcome: Outcome) -> None:
        return None

    def on_pop(self, metrics: Metrics, pop: PopCheck) -> None:
        return None
