"""Teams (upstream's): a `teams` table, names unique as compared like worker names, and each
worker's `team_id`, a foreign key without an ON DELETE action (deleting a team takes its workers
out first, in accounts/teams.py; the key refuses a dangling reference)

Revision ID: 0025_teams
Revises: 0020_queue_kept_by_triggers
Create Date: 2026-12-06 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025_teams"
down_revision = "0024_key_limits"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("name_key", sa.String(length=100), nullable=False),
        sa.Column("info", sa.String(length=1000), server_default="", nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name=op.f("fk_teams_owner_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_teams")),
        sa.UniqueConstraint("name_key", name=op.f("uq_teams_name_key")),
    )
    op.create_index(op.f("ix_teams_owner_id"), "teams", ["owner_id"])
    # A plain ADD COLUMN on both databases: a batch copy of `workers` on SQLite would drop the
    # change log's triggers. SQLite takes the foreign key only inline, in the ADD COLUMN itself.
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            "ALTER TABLE workers ADD COLUMN team_id VARCHAR(36) "
            "CONSTRAINT fk_workers_team_id_teams REFERENCES teams (id)"
        )
    else:
        op.add_column("workers", sa.Column("team_id", sa.String(length=36), nullable=True))
        op.create_foreign_key(op.f("fk_workers_team_id_teams"), "workers", "teams", ["team_id"], ["id"])
    op.create_index(op.f("ix_workers_team_id"), "workers", ["team_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_workers_team_id"), table_name="workers")
    if op.get_bind().dialect.name == "sqlite":
        # In place, with its inline foreign key (SQLite 3.35+): no batch copy, which would drop the
        # change log's triggers.
        op.execute("ALTER TABLE workers DROP COLUMN team_id")
    else:
        op.drop_constraint(op.f("fk_workers_team_id_teams"), "workers", type_="foreignkey")
        op.drop_column("workers", "team_id")
    op.drop_index(op.f("ix_teams_owner_id"), table_name="teams")
    op.drop_table("teams")
