"""A targeted request's entries name the workers of its allow-list (one per model and worker), and
the walk index covers the name: a walk skips the requests targeted at other workers inside the
index

Revision ID: 0014_entries_name_targets
Revises: 0013_entries_carry_choices
Create Date: 2026-12-04 13:00:00.000000
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0014_entries_name_targets"
down_revision = "0013_entries_carry_choices"
branch_labels = None
depends_on = None

_WALK = ["model", "effective_start", "created_at", "request_id", "is_chat", "need_length", "need_context",
         "nsfw", "trusted_workers", "slow_workers"]  # fmt: skip
# Frozen copies of queue/queue_index.py's rule as of this revision.
_TARGET_ENTRIES = 16
_TARGET_LENGTH = 36


def _targets(allow: object, models: int) -> list[str]:
    names = sorted(set(json.loads(allow) if isinstance(allow, str) else (allow or [])))
    if not names or models * len(names) > _TARGET_ENTRIES or any(len(n) > _TARGET_LENGTH for n in names):
        return []
    return names


def upgrade() -> None:
    op.drop_index("ix_queue_entries_walk", table_name="queue_entries")
    with op.batch_alter_table("queue_entries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("target", sa.String(length=36), nullable=False, server_default=""))
        batch_op.drop_constraint("pk_queue_entries", type_="primary")
        batch_op.create_primary_key("pk_queue_entries", ["request_id", "model", "target"])
    op.create_index("ix_queue_entries_walk", "queue_entries", [*_WALK, "target"])
    # The entries of an existing horde's targeted requests name their workers: read in one
    # statement, replaced in a few (the waiting queue only, grouped by request in Python).
    bind = op.get_bind()
    entries = sa.table("queue_entries", *(sa.column(c) for c in [*_WALK, "target"]))
    requests = sa.table("text_requests", sa.column("id"), sa.column("worker_allow"), sa.column("targeted"),
                        sa.column("state"))  # fmt: skip
    found = bind.execute(
        sa.select(entries, requests.c.worker_allow)
        .join(requests, requests.c.id == entries.c.request_id)
        .where(requests.c.targeted, requests.c.state == "waiting")
    ).mappings()
    by_request: dict[str, list[dict[str, object]]] = {}
    allow_of: dict[str, object] = {}
    for row in found:
        entry = {c: row[c] for c in [*_WALK, "target"]}
        by_request.setdefault(str(row["request_id"]), []).append(entry)
        allow_of[str(row["request_id"])] = row["worker_allow"]
    named = {rid: _targets(allow_of[rid], len(rows)) for rid, rows in by_request.items()}
    replaced = [rid for rid, names in named.items() if names]
    for start in range(0, len(replaced), 500):
        bind.execute(sa.delete(entries).where(entries.c.request_id.in_(replaced[start : start + 500])))
    new = [{**row, "target": n} for rid in replaced for row in by_request[rid] for n in named[rid]]
    if new:
        bind.execute(sa.insert(entries), new)


def downgrade() -> None:
    # One entry per request and model again, as targeting none.
    op.execute(
        "DELETE FROM queue_entries WHERE target <> (SELECT MIN(q.target) FROM queue_entries q "
        "WHERE q.request_id = queue_entries.request_id AND q.model = queue_entries.model)"
    )
    op.execute("UPDATE queue_entries SET target = ''")
    op.drop_index("ix_queue_entries_walk", table_name="queue_entries")
    with op.batch_alter_table("queue_entries", schema=None) as batch_op:
        batch_op.drop_constraint("pk_queue_entries", type_="primary")
        batch_op.create_primary_key("pk_queue_entries", ["request_id", "model"])
        batch_op.drop_column("target")
    op.create_index("ix_queue_entries_walk", "queue_entries", _WALK)
