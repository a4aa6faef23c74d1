"""worker name keys, info and deletion

Revision ID: 0003_worker_names_info
Revises: 0002_failed_workers_key_holds
Create Date: 2026-12-01 11:00:00.000000
"""

from __future__ import annotations

import unicodedata

import sqlalchemy as sa
from alembic import op

revision = "0003_worker_names_info"
down_revision = "0002_failed_workers_key_holds"
branch_labels = None
depends_on = None


def _name_key(name: str) -> str:
    """A frozen copy of accounts/workers.py's worker_name_key as of this revision."""
    spaced = " ".join(unicodedata.normalize("NFKC", name).split())
    return unicodedata.normalize("NFKC", spaced.casefold())[:100]


def upgrade() -> None:
    with op.batch_alter_table("workers", schema=None) as batch_op:
        # Names are unique by their key now (a deleted worker keeps its name for the history).
        batch_op.drop_constraint("uq_workers_name", type_="unique")
        batch_op.add_column(sa.Column("name_key", sa.String(length=100), nullable=True))
        batch_op.add_column(sa.Column("info", sa.String(length=1000), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("deleted_at", sa.Float(), nullable=True))
    # Existing workers: the oldest holder of a key keeps it; a later one that collides (same name up
    # to case or Unicode form) is left without a key, so its name's next pop is the older worker's.
    workers = sa.table(
        "workers", sa.column("id", sa.String), sa.column("name", sa.String),
        sa.column("created_at", sa.Float), sa.column("name_key", sa.String),
    )  # fmt: skip
    conn = op.get_bind()
    taken: set[str] = set()
    for worker_id, name in conn.execute(
        sa.select(workers.c.id, workers.c.name).order_by(workers.c.created_at)
    ):
        key = _name_key(name)
        if key and key not in taken:
            taken.add(key)
            conn.execute(workers.update().where(workers.c.id == worker_id).values(name_key=key))
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.create_unique_constraint(batch_op.f("uq_workers_name_key"), ["name_key"])


def downgrade() -> None:
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_workers_name_key"), type_="unique")
        batch_op.drop_column("deleted_at")
        batch_op.drop_column("info")
        batch_op.drop_column("name_key")
        batch_op.create_unique_constraint("uq_workers_name", ["name"])
