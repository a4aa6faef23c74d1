"""A user's requests are indexed by user and state (by user alone before): counting a user's
waiting requests no longer reads the ones ended and kept until they expire

Revision ID: 0012_requests_user_state
Revises: 0011_entries_offered_only
Create Date: 2026-12-04 10:45:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0012_requests_user_state"
down_revision = "0011_entries_offered_only"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_text_requests_user_state", "text_requests", ["user_id", "state"])
    op.drop_index("ix_text_requests_user_id", table_name="text_requests")


def downgrade() -> None:
    op.create_index("ix_text_requests_user_id", "text_requests", ["user_id"])
    op.drop_index("ix_text_requests_user_state", table_name="text_requests")
