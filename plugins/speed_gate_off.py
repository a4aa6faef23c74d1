"""off: no offer rule depends on measured speed."""

from __future__ import annotations

import msgspec
from sqlalchemy import true
from sqlalchemy.sql.elements import ColumnElement

from horde_lite.policies.protocols import GateInputs, GateSql


class GateOff(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    capable_monotone = True  # see SpeedGate

    def can_generate_with_eligibility_inputs(self, inputs: GateInputs) -> bool:
        return True

    def text_wp_speed_gate_clause(self, sql: GateSql) -> ColumnElement[bool]:
        return true()
