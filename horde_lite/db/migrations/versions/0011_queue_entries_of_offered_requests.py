"""The queue's index holds only requests with a job to hand out: a request whose jobs are all out
leaves it (and comes back when one is given back)

Revision ID: 0011_entries_offered_only
Revises: 0010_check_in_jump_20
Create Date: 2026-12-04 10:30:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0011_entries_offered_only"
down_revision = "0010_check_in_jump_20"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "DELETE FROM queue_entries WHERE request_id IN (SELECT id FROM text_requests WHERE n_remaining = 0)"
    )


def downgrade() -> None:
    # Before this revision every waiting request had its entries, its jobs all out or not (a frozen
    # copy of the entries' shape as of migration 0004).
    need = (
        "r.max_length, CASE WHEN r.is_chat THEN r.prompt_tokens + r.max_length ELSE r.max_context_length END"
    )
    columns = "request_id, model, effective_start, created_at, is_chat, need_length, need_context"
    taken = "r.state = 'waiting' AND r.n_remaining = 0"
    op.execute(
        f"INSERT INTO queue_entries ({columns}) SELECT r.id, m.model, r.effective_start, r.created_at, "
        f"r.is_chat, {need} FROM text_requests r JOIN request_models m ON m.request_id = r.id "
        f"WHERE {taken} AND NOT r.any_model"
    )
    op.execute(
        f"INSERT INTO queue_entries ({columns}) SELECT r.id, '', r.effective_start, r.created_at, "
        f"r.is_chat, {need} FROM text_requests r WHERE {taken} AND r.any_model"
    )
