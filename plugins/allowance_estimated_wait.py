"""estimated_wait (default): the ceiling while the estimated wait is at most
wait_full_seconds, falling linearly to the floor at wait_floor_seconds, the floor beyond that and
when no worker is eligible."""

from __future__ import annotations

import math
from typing import ClassVar

import msgspec

from horde_lite.policies.protocols import AllowanceInputs


class EstimatedWait(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    reads_horde_totals: ClassVar[bool] = False

    def allowance(self, inputs: AllowanceInputs) -> int:
        s = inputs.settings
        wait = inputs.estimated_wait_seconds
        if wait is None or wait >= s.wait_floor_seconds:
            return s.floor
        if wait <= s.wait_full_seconds:
            return s.ceiling
        fraction = (wait - s.wait_full_seconds) / (s.wait_floor_seconds - s.wait_full_seconds)
        return math.floor(s.ceiling - fraction * (s.ceiling - s.floor))
