"""generations.usage: the usage a legacy job's worker reported, as the horde keeps it

Revision ID: 0032_generation_usage
Revises: 0031_rate_counts
Create Date: 2026-12-14 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from horde_lite.db.sqltypes import JsonDoc

revision = "0032_generation_usage"
down_revision = "0031_rate_counts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTER TABLE (no batch copy on SQLite, which would drop the change log's triggers).
    op.add_column("generations", sa.Column("usage", JsonDoc, nullable=True))


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE generations DROP COLUMN usage")  # in place (SQLite 3.35+), no batch copy
    else:
        op.drop_column("generations", "usage")
