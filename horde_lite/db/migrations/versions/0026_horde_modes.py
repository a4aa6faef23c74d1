"""the horde's modes (maintenance, worker invite-only, raid): `horde_modes`, one row with a version,
and `horde_mode_changes`, the log of switches

Revision ID: 0026_horde_modes
Revises: 0025_teams
Create Date: 2026-12-10 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026_horde_modes"
down_revision = "0025_teams"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "horde_modes",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("maintenance", sa.Boolean(), nullable=False),
        sa.Column("invite_only", sa.Boolean(), nullable=False),
        sa.Column("raid", sa.Boolean(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("changed_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_horde_modes")),
    )
    op.create_table(
        "horde_mode_changes",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("changed_by", sa.String(length=120), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_horde_mode_changes")),
    )
    op.create_index(op.f("ix_horde_mode_changes_at"), "horde_mode_changes", ["at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_horde_mode_changes_at"), table_name="horde_mode_changes")
    op.drop_table("horde_mode_changes")
    op.drop_table("horde_modes")
