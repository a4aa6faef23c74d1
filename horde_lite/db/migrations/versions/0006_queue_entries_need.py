"""the queue's index by model and length, for a walk's probe "does any entry of this model fit"

Revision ID: 0006_queue_entries_need
Revises: 0005_history_policy_state
Create Date: 2026-12-01 08:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0006_queue_entries_need"
down_revision = "0005_history_policy_state"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_queue_entries_need", "queue_entries", ["model", "need_length"])


def downgrade() -> None:
    op.drop_index("ix_queue_entries_need", table_name="queue_entries")
