"""Scopes and limits of shared keys and users: a model allow-list, concurrency, requests per minute,
output tokens per day and a monthly refill (users.*, shared_keys.*), and limit_admissions, what the
rate and daily limits count

Revision ID: 0024_key_limits
Revises: 0020_queue_kept_by_triggers
Create Date: 2026-12-06 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0024_key_limits"
down_revision = "0023_user_fields"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    # Plain ALTER TABLE (no batch copy on SQLite, which would drop the change log's triggers).
    op.add_column("users", sa.Column("allowed_models", _JSON, server_default="[]", nullable=False))
    op.add_column("users", sa.Column("concurrency", sa.Integer(), nullable=True))
    op.add_column("users", sa.Column("requests_per_minute", sa.Integer(), nullable=True))
    op.add_column("users", sa.Column("tokens_per_day", sa.Integer(), nullable=True))
    op.add_column("users", sa.Column("monthly_kudos", sa.Integer(), server_default="0", nullable=False))
    op.add_column("users", sa.Column("monthly_kudos_last_received", sa.Float(), nullable=True))
    op.add_column("shared_keys", sa.Column("allowed_models", _JSON, server_default="[]", nullable=False))
    for name in ("concurrency", "requests_per_minute", "tokens_per_day"):
        op.add_column("shared_keys", sa.Column(name, sa.Integer(), server_default="-1", nullable=False))
    op.add_column("shared_keys", sa.Column("monthly_kudos", sa.Float(), server_default="-1", nullable=False))
    op.add_column("shared_keys", sa.Column("refilled_at", sa.Float(), server_default="0", nullable=False))
    op.create_table(
        "limit_admissions",
        sa.Column("request_id", sa.String(36), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("shared_key_hash", sa.String(64), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name="fk_limit_admissions_user_id_users", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("request_id", name="pk_limit_admissions"),
    )
    op.create_index("ix_limit_admissions_user", "limit_admissions", ["user_id", "created_at"])
    op.create_index("ix_limit_admissions_key", "limit_admissions", ["shared_key_hash", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_limit_admissions_key", table_name="limit_admissions")
    op.drop_index("ix_limit_admissions_user", table_name="limit_admissions")
    op.drop_table("limit_admissions")
    for name in ("refilled_at", "monthly_kudos", "tokens_per_day", "requests_per_minute", "concurrency",
                 "allowed_models"):  # fmt: skip
        op.drop_column("shared_keys", name)
    for name in ("monthly_kudos_last_received", "monthly_kudos", "tokens_per_day", "requests_per_minute",
                 "concurrency", "allowed_models"):  # fmt: skip
        op.drop_column("users", name)
