"""off: no offer rule depends on measured speed."""

from __future__ import annotations

import msgspec
from sqlalchemy import true
from sqlalchemy.sql.elements import ColumnElement

from horde_lite.policies.protocols import GateInputs, GateSql


class GateOff(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    def admits(self, inputs: GateInputs) -> bool:
        return True

    def admits_sql(self, sql: GateSql) -> ColumnElement[bool]:
        return true()
