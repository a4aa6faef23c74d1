"""The queue's index (queue_entries, queue_refusals, queue_owner_refusals) is kept by the database's
triggers on text_requests, as the change log is: no code path can forget it. The change log's
request trigger also notes a change of failed_owners, which the wait estimate reads.

Revision ID: 0020_queue_kept_by_triggers
Revises: 0019_request_prices
Create Date: 2026-12-04 23:40:00.000000
"""

from __future__ import annotations

import importlib

from alembic import op

revision = "0020_queue_kept_by_triggers"
down_revision = "0019_request_prices"
branch_labels = None
depends_on = None

_0009 = importlib.import_module("horde_lite.db.migrations.versions.0009_change_log")

# Frozen copies, as of this revision, of what the code declares: the request columns the wait
# estimate's copy reads (its change log's), and those a request's entries are made of.
NOTED = (*_0009.REQUEST_COLUMNS, "failed_owners")
SOURCE = (
    "effective_start", "created_at", "is_chat", "max_length", "max_context_length", "prompt_tokens",
    "nsfw", "trusted_workers", "slow_workers", "any_model", "models", "targeted", "worker_allow",
    "required_features", "required_transports",
)  # fmt: skip
REFUSED = ("worker_deny", "failed_workers", "failed_owners")
TARGET_ENTRIES = 16  # at most this many entries name workers; past it, one names none
TARGET_LENGTH = 36  # a worker id's length: a longer name can name no worker

ENTRY_COLUMNS = (
    "request_id, model, target, effective_start, created_at, is_chat, need_length, need_context, "
    "nsfw, trusted_workers, slow_workers, plain"
)


def _open(row: str) -> str:
    """The row has a job to hand out: only such requests have entries."""
    return f"({row}.state = 'waiting' AND {row}.n_remaining > 0)"


def _entries_change(distinct: str) -> str:
    """An update after which the row's entries differ: it gains or loses a job to hand out, or a
    column its entries are made of changes while it has one."""
    source = " OR ".join(f"NEW.{c} {distinct} OLD.{c}" for c in SOURCE)
    return f"({_open('OLD')} {distinct} {_open('NEW')} OR ({_open('NEW')} AND ({source})))"


def _lists_change(distinct: str) -> str:
    """An update of a list the row's refusals are written from."""
    return "(" + " OR ".join(f"NEW.{c} {distinct} OLD.{c}" for c in REFUSED) + ")"


def _when_update(distinct: str) -> str:
    """An update that changes what the index holds for the row."""
    return f"{_entries_change(distinct)} OR {_lists_change(distinct)}"


# --- PostgreSQL: one function, called only when the WHEN clause says the index changes ----------

_PG_FUNCTION = f"""
CREATE FUNCTION horde_lite_keep_queue() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    models text[];
    allow text[];
    named text[];
    lists boolean := true;  -- an insert writes both; an update, what it changed
    entries boolean := true;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        lists := {_lists_change("IS DISTINCT FROM")};
        entries := {_entries_change("IS DISTINCT FROM")};
    END IF;
    IF lists THEN
        INSERT INTO queue_refusals (request_id, worker_id)
            SELECT DISTINCT NEW.id, w FROM jsonb_array_elements_text(
                coalesce(NEW.worker_deny, '[]'::jsonb) || coalesce(NEW.failed_workers, '[]'::jsonb)
            ) AS w
            WHERE length(w) <= {TARGET_LENGTH}
            ON CONFLICT DO NOTHING;
        INSERT INTO queue_owner_refusals (request_id, owner_id)
            SELECT DISTINCT NEW.id, o::integer
            FROM jsonb_array_elements_text(coalesce(NEW.failed_owners, '[]'::jsonb)) AS o
            ON CONFLICT DO NOTHING;
    END IF;
    IF NOT entries THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        DELETE FROM queue_entries WHERE request_id = NEW.id;
    END IF;
    IF NOT {_open("NEW")} THEN
        RETURN NULL;
    END IF;
    IF NEW.any_model THEN
        models := ARRAY[''];
    ELSE
        SELECT array_agg(DISTINCT m) INTO models FROM jsonb_array_elements_text(NEW.models) AS m;
    END IF;
    IF NEW.targeted THEN
        SELECT array_agg(DISTINCT w) INTO allow FROM jsonb_array_elements_text(NEW.worker_allow) AS w;
    END IF;
    IF allow IS NULL OR cardinality(models) * cardinality(allow) > {TARGET_ENTRIES}
            OR EXISTS (SELECT 1 FROM unnest(allow) AS w WHERE length(w) > {TARGET_LENGTH}) THEN
        named := ARRAY[''];
    ELSE
        named := allow;
    END IF;
    INSERT INTO queue_entries ({ENTRY_COLUMNS})
        SELECT NEW.id, m, t, NEW.effective_start, NEW.created_at, NEW.is_chat, NEW.max_length,
            CASE WHEN NEW.is_chat THEN NEW.prompt_tokens + NEW.max_length ELSE NEW.max_context_length END,
            NEW.nsfw, NEW.trusted_workers, NEW.slow_workers,
            coalesce(NEW.required_features, '[]'::jsonb) IN ('[]'::jsonb, 'null'::jsonb)
                AND coalesce(NEW.required_transports, '[]'::jsonb) IN ('[]'::jsonb, 'null'::jsonb)
                AND (NOT NEW.targeted OR named <> ARRAY[''])
        FROM unnest(models) AS m, unnest(named) AS t;
    RETURN NULL;
END $$
"""


