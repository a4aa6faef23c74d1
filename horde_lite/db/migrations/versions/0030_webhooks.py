"""text_requests.webhook and disable_batching: where a request's finished generations are POSTed,
and whether a pop takes one of its jobs at a time

Revision ID: 0030_webhooks
Revises: 0029_flagged_messages
Create Date: 2026-12-12 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0030_webhooks"
down_revision = "0029_flagged_messages"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTER TABLE: text_requests carries the queue's triggers, which a batch copy would drop.
    op.add_column("text_requests", sa.Column("webhook", sa.String(length=1024), nullable=True))
    op.add_column(
        "text_requests",
        sa.Column("disable_batching", sa.Boolean(), server_default=sa.false(), nullable=False),
    )


def downgrade() -> None:
    op.drop_column("text_requests", "disable_batching")
    op.drop_column("text_requests", "webhook")
