"""change_log: the database's triggers note every change to a waiting request or a worker that the
wait estimate reads, so each process's copy of the queue and the fleet catches up with a short read

Revision ID: 0009_change_log
Revises: 0008_allowance_in_records
Create Date: 2026-12-03 08:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_change_log"
down_revision = "0008_allowance_in_records"
branch_labels = None
depends_on = None

# A frozen copy, as of this revision, of what horde_lite/db/change_log.py describes: the columns
# whose change a trigger notes. A worker's check-in is noted only when it moves back or jumps
# forward by more than CHECK_IN_JUMP seconds (a worker coming back online); the readers re-read the
# check-in of a worker they would otherwise take for offline.
REQUEST_COLUMNS = (
    "state", "n_remaining", "expires_at", "effective_start", "created_at", "user_id", "is_chat",
    "max_length", "max_context_length", "prompt_tokens", "models", "any_model", "required_features",
    "required_transports", "targeted", "worker_allow", "worker_deny", "trusted_workers",
    "slow_workers", "nsfw", "failed_workers",
)  # fmt: skip
WORKER_COLUMNS = (
    "owner_id", "deleted_at", "trusted", "models", "max_length", "max_context_length", "threads",
    "nsfw", "chat_max_completion_tokens", "chat_max_context_tokens", "chat_features",
    "chat_image_transports", "maintenance", "paused", "lease_speed", "capacity",
)  # fmt: skip
CHECK_IN_JUMP = 5


def _changed(columns: tuple[str, ...], distinct: str) -> str:
    return " OR ".join(f"NEW.{c} {distinct} OLD.{c}" for c in columns)


def _worker_changed(distinct: str) -> str:
    jump = f"NEW.last_check_in < OLD.last_check_in OR NEW.last_check_in > OLD.last_check_in + {CHECK_IN_JUMP}"
    return f"{_changed(WORKER_COLUMNS, distinct)} OR {jump}"


def upgrade() -> None:
    op.create_table(
        "change_log",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("kind", sa.String(length=1), nullable=False),  # r: a request, w: a worker
        sa.Column("ref", sa.String(length=36), nullable=False),
        sa.Column("xid", sa.BigInteger(), nullable=True),  # PostgreSQL: the writing transaction
        sa.Column("at", sa.Float(), nullable=False),  # wall-clock seconds, for pruning
        sa.PrimaryKeyConstraint("id", name=op.f("pk_change_log")),
        sqlite_autoincrement=True,  # ids never reused, even after pruning took the newest
    )
    op.create_index("ix_change_log_at", "change_log", ["at"])
    if op.get_bind().dialect.name == "postgresql":
        op.create_index("ix_change_log_xid", "change_log", ["xid"])
        op.execute(
            """
            CREATE FUNCTION horde_lite_note_change() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO change_log (kind, ref, xid, at) VALUES (
                    TG_ARGV[0],
                    CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END,
                    pg_current_xact_id()::text::bigint,
                    extract(epoch FROM clock_timestamp())
                );
                RETURN NULL;
            END $$
            """
        )
        for table, kind, changed in (
            ("text_requests", "r", _changed(REQUEST_COLUMNS, "IS DISTINCT FROM")),
            ("workers", "w", _worker_changed("IS DISTINCT FROM")),
        ):
            call = f"EXECUTE FUNCTION horde_lite_note_change('{kind}')"
            row = "FOR EACH ROW"
            op.execute(f"CREATE TRIGGER {table}_noted_in AFTER INSERT OR DELETE ON {table} {row} {call}")
            when = f"WHEN ({changed})"
            op.execute(f"CREATE TRIGGER {table}_noted_up AFTER UPDATE ON {table} {row} {when} {call}")
        return
    for table, kind, changed in (
        ("text_requests", "r", _changed(REQUEST_COLUMNS, "IS NOT")),
        ("workers", "w", _worker_changed("IS NOT")),
    ):
        note = "INSERT INTO change_log (kind, ref, at) VALUES ('{kind}', {row}.id, unixepoch())"
        for event, row, when in (("INSERT", "NEW", ""), ("DELETE", "OLD", ""), ("UPDATE", "NEW", changed)):
            condition = f"WHEN {when} " if when else ""
            insert = note.format(kind=kind, row=row)
            op.execute(
                f"CREATE TRIGGER {table}_noted_{event.lower()} AFTER {event} ON {table} "
                f"FOR EACH ROW {condition}BEGIN {insert}; END"
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in ("text_requests", "workers"):
            op.execute(f"DROP TRIGGER IF EXISTS {table}_noted_in ON {table}")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_noted_up ON {table}")
        op.execute("DROP FUNCTION IF EXISTS horde_lite_note_change()")
        op.drop_index("ix_change_log_xid", table_name="change_log")
    else:
        for table in ("text_requests", "workers"):
            for event in ("insert", "delete", "update"):
                op.execute(f"DROP TRIGGER IF EXISTS {table}_noted_{event}")
    op.drop_index("ix_change_log_at", table_name="change_log")
    op.drop_table("change_log")
