"""The policies' recent decisions, one by one, for moderators (`GET /operator/decisions`): the
admission records (the allowance curve's decisions, refusals included) and the assignment records
(each job handed out, with the speed gate in force and, over capacity, the shadow facts). The same
tables the dashboard aggregates; here in order of time so a watcher can follow them live."""

from __future__ import annotations

import msgspec
from sqlalchemy import bindparam, select

from horde_lite.core.context import Horde
from horde_lite.db.models import AdmissionRecord, AssignmentRecord, Worker

# At most this many of each kind per call: a watcher that fell behind asks again from the last one.
DECISIONS_LIMIT = 200


class Admission(msgspec.Struct, frozen=True, kw_only=True):
    at: float
    outcome: str  # free, funded, downgraded, refused
    requester_kind: str
    is_chat: bool
    asked: int  # the max_length admission judged (per job), n jobs
    n: int
    allowance: int
    estimated_wait: float | None  # None: no eligible worker
    allowance_curve: str


class Assignment(msgspec.Struct, frozen=True, kw_only=True):
    at: float
    worker_id: str
    worker_name: str
    is_chat: bool
    max_length: int
    capacity: int
    over_capacity: bool
    capable_online: bool | None  # asked only over capacity
    speed_gate: str
    outcome: str | None  # None while running


_ADMISSIONS = (
    select(AdmissionRecord)
    .where(AdmissionRecord.at > bindparam("after"))
    .order_by(AdmissionRecord.at, AdmissionRecord.id)
    .limit(DECISIONS_LIMIT)
)
_ASSIGNMENTS = (
    select(AssignmentRecord, Worker.name)
    .outerjoin(Worker, Worker.id == AssignmentRecord.worker_id)
    .where(AssignmentRecord.at > bindparam("after"))
    .order_by(AssignmentRecord.at, AssignmentRecord.generation_id)
    .limit(DECISIONS_LIMIT)
)


async def recent(horde: Horde, after: float) -> tuple[list[Admission], list[Assignment]]:
    """The decisions recorded after `after` (epoch seconds), oldest first."""
    async with horde.reading() as session:
        admissions = (await session.execute(_ADMISSIONS, {"after": after})).scalars().all()
        assignments = (await session.execute(_ASSIGNMENTS, {"after": after})).all()
    return (
        [
            Admission(
                at=a.at,
                outcome=a.outcome,
                requester_kind=a.requester_kind,
                is_chat=a.is_chat,
                asked=a.requested_max_length,
                n=a.n,
                allowance=a.allowance,
                estimated_wait=a.estimated_wait,
                allowance_curve=a.allowance_curve,
            )
            for a in admissions
        ],
        [
            Assignment(
                at=r.at,
                worker_id=r.worker_id,
                worker_name=name or "",
                is_chat=r.is_chat,
                max_length=r.max_length,
                capacity=r.capacity,
                over_capacity=r.over_capacity,
                capable_online=r.capable_online,
                speed_gate=r.speed_gate,
                outcome=r.outcome,
            )
            for r, name in assignments
        ],
    )
