"""enforce_chat: refuse chat requests over the worker's capacity even when no capable worker is
online; legacy requests pass (and are shadow-recorded like any over-capacity assignment)."""

from __future__ import annotations

import msgspec
from sqlalchemy import not_, or_
from sqlalchemy.sql.elements import ColumnElement

from horde_lite.policies.protocols import GateInputs, GateSql


class EnforceChat(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    def admits(self, inputs: GateInputs) -> bool:
        return not inputs.is_chat or inputs.max_length <= inputs.capacity

    def admits_sql(self, sql: GateSql) -> ColumnElement[bool]:
        return or_(not_(sql.is_chat), sql.max_length <= sql.capacity)
