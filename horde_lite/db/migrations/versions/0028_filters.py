"""Prompt filters (upstream's `filters`): a moderator's regular expressions, one per pattern and
type (unique by the pattern's hash), screened against every request at admission

Revision ID: 0028_filters
Revises: 0027_ip_timeouts
Create Date: 2026-12-12 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028_filters"
down_revision = "0027_ip_timeouts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "filters",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("regex", sa.Text(), nullable=False),
        sa.Column("regex_hash", sa.String(length=64), nullable=False),
        sa.Column("filter_type", sa.Integer(), nullable=False),
        sa.Column("description", sa.String(length=1000), nullable=True),
        sa.Column("replacement", sa.String(length=255), server_default="", nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_filters_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_filters")),
        sa.UniqueConstraint("filter_type", "regex_hash", name=op.f("uq_filters_filter_type")),
    )
    op.create_index(op.f("ix_filters_user_id"), "filters", ["user_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_filters_user_id"), table_name="filters")
    op.drop_table("filters")
