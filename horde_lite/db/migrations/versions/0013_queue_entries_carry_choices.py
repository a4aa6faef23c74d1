"""The queue's entries carry the request's NSFW, trusted-workers and slow-workers choices, and the
walk index covers them: a walk skips the requests a worker is refused by them inside the index

Revision ID: 0013_entries_carry_choices
Revises: 0012_requests_user_state
Create Date: 2026-12-04 11:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_entries_carry_choices"
down_revision = "0012_requests_user_state"
branch_labels = None
depends_on = None

_WALK = ["model", "effective_start", "created_at", "request_id", "is_chat", "need_length", "need_context"]
_CHOICES = {"nsfw": sa.false(), "trusted_workers": sa.false(), "slow_workers": sa.true()}


def upgrade() -> None:
    with op.batch_alter_table("queue_entries", schema=None) as batch_op:
        for name, default in _CHOICES.items():
            batch_op.add_column(sa.Column(name, sa.Boolean(), nullable=False, server_default=default))
    # The entries of an existing horde take their request's choices.
    for name in _CHOICES:
        op.execute(
            f"UPDATE queue_entries SET {name} = "
            f"(SELECT r.{name} FROM text_requests r WHERE r.id = queue_entries.request_id)"
        )
    op.drop_index("ix_queue_entries_walk", table_name="queue_entries")
    op.create_index("ix_queue_entries_walk", "queue_entries", [*_WALK, *_CHOICES])


def downgrade() -> None:
    op.drop_index("ix_queue_entries_walk", table_name="queue_entries")
    op.create_index("ix_queue_entries_walk", "queue_entries", _WALK)
    with op.batch_alter_table("queue_entries", schema=None) as batch_op:
        for name in _CHOICES:
            batch_op.drop_column(name)
