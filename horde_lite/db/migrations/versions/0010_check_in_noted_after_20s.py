"""The change log notes a worker's check-in only when it jumps by more than 20 s (5 s before), so a
polling worker's stored check-in may be written every 10 s instead of every 2.5 s

Revision ID: 0010_check_in_jump_20
Revises: 0009_change_log
Create Date: 2026-12-04 08:30:00.000000
"""

from __future__ import annotations

import importlib

from alembic import op

revision = "0010_check_in_jump_20"
down_revision = "0009_change_log"
branch_labels = None
depends_on = None

# The worker columns the trigger notes are 0009's, unchanged; only the check-in's jump moves.
_0009 = importlib.import_module("horde_lite.db.migrations.versions.0009_change_log")
CHECK_IN_JUMP = 20


def _replace_worker_trigger(jump: int) -> None:
    """Recreate the trigger that notes a changed worker, with `jump` seconds as the check-in's."""
    postgres = op.get_bind().dialect.name == "postgresql"
    distinct = "IS DISTINCT FROM" if postgres else "IS NOT"
    moved = f"NEW.last_check_in < OLD.last_check_in OR NEW.last_check_in > OLD.last_check_in + {jump}"
    changed = f"{_0009._changed(_0009.WORKER_COLUMNS, distinct)} OR {moved}"
    if postgres:
        op.execute("DROP TRIGGER workers_noted_up ON workers")
        op.execute(
            f"CREATE TRIGGER workers_noted_up AFTER UPDATE ON workers FOR EACH ROW WHEN ({changed}) "
            "EXECUTE FUNCTION horde_lite_note_change('w')"
        )
        return
    op.execute("DROP TRIGGER workers_noted_update")
    op.execute(
        f"CREATE TRIGGER workers_noted_update AFTER UPDATE ON workers FOR EACH ROW WHEN {changed} "
        "BEGIN INSERT INTO change_log (kind, ref, at) VALUES ('w', NEW.id, unixepoch()); END"
    )


def upgrade() -> None:
    _replace_worker_trigger(CHECK_IN_JUMP)


def downgrade() -> None:
    _replace_worker_trigger(_0009.CHECK_IN_JUMP)
