"""text_requests.job_price and price_context: a request's price fixed at admission; every amount of
kudos bounded by the database (CHECK constraints on PostgreSQL, aborting triggers on SQLite)

Requests already queued are priced by the rule their holds were placed with (round(max_length x
B / 21, 2) per job, B read from the name or 7, 20 without models) plus the burn, so the jobs still
to come are charged at most what was held. Amounts already outside the bounds (a horde attacked
before this upgrade) are clamped into them first.

Revision ID: 0019_request_prices
Revises: 0018_failures_by_owner
Create Date: 2026-12-04 21:00:00.000000
"""

from __future__ import annotations

import json
import math
import re

import sqlalchemy as sa
from alembic import op

revision = "0019_request_prices"
down_revision = "0018_failures_by_owner"
branch_labels = None
depends_on = None

LIMIT = 1e12  # frozen: settings.KUDOS_LIMIT when this migration was written
MARK = "kudos_bounded"
# Frozen: db/bounds.py's BOUNDS when this migration was written.
BOUNDS = (
    ("users", "kudos", -LIMIT, LIMIT),
    ("kudos_events", "amount", -LIMIT, LIMIT),
    ("kudos_holds", "amount", 0.0, LIMIT),
    ("kudos_holds", "remaining", 0.0, LIMIT),
    ("shared_keys", "kudos", -1.0, LIMIT),
    ("shared_keys", "utilized", 0.0, LIMIT),
    ("text_requests", "kudos_spent", 0.0, LIMIT),
    ("text_requests", "job_price", 0.0, LIMIT),
    ("generations", "reward", 0.0, LIMIT),
    ("workers", "kudos_earned", 0.0, LIMIT),
)
_OLD_SIZE = re.compile(r"(?<![0-9.])(\d+(?:\.\d+)?)\s*[bB](?![a-zA-Z])")


def _old_job_price(max_length: int, models: list[str]) -> float:
    sizes = [float(f[-1]) for f in (_OLD_SIZE.findall(m.rsplit("/", 1)[-1]) for m in models) if f]
    quote = round(max_length * min(max(sizes, default=7.0), 1e5) / 21, 2) if models else 20.0
    return min(round(quote + 1, 2), LIMIT)


def _context(max_context_length: int, prompt_tokens: int, max_length: int) -> int:
    return max(1, min(max_context_length, prompt_tokens + max_length))


def upgrade() -> None:
    with op.batch_alter_table("text_requests") as batch:
        batch.add_column(sa.Column("job_price", sa.Float(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("price_context", sa.Integer(), nullable=False, server_default="1"))
    conn = op.get_bind()
    rows = conn.execute(
        sa.text(
            "SELECT id, max_length, max_context_length, prompt_tokens, is_chat, length(prompt), models "
            "FROM text_requests"
        )
    ).all()
    for rid, max_length, max_context, prompt_tokens, is_chat, prompt_chars, models in rows:
        listed = json.loads(models) if isinstance(models, str) else (models or [])
        tokens = prompt_tokens if is_chat else math.ceil((prompt_chars or 0) / 4)
        conn.execute(
            sa.text("UPDATE text_requests SET job_price = :price, price_context = :ctx WHERE id = :id"),
            {"price": _old_job_price(max_length, listed), "ctx": _context(max_context, tokens, max_length),
             "id": rid},
        )  # fmt: skip
    postgres = conn.dialect.name == "postgresql"
    for table, column, low, high in BOUNDS:
        clamp = "GREATEST(LEAST({c}, {h}), {l})" if postgres else "max(min({c}, {h}), {l})"
        op.execute(
            f"UPDATE {table} SET {column} = {clamp.format(c=column, h=high, l=low)} "
            f"WHERE NOT ({column} BETWEEN {low} AND {high})"
        )
        name = f"{MARK}_{table}_{column}"
        if postgres:
            op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({column} BETWEEN {low} AND {high})")
            continue
        for event, when in (("insert", "INSERT"), ("update", f"UPDATE OF {column}")):
            op.execute(
                f"CREATE TRIGGER {name}_{event} BEFORE {when} ON {table} "
                f"WHEN NOT (NEW.{column} BETWEEN {low} AND {high}) "
                f"BEGIN SELECT RAISE(ABORT, '{name}: {table}.{column} out of bounds'); END"
            )


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    for table, column, _low, _high in BOUNDS:
        name = f"{MARK}_{table}_{column}"
        if postgres:
            op.execute(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {name}")
        else:
            op.execute(f"DROP TRIGGER IF EXISTS {name}_insert")
            op.execute(f"DROP TRIGGER IF EXISTS {name}_update")
    # Plain DROP COLUMN (SQLite 3.35+): a batch rebuild of the table would drop its change-log triggers.
    op.execute("ALTER TABLE text_requests DROP COLUMN price_context")
    op.execute("ALTER TABLE text_requests DROP COLUMN job_price")
