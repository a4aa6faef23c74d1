"""Flagged users and worker messages: `users.flagged` (a plain ADD COLUMN) and a `worker_messages`
table, a message to one worker or, with no worker, to every worker

Revision ID: 0029_flagged_messages
Revises: 0028_filters
Create Date: 2026-12-10 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0029_flagged_messages"
down_revision = "0028_filters"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTER TABLE, as every column added to users: no batch copy of the table.
    op.add_column("users", sa.Column("flagged", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.create_table(
        "worker_messages",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("worker_id", sa.String(length=36), nullable=True),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("origin", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["worker_id"],
            ["workers.id"],
            name=op.f("fk_worker_messages_worker_id_workers"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_worker_messages_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_worker_messages")),
    )
    op.create_index("ix_worker_messages_worker", "worker_messages", ["worker_id", "expires_at"])
    op.create_index(op.f("ix_worker_messages_user_id"), "worker_messages", ["user_id"])
    op.create_index(op.f("ix_worker_messages_expires_at"), "worker_messages", ["expires_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_worker_messages_expires_at"), table_name="worker_messages")
    op.drop_index(op.f("ix_worker_messages_user_id"), table_name="worker_messages")
    op.drop_index("ix_worker_messages_worker", table_name="worker_messages")
    op.drop_table("worker_messages")
    op.drop_column("users", "flagged")
