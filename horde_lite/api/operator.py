"""GET /operator/policies: the policy in force per kind (the database's) and what this process
applies; GET /operator/decisions: the policies' recent decisions one by one (what `horde-lite demo`
explains). For operators and their dashboards (docs/reference/operators.md).

A moderator's own key in the `apikey` header, or nobody's with `[http] open_operator_pages`
(`moderator_guard`)."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import get
from litestar.params import FromQuery

from horde_lite.api.deps import HordeDep
from horde_lite.api.guards import moderator_guard
from horde_lite.operators import decisions, policy_state


class OperatorPolicy(msgspec.Struct, kw_only=True):
    name: str | None  # the database's policy in force; None before any process seeded it
    options: dict[str, Any]
    version: int
    changed_at: float | None
    applied_name: str  # what this process runs
    applied_options: dict[str, Any]
    applied_version: int  # 0: the settings' policy, not matched with the database yet
    in_sync: bool  # applied_version == version
    pid: int


class OperatorPolicies(msgspec.Struct, kw_only=True):
    pid: int
    reload_seconds: float
    policies: dict[str, OperatorPolicy]  # by kind: speed_gate, allowance_curve, shadow_metrics


@get(
    "/operator/policies",
    tags=["operator"],
    summary="The policies in force and this process's",
    guards=[moderator_guard],
)
async def operator_policies(horde: HordeDep) -> OperatorPolicies:
    view = await policy_state.policies_view(horde)
    return OperatorPolicies(
        pid=view.pid,
        reload_seconds=view.reload_seconds,
        policies={
            k.kind: OperatorPolicy(
                name=k.name,
                options=k.options,
                version=k.version,
                changed_at=k.changed_at,
                applied_name=k.applied_name,
                applied_options=k.applied_options,
                applied_version=k.applied_version,
                in_sync=k.in_sync,
                pid=view.pid,
            )
            for k in view.kinds
        },
    )


class OperatorDecisions(msgspec.Struct, kw_only=True):
    admissions: list[decisions.Admission]  # oldest first, at most DECISIONS_LIMIT
    assignments: list[decisions.Assignment]


@get(
    "/operator/decisions",
    tags=["operator"],
    summary="The policies' decisions recorded after a time",
    guards=[moderator_guard],
)
async def operator_decisions(horde: HordeDep, after: FromQuery[float] = 0.0) -> OperatorDecisions:
    admissions, assignments = await decisions.recent(horde, after)
    return OperatorDecisions(admissions=admissions, assignments=assignments)


ROUTES = [operator_policies, operator_decisions]
