"""rate_counts: the rate limits' counts, shared by every server process and host

Revision ID: 0031_rate_counts
Revises: 0030_webhooks
Create Date: 2026-12-13 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0031_rate_counts"
down_revision = "0030_webhooks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rate_counts",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("window_end", sa.Float(), nullable=False),
        sa.Column("hits", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_rate_counts")),
    )
    op.create_index(op.f("ix_rate_counts_window_end"), "rate_counts", ["window_end"])


def downgrade() -> None:
    op.drop_index(op.f("ix_rate_counts_window_end"), table_name="rate_counts")
    op.drop_table("rate_counts")
