"""usage_records: durable usage per clock hour, requester, worker, model and shared key, written with
each settlement and kept after requests expire

Revision ID: 0021_usage_history
Revises: 0020_queue_kept_by_triggers
Create Date: 2026-12-05 02:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021_usage_history"
down_revision = "0020_queue_kept_by_triggers"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usage_records",
        sa.Column("hour", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("user_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("worker_id", sa.String(length=36), nullable=False),
        sa.Column("model", sa.String(length=255), nullable=False),
        sa.Column("shared_key_hash", sa.String(length=64), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("kudos_spent", sa.Float(), nullable=False),
        sa.Column("kudos_earned", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint(
            "hour", "user_id", "worker_id", "model", "shared_key_hash", name=op.f("pk_usage_records")
        ),
    )
    op.create_index("ix_usage_records_user", "usage_records", ["user_id", "hour"])
    op.create_index("ix_usage_records_owner", "usage_records", ["owner_id", "hour"])
    op.create_index("ix_usage_records_worker", "usage_records", ["worker_id", "hour"])


def downgrade() -> None:
    op.drop_table("usage_records")
