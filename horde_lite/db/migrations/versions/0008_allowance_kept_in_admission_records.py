"""text_requests loses free_allowance and allowance_outcome: admission_records keeps them

Revision ID: 0008_allowance_in_records
Revises: 0007_requests_waited_on
Create Date: 2026-12-02 05:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_allowance_in_records"
down_revision = "0007_requests_waited_on"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Every admitted request has its admission record (allowance and outcome, beside what the
    # decision read); the request's copies were written by a second statement at every creation
    # and read by nothing.
    with op.batch_alter_table("text_requests", schema=None) as batch_op:
        batch_op.drop_column("free_allowance")
        batch_op.drop_column("allowance_outcome")


def downgrade() -> None:
    with op.batch_alter_table("text_requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("free_allowance", sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column("allowance_outcome", sa.String(length=16), nullable=False, server_default="free")
        )
    # Copied back from the records, where one exists (a request admitted before records were kept
    # stays "free" with no allowance, as the column's default said then).
    record = "FROM admission_records a WHERE a.request_id = text_requests.id"
    op.execute(
        f"UPDATE text_requests SET free_allowance = (SELECT max(a.allowance) {record}),"
        f" allowance_outcome = COALESCE((SELECT max(a.outcome) {record}), allowance_outcome)"
    )
