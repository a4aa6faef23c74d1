"""Failures counted by owner: a request refuses, for good, every worker of an owner one of whose
workers failed it (text_requests.failed_owners, queue_owner_refusals), and each user keeps its
workers' recent failures and the end of its cool-down (users.recent_failures,
users.failure_cooldown_until)

Revision ID: 0018_failures_by_owner
Revises: 0017_queue_refusals
Create Date: 2026-12-05 10:00:00.000000
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0018_failures_by_owner"
down_revision = "0017_queue_refusals"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def _names(value: object) -> list[str]:
    listed = json.loads(value) if isinstance(value, str) else value
    return [str(v) for v in listed or ()]


def upgrade() -> None:
    # Plain ALTER TABLE (no batch copy on SQLite, which would drop the change log's triggers).
    op.add_column("text_requests", sa.Column("failed_owners", _JSON, server_default="[]", nullable=False))
    op.add_column("users", sa.Column("recent_failures", _JSON, server_default="[]", nullable=False))
    op.add_column(
        "users", sa.Column("failure_cooldown_until", sa.Float(), server_default="0", nullable=False)
    )
    refusals = op.create_table(
        "queue_owner_refusals",
        sa.Column("request_id", sa.String(length=36), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["request_id"], ["text_requests.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("request_id", "owner_id"),
    )
    # An existing horde's requests: the owners of the workers that failed them (a frozen copy of
    # jobs/settlement.py's rule as of this revision).
    bind = op.get_bind()
    rows = bind.execute(sa.text("SELECT id, failed_workers FROM text_requests WHERE failed_workers != '[]'"))
    failed = {rid: _names(workers) for rid, workers in rows}
    owners = dict(bind.execute(sa.text("SELECT id, owner_id FROM workers")).all()) if failed else {}
    requests = sa.table("text_requests", sa.column("id"), sa.column("failed_owners", _JSON))
    values = []
    for rid, workers in failed.items():
        ids = sorted({owners[w] for w in workers if w in owners})
        if ids:
            bind.execute(
                sa.update(requests).where(requests.c.id == rid).values(failed_owners=[str(i) for i in ids])
            )
            values += [{"request_id": rid, "owner_id": i} for i in ids]
    for start in range(0, len(values), 500):
        op.bulk_insert(refusals, values[start : start + 500])


def downgrade() -> None:
    op.drop_table("queue_owner_refusals")
    op.drop_column("users", "failure_cooldown_until")
    op.drop_column("users", "recent_failures")
    op.drop_column("text_requests", "failed_owners")
