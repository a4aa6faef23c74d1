"""The user fields PUT /users/{id} sets: contact, admin_comment, public_workers, worker_invited

Revision ID: 0023_user_fields
Revises: 0020_queue_kept_by_triggers
Create Date: 2026-12-06 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023_user_fields"
down_revision = "0022_invite_codes"
branch_labels = None
depends_on = None

COLUMNS = ("contact", "admin_comment", "public_workers", "worker_invited")


def upgrade() -> None:
    # Plain ALTER TABLE, as every column added to users: no batch copy of the table.
    op.add_column("users", sa.Column("contact", sa.String(length=500), server_default="", nullable=False))
    op.add_column(
        "users", sa.Column("admin_comment", sa.String(length=500), server_default="", nullable=False)
    )
    op.add_column(
        "users", sa.Column("public_workers", sa.Boolean(), server_default=sa.false(), nullable=False)
    )
    op.add_column("users", sa.Column("worker_invited", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    for name in reversed(COLUMNS):
        op.drop_column("users", name)
