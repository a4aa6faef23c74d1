"""horde_queue: the previous rule, from horde-wide totals: 512 + 5 per online text thread - 0.9 per
queued text request, clamped to [minimum, maximum] (256..512)."""

from __future__ import annotations

import math

import msgspec

from horde_lite.policies.protocols import AllowanceInputs


class HordeQueue(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    base: int = 512
    per_thread: float = 5
    per_queued: float = 0.9
    minimum: int = 256
    maximum: int = 512

    def allowance(self, inputs: AllowanceInputs) -> int:
        raw = (
            self.base
            + self.per_thread * inputs.online_text_threads
            - self.per_queued * inputs.queued_text_requests
        )
        return int(min(max(math.floor(raw), self.minimum), self.maximum))
