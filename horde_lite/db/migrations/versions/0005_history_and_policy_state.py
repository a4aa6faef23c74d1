"""history for policy comparisons (assignments, candidate records, admissions) and the shared
policy state

Revision ID: 0005_history_policy_state
Revises: 0004_queue_entries
Create Date: 2026-12-01 02:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy import Text
from sqlalchemy.dialects import postgresql

revision = "0005_history_policy_state"
down_revision = "0004_queue_entries"
branch_labels = None
depends_on = None


def _big_id() -> sa.Column:
    return sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False)


def _json(name: str) -> sa.Column:
    kind = sa.JSON(none_as_null=True).with_variant(
        postgresql.JSONB(none_as_null=True, astext_type=Text()), "postgresql"
    )
    return sa.Column(name, kind, nullable=False)


def upgrade() -> None:
    op.create_table(
        "assignment_records",
        sa.Column("generation_id", sa.String(length=36), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("request_id", sa.String(length=36), nullable=False),
        sa.Column("worker_id", sa.String(length=36), nullable=False),
        sa.Column("worker_trusted", sa.Boolean(), nullable=False),
        sa.Column("is_chat", sa.Boolean(), nullable=False),
        sa.Column("max_length", sa.Integer(), nullable=False),
        sa.Column("capacity", sa.Integer(), nullable=False),
        sa.Column("speed", sa.Float(), nullable=False),
        sa.Column("over_capacity", sa.Boolean(), nullable=False),
        sa.Column("capable_online", sa.Boolean(), nullable=True),
        sa.Column("speed_gate", sa.String(length=64), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("generation_id", name=op.f("pk_assignment_records")),
    )
    op.create_index("ix_assignment_records_at", "assignment_records", ["at"])
    op.create_table(
        "candidate_records",
        _big_id(),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("candidate", sa.String(length=64), nullable=False),
        sa.Column("in_force", sa.String(length=64), nullable=False),
        sa.Column("request_id", sa.String(length=36), nullable=True),
        sa.Column("worker_id", sa.String(length=36), nullable=True),
        sa.Column("worker_trusted", sa.Boolean(), nullable=True),
        sa.Column("is_chat", sa.Boolean(), nullable=False),
        sa.Column("max_length", sa.Integer(), nullable=False),
        sa.Column("capacity", sa.Integer(), nullable=True),
        sa.Column("capable_online", sa.Boolean(), nullable=True),
        sa.Column("decision", sa.String(length=32), nullable=False),
        sa.Column("candidate_decision", sa.String(length=32), nullable=False),
        sa.Column("allowance", sa.Integer(), nullable=True),
        sa.Column("candidate_allowance", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_candidate_records")),
    )
    op.create_index("ix_candidate_records_at", "candidate_records", ["at"])
    op.create_table(
        "admission_records",
        _big_id(),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("request_id", sa.String(length=36), nullable=True),
        sa.Column("requester_kind", sa.String(length=16), nullable=False),
        sa.Column("is_chat", sa.Boolean(), nullable=False),
        sa.Column("requested_max_length", sa.Integer(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("allowance", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("estimated_wait", sa.Float(), nullable=True),
        sa.Column("competing_jobs", sa.Integer(), nullable=False),
        sa.Column("eligible_threads", sa.Integer(), nullable=False),
        sa.Column("online_text_threads", sa.Integer(), nullable=True),
        sa.Column("queued_text_requests", sa.Integer(), nullable=True),
        sa.Column("allowance_curve", sa.String(length=64), nullable=False),
        sa.Column("slow_workers", sa.Boolean(), nullable=False),
        sa.Column("downgrade_allowed", sa.Boolean(), nullable=False),
        sa.Column("can_fund", sa.Boolean(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_admission_records")),
    )
    op.create_index("ix_admission_records_at", "admission_records", ["at"])
    op.create_table(
        "policy_state",
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        _json("options"),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("changed_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("kind", name=op.f("pk_policy_state")),
    )
    op.create_table(
        "policy_changes",
        _big_id(),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("old_name", sa.String(length=64), nullable=True),
        sa.Column("new_name", sa.String(length=64), nullable=False),
        _json("options"),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_policy_changes")),
    )
    op.create_index(op.f("ix_policy_changes_at"), "policy_changes", ["at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_policy_changes_at"), table_name="policy_changes")
    op.drop_table("policy_changes")
    op.drop_table("policy_state")
    for table in ("admission_records", "candidate_records", "assignment_records"):
        op.drop_index(f"ix_{table}_at", table_name=table)
        op.drop_table(table)
