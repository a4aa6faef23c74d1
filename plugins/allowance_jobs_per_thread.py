"""jobs_per_thread: competing jobs per eligible thread, falling linearly from the ceiling at
`full_jobs_per_thread` to the floor at `floor_jobs_per_thread`; the floor with no eligible worker."""

from __future__ import annotations

import math
from typing import ClassVar

import msgspec

from horde_lite.policies.protocols import AllowanceInputs


class JobsPerThread(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    reads_horde_totals: ClassVar[bool] = False

    full_jobs_per_thread: float = 0.5
    floor_jobs_per_thread: float = 3.0

    def __post_init__(self) -> None:
        if self.floor_jobs_per_thread <= self.full_jobs_per_thread:
            raise ValueError("floor_jobs_per_thread must be greater than full_jobs_per_thread")

    def allowance(self, inputs: AllowanceInputs) -> int:
        s = inputs.settings
        if inputs.eligible_threads <= 0 or inputs.estimated_wait_seconds is None:
            return s.floor
        load = inputs.competing_jobs / inputs.eligible_threads
        if load <= self.full_jobs_per_thread:
            return s.ceiling
        if load >= self.floor_jobs_per_thread:
            return s.floor
        fraction = (load - self.full_jobs_per_thread) / (
            self.floor_jobs_per_thread - self.full_jobs_per_thread
        )
        return math.floor(s.ceiling - fraction * (s.ceiling - s.floor))
