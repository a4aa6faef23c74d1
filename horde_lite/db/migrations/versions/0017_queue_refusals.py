"""queue_refusals: the workers each request refuses by name (its deny-list, the workers that failed
it), so a walk skips a request that refuses the walking worker inside its statement

Revision ID: 0017_queue_refusals
Revises: 0016_entries_plain
Create Date: 2026-12-04 17:00:00.000000
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0017_queue_refusals"
down_revision = "0016_entries_plain"
branch_labels = None
depends_on = None

_WORKER_ID = 36  # a longer name can be no worker's id


def _names(value: object) -> list[str]:
    listed = json.loads(value) if isinstance(value, str) else value
    return [str(v) for v in listed or ()]


def upgrade() -> None:
    refusals = op.create_table(
        "queue_refusals",
        sa.Column("request_id", sa.String(length=36), nullable=False),
        sa.Column("worker_id", sa.String(length=36), nullable=False),
        sa.ForeignKeyConstraint(["request_id"], ["text_requests.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("request_id", "worker_id"),
    )
    # An existing horde's requests: a frozen copy of lifecycle/queue_index.py's rule as of this
    # revision (deny-list and failed workers, names no longer than a worker id).
    bind = op.get_bind()
    listed = (
        "SELECT id, worker_deny, failed_workers FROM text_requests "
        "WHERE worker_deny != '[]' OR failed_workers != '[]'"
    )
    rows = bind.execute(sa.text(listed)).all()
    values = [
        {"request_id": rid, "worker_id": w}
        for rid, deny, failed in rows
        for w in sorted({*_names(deny), *_names(failed)})
        if len(w) <= _WORKER_ID
    ]
    for start in range(0, len(values), 500):
        op.bulk_insert(refusals, values[start : start + 500])


def downgrade() -> None:
    op.drop_table("queue_refusals")
