"""workers indexed by capacity (and check-in time): the speed gate's capable-worker question seeks
the workers of enough capacity instead of reading every online worker

Revision ID: 0015_workers_capacity
Revises: 0014_entries_name_targets
Create Date: 2026-12-04 14:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0015_workers_capacity"
down_revision = "0014_entries_name_targets"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_workers_capacity", "workers", ["capacity", "last_check_in"])


def downgrade() -> None:
    op.drop_index("ix_workers_capacity", table_name="workers")
