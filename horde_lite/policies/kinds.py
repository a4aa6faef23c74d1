"""The policy kinds, named once.

Each value is written by operators and kept in the database: the `[policies]` keys of
litestar.toml and their environment variables, the entry-point groups (`horde_lite.<kind>`), the
`kind` column of policy_state, policy_changes and candidate_records. Never change a value. This
module imports nothing of horde_lite, so the settings can use it too.
"""

from __future__ import annotations

from enum import StrEnum


class PolicyKind(StrEnum):
    SPEED_GATE = "speed_gate"
    ALLOWANCE_CURVE = "allowance_curve"
    SHADOW_METRICS = "shadow_metrics"


# A candidate setting of [policies] and the kind of policy it names: judged in shadow beside the one
# in force, never applied. Its table has the same shape as its kind's ([policies.<setting>]).
CANDIDATES: dict[str, PolicyKind] = {
    "candidate_speed_gate": PolicyKind.SPEED_GATE,
    "candidate_allowance_curve": PolicyKind.ALLOWANCE_CURVE,
}
