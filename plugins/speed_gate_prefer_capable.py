"""prefer_capable (the default, the design's chosen option): a worker is refused a chat request over
its capacity only while a capable worker for that request is online. Legacy requests pass."""

from __future__ import annotations

import msgspec
from sqlalchemy import not_, or_
from sqlalchemy.sql.elements import ColumnElement

from horde_lite.policies.protocols import GateInputs, GateSql


class PreferCapable(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    def admits(self, inputs: GateInputs) -> bool:
        if not inputs.is_chat or inputs.max_length <= inputs.capacity:
            return True
        return not inputs.capable_worker_online

    def admits_sql(self, sql: GateSql) -> ColumnElement[bool]:
        return or_(not_(sql.is_chat), sql.max_length <= sql.capacity, not_(sql.capable_worker_online()))
