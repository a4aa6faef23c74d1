"""The queue's entries say whether their request is plain (no chat features, image transports,
deny-list, failed workers or unnamed allow-list), and the walk index covers it: a walk can ask the
speed gate's capable-worker question of a plain entry

Revision ID: 0016_entries_plain
Revises: 0015_workers_capacity
Create Date: 2026-12-04 15:00:00.000000
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0016_entries_plain"
down_revision = "0015_workers_capacity"
branch_labels = None
depends_on = None

_WALK = ["model", "effective_start", "created_at", "request_id", "is_chat", "need_length", "need_context",
         "nsfw", "trusted_workers", "slow_workers", "target"]  # fmt: skip
_LISTS = ["required_features", "required_transports", "worker_deny", "failed_workers"]


def _empty(value: object) -> bool:
    return not (json.loads(value) if isinstance(value, str) else value)


def upgrade() -> None:
    with op.batch_alter_table("queue_entries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("plain", sa.Boolean(), nullable=False, server_default=sa.false()))
    # An existing horde's entries: plain when every list is empty and a targeted request's entries
    # name its workers (a frozen copy of queue/queue_index.py's rule as of this revision).
    bind = op.get_bind()
    columns = ", ".join(["r.id", "r.targeted", *(f"r.{c}" for c in _LISTS)])
    rows = bind.execute(
        sa.text(
            f"SELECT DISTINCT {columns}, e.target FROM text_requests r "
            "JOIN queue_entries e ON e.request_id = r.id"
        )
    ).all()
    plain = sorted(
        {row[0] for row in rows if all(_empty(v) for v in row[2:6]) and (not row[1] or row[6] != "")}
    )
    entries = sa.table("queue_entries", sa.column("request_id"), sa.column("plain"))
    for start in range(0, len(plain), 500):
        chunk = plain[start : start + 500]
        bind.execute(sa.update(entries).where(entries.c.request_id.in_(chunk)).values(plain=True))
    op.drop_index("ix_queue_entries_walk", table_name="queue_entries")
    op.create_index("ix_queue_entries_walk", "queue_entries", [*_WALK, "plain"])


def downgrade() -> None:
    op.drop_index("ix_queue_entries_walk", table_name="queue_entries")
    op.create_index("ix_queue_entries_walk", "queue_entries", _WALK)
    with op.batch_alter_table("queue_entries", schema=None) as batch_op:
        batch_op.drop_column("plain")
