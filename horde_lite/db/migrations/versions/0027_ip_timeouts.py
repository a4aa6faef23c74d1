"""address timeouts (`ip_timeouts`) and each worker's last address (`workers.ipaddr`)

Revision ID: 0027_ip_timeouts
Revises: 0026_horde_modes
Create Date: 2026-12-10 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027_ip_timeouts"
down_revision = "0026_horde_modes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ip_timeouts",
        sa.Column("network", sa.String(length=49), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.Integer(), nullable=True),
        sa.Column("worker_id", sa.String(length=36), nullable=True),
        sa.ForeignKeyConstraint(
            ["created_by"], ["users.id"], name=op.f("fk_ip_timeouts_created_by_users"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("network", name=op.f("pk_ip_timeouts")),
    )
    op.create_index(op.f("ix_ip_timeouts_expires_at"), "ip_timeouts", ["expires_at"])
    # A plain ADD COLUMN on both databases: a batch copy of `workers` on SQLite would drop the
    # change log's triggers (which do not read this column).
    op.add_column("workers", sa.Column("ipaddr", sa.String(length=45), nullable=True))


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE workers DROP COLUMN ipaddr")  # in place (SQLite 3.35+), no batch copy
    else:
        op.drop_column("workers", "ipaddr")
    op.drop_index(op.f("ix_ip_timeouts_expires_at"), table_name="ip_timeouts")
    op.drop_table("ip_timeouts")
