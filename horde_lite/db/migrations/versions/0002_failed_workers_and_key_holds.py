"""failed workers per request; holds that reserve a shared key's budget

Revision ID: 0002_failed_workers_key_holds
Revises: 6095a442435e
Create Date: 2026-12-01 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy import Text
from sqlalchemy.dialects import postgresql

revision = "0002_failed_workers_key_holds"
down_revision = "6095a442435e"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("text_requests", schema=None) as batch_op:
        # The workers whose job of this request lapsed or faulted: never offered it again.
        batch_op.add_column(
            sa.Column(
                "failed_workers",
                sa.JSON().with_variant(postgresql.JSONB(astext_type=Text()), "postgresql"),
                nullable=False,
                server_default="[]",
            )
        )
    with op.batch_alter_table("kudos_holds", schema=None) as batch_op:
        # A hold of a request made through a shared key also reserves that key's budget; a free
        # request's hold reserves only the key's budget, not its owner's kudos.
        batch_op.add_column(sa.Column("shared_key_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(
            sa.Column("reserves_user", sa.Boolean(), nullable=False, server_default=sa.true())
        )
        batch_op.create_index(batch_op.f("ix_kudos_holds_shared_key_hash"), ["shared_key_hash"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("kudos_holds", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_kudos_holds_shared_key_hash"))
        batch_op.drop_column("reserves_user")
        batch_op.drop_column("shared_key_hash")
    with op.batch_alter_table("text_requests", schema=None) as batch_op:
        batch_op.drop_column("failed_workers")
