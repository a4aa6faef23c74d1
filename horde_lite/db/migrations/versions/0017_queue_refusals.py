"""queue_refusals: the workers each request refuses by name (its deny-list, the workers that failed
it), so a walk skips a request that refuses the walking worker inside its statement; entries of
requests with such lists are plain (the speed gate's question reads the refusals)

Revision ID: 0017_queue_refusals
Revises: 0016_entries_plain
Create Date: 2026-12-04 17:00:00.000000
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0017_queue_refusals"
down_revision = "0016_entries_plain"
branch_labels = None
depends_on = None

_WORKER_ID = 36  # a longer name can be no worker's id


def _names(value: object) -> list[str]:
    listed = json.loads(value) if isinstance(value, str) else value
    return [str(v) for v in listed or ()]


def upgrade() -> None:
    refusals = op.create_table(
        "queue_refusals",
        sa.Column("request_id", sa.String(length=36), nullable=False),
        sa.Column("worker_id", sa.String(length=36), nullable=False),
        sa.ForeignKeyConstraint(["request_id"], ["text_requests.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("request_id", "worker_id"),
    )
    # An existing horde's requests: a frozen copy of queue/queue_index.py's rule as of this
    # revision (deny-list and failed workers, names no longer than a worker id).
    bind = op.get_bind()
    listed = (
        "SELECT id, worker_deny, failed_workers FROM text_requests "
        "WHERE worker_deny != '[]' OR failed_workers != '[]'"
    )
    rows = bind.execute(sa.text(listed)).all()
    values = [
        {"request_id": rid, "worker_id": w}
        for rid, deny, failed in rows
        for w in sorted({*_names(deny), *_names(failed)})
        if len(w) <= _WORKER_ID
    ]
    for start in range(0, len(values), 500):
        op.bulk_insert(refusals, values[start : start + 500])
    _mark_plain(bind, lists=("required_features", "required_transports"))


def _mark_plain(bind: sa.engine.Connection, lists: tuple[str, ...]) -> None:
    """The entries' `plain`: a frozen copy of queue/queue_index.py's rule as of the revision,
    whose request lists are `lists` (0016's had the deny-list and failed workers too, which from
    0017 on the walk reads from queue_refusals)."""
    columns = ", ".join(["r.id", "r.targeted", *(f"r.{c}" for c in lists)])
    rows = bind.execute(
        sa.text(
            f"SELECT DISTINCT {columns}, e.target FROM text_requests r "
            "JOIN queue_entries e ON e.request_id = r.id"
        )
    ).all()
    plain: dict[bool, set[str]] = {True: set(), False: set()}
    for row in rows:
        listed = any(_names(v) for v in row[2 : 2 + len(lists)])
        plain[not listed and (not row[1] or row[-1] != "")].add(row[0])
    entries = sa.table("queue_entries", sa.column("request_id"), sa.column("plain"))
    for value, ids in plain.items():
        chosen = sorted(ids)
        for start in range(0, len(chosen), 500):
            chunk = chosen[start : start + 500]
            bind.execute(sa.update(entries).where(entries.c.request_id.in_(chunk)).values(plain=value))


def downgrade() -> None:
    _mark_plain(
        op.get_bind(), lists=("required_features", "required_transports", "worker_deny", "failed_workers")
    )
    op.drop_table("queue_refusals")
