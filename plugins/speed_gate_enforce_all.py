"""enforce_all: the strict speed gate for every text job: refuse any request over the worker's capacity."""

from __future__ import annotations

import msgspec
from sqlalchemy.sql.elements import ColumnElement

from horde_lite.policies.protocols import GateInputs, GateSql


class EnforceAll(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    def admits(self, inputs: GateInputs) -> bool:
        return inputs.max_length <= inputs.capacity

    def admits_sql(self, sql: GateSql) -> ColumnElement[bool]:
        return sql.max_length <= sql.capacity
