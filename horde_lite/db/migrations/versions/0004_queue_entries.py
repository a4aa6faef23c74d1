"""the queue's index (queue_entries) and the full queue order on text_requests

Revision ID: 0004_queue_entries
Revises: 0003_worker_names_info
Create Date: 2026-12-01 02:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_queue_entries"
down_revision = "0003_worker_names_info"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "queue_entries",
        sa.Column("request_id", sa.String(length=36), nullable=False),
        sa.Column("model", sa.String(length=255), nullable=False),
        sa.Column("effective_start", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("is_chat", sa.Boolean(), nullable=False),
        sa.Column("need_length", sa.Integer(), nullable=False),
        sa.Column("need_context", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["request_id"],
            ["text_requests.id"],
            name=op.f("fk_queue_entries_request_id_text_requests"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("request_id", "model", name=op.f("pk_queue_entries")),
    )
    op.create_index(
        "ix_queue_entries_walk", "queue_entries",
        ["model", "effective_start", "created_at", "request_id", "is_chat", "need_length", "need_context"],
    )  # fmt: skip
    with op.batch_alter_table("text_requests", schema=None) as batch_op:
        batch_op.drop_index("ix_text_requests_queue")
        batch_op.create_index("ix_text_requests_queue", ["state", "effective_start", "created_at", "id"])
    # The waiting requests of an existing horde enter the index (a frozen copy of
    # queue/queue_index.py's entries as of this revision).
    need = (
        "r.max_length, CASE WHEN r.is_chat THEN r.prompt_tokens + r.max_length ELSE r.max_context_length END"
    )
    columns = "request_id, model, effective_start, created_at, is_chat, need_length, need_context"
    op.execute(
        f"INSERT INTO queue_entries ({columns}) SELECT r.id, m.model, r.effective_start, r.created_at, "
        f"r.is_chat, {need} FROM text_requests r JOIN request_models m ON m.request_id = r.id "
        "WHERE r.state = 'waiting'"
    )
    op.execute(
        f"INSERT INTO queue_entries ({columns}) SELECT r.id, '', r.effective_start, r.created_at, "
        f"r.is_chat, {need} FROM text_requests r WHERE r.state = 'waiting' AND r.any_model"
    )


def downgrade() -> None:
    with op.batch_alter_table("text_requests", schema=None) as batch_op:
        batch_op.drop_index("ix_text_requests_queue")
        batch_op.create_index("ix_text_requests_queue", ["state", "effective_start"])
    op.drop_index("ix_queue_entries_walk", table_name="queue_entries")
    op.drop_table("queue_entries")
