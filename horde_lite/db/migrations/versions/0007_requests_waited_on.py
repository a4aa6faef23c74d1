"""text_requests.waited: a client of the /v1 fronts waits on the request (wake-ups cross processes)

Revision ID: 0007_requests_waited_on
Revises: 0006_queue_entries_need
Create Date: 2026-12-01 22:15:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_requests_waited_on"
down_revision = "0006_queue_entries_need"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("text_requests", schema=None) as batch_op:
        # Requests made before this column existed are taken as waited on: a NOTIFY too many wakes
        # nobody, one too few leaves a /v1 client waiting for its slow poll.
        batch_op.add_column(sa.Column("waited", sa.Boolean(), nullable=False, server_default=sa.true()))


def downgrade() -> None:
    with op.batch_alter_table("text_requests", schema=None) as batch_op:
        batch_op.drop_column("waited")