def _pg_upgrade() -> None:
    op.execute(_PG_FUNCTION)
    call = "FOR EACH ROW EXECUTE FUNCTION horde_lite_keep_queue()"
    op.execute(f"CREATE TRIGGER text_requests_queue_in AFTER INSERT ON text_requests {call}")
    when = _when_update("IS DISTINCT FROM")
    up = f"CREATE TRIGGER text_requests_queue_up AFTER UPDATE ON text_requests FOR EACH ROW WHEN ({when})"
    op.execute(f"{up} EXECUTE FUNCTION horde_lite_keep_queue()")


# --- SQLite: no variables in a trigger, so the same steps as statements over json_each ----------


def _sqlite_steps(update: bool) -> str:
    """The statements of a SQLite trigger, in the function's order; an update's run only where it
    changed what they write (an insert trigger cannot read OLD)."""
    lists = f" AND {_lists_change('IS NOT')}" if update else ""
    entries = f" AND {_entries_change('IS NOT')}" if update else ""
    distinct_models = "(SELECT count(DISTINCT value) FROM json_each(NEW.models))"
    allow = "json_each(NEW.worker_allow)"
    ok = (
        f"(NEW.targeted AND EXISTS (SELECT 1 FROM {allow}) "
        f"AND NOT EXISTS (SELECT 1 FROM {allow} WHERE length(value) > {TARGET_LENGTH}) "
        f"AND (CASE WHEN NEW.any_model THEN 1 ELSE {distinct_models} END) "
        f"* (SELECT count(DISTINCT value) FROM {allow}) <= {TARGET_ENTRIES})"
    )
    named_some = f"({ok} AND EXISTS (SELECT 1 FROM {allow} WHERE value <> ''))"
    empty = "coalesce(json_array_length(NEW.{c}), 0) = 0"
    plain = (
        f"{empty.format(c='required_features')} AND {empty.format(c='required_transports')} "
        f"AND (NOT NEW.targeted OR {named_some})"
    )
    return (
        "INSERT OR IGNORE INTO queue_refusals (request_id, worker_id) "
        f"SELECT NEW.id, value FROM json_each(NEW.worker_deny) WHERE length(value) <= {TARGET_LENGTH}{lists} "
        "UNION SELECT NEW.id, value FROM json_each(NEW.failed_workers) "
        f"WHERE length(value) <= {TARGET_LENGTH}{lists}; "
        "INSERT OR IGNORE INTO queue_owner_refusals (request_id, owner_id) "
        f"SELECT NEW.id, CAST(value AS INTEGER) FROM json_each(NEW.failed_owners) WHERE 1{lists}; "
        + (f"DELETE FROM queue_entries WHERE request_id = NEW.id{entries}; " if update else "")
        + f"INSERT INTO queue_entries ({ENTRY_COLUMNS}) "
        "SELECT NEW.id, m.model, t.target, NEW.effective_start, NEW.created_at, NEW.is_chat, NEW.max_length, "
        "CASE WHEN NEW.is_chat THEN NEW.prompt_tokens + NEW.max_length ELSE NEW.max_context_length END, "
        f"NEW.nsfw, NEW.trusted_workers, NEW.slow_workers, {plain} "
        "FROM (SELECT '' AS model WHERE NEW.any_model "
        "UNION SELECT value FROM json_each(NEW.models) WHERE NOT NEW.any_model) AS m, "
        f"(SELECT value AS target FROM {allow} WHERE {ok} UNION SELECT '' WHERE NOT {ok}) AS t "
        f"WHERE {_open('NEW')}{entries};"
    )


def _sqlite_upgrade() -> None:
    row = "ON text_requests FOR EACH ROW"
    inserted, updated = _sqlite_steps(update=False), _sqlite_steps(update=True)
    op.execute(f"CREATE TRIGGER text_requests_queue_insert AFTER INSERT {row} BEGIN {inserted} END")
    when = _when_update("IS NOT")
    op.execute(
        f"CREATE TRIGGER text_requests_queue_update AFTER UPDATE {row} WHEN {when} BEGIN {updated} END"
    )


# --- the change log's request trigger, with failed_owners ----------------------------------------


def _replace_noted(columns: tuple[str, ...]) -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    changed = _0009._changed(columns, "IS DISTINCT FROM" if postgres else "IS NOT")
    if postgres:
        op.execute("DROP TRIGGER text_requests_noted_up ON text_requests")
        op.execute(
            "CREATE TRIGGER text_requests_noted_up AFTER UPDATE ON text_requests FOR EACH ROW "
            f"WHEN ({changed}) EXECUTE FUNCTION horde_lite_note_change('r')"
        )
        return
    op.execute("DROP TRIGGER text_requests_noted_update")
    op.execute(
        "CREATE TRIGGER text_requests_noted_update AFTER UPDATE ON text_requests FOR EACH ROW "
        f"WHEN {changed} BEGIN INSERT INTO change_log (kind, ref, at) VALUES ('r', NEW.id, unixepoch()); END"
    )


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _pg_upgrade()
    else:
        _sqlite_upgrade()
    _replace_noted(NOTED)


def downgrade() -> None:
    _replace_noted(_0009.REQUEST_COLUMNS)
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER text_requests_queue_in ON text_requests")
        op.execute("DROP TRIGGER text_requests_queue_up ON text_requests")
        op.execute("DROP FUNCTION horde_lite_keep_queue()")
    else:
        op.execute("DROP TRIGGER text_requests_queue_insert")
        op.execute("DROP TRIGGER text_requests_queue_update")
