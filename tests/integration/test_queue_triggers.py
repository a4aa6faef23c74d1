"""The database's triggers keep the queue's index and the change log, on SQLite and PostgreSQL.

- The installed triggers agree with the Python statement of what the index holds
  (`tests/support/queue_oracle.py`) for any request and any later change of it: property-tested.
- The columns the installed triggers watch are those the code declares: the change log's, those the
  wait estimate's copy reads (`mirror.NOTED_REQUEST_COLUMNS`, `mirror.NOTED_WORKER_COLUMNS`); the
  index's, those an entry is made of and the lists that refuse (`queue_index.ENTRY_SOURCE_COLUMNS`,
  `queue_index.REFUSAL_SOURCE_COLUMNS`). A migration that adds a rule's column to one but not the
  other fails here.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from horde_lite.db.engine import make_engine
from horde_lite.db.models import QueueEntry, QueueOwnerRefusal, QueueRefusal, TextRequest, User
from horde_lite.queue.mirror import NOTED_REQUEST_COLUMNS, NOTED_WORKER_COLUMNS
from horde_lite.queue.queue_index import ENTRY_SOURCE_COLUMNS, REFUSAL_SOURCE_COLUMNS
from tests.support.queue_oracle import entry_rows, has_entries, refusal_rows

_USER = {"id": 1, "username": "u", "api_key_hash": "h", "kudos": 0.0, "trusted": False, "moderator": False,
         "anonymous": False, "created_at": 0.0}  # fmt: skip

# Small alphabets, so that repeats, overlaps and the 16-entry and 36-character edges come up often.
_names = st.sampled_from(["", "a", "b", "c", "w" * 36, "x" * 37])
_models = st.sampled_from(["m1", "m2", "m3", "m4", "m5"])
_lists = st.lists(_names, max_size=6)
_owners = st.lists(st.integers(min_value=1, max_value=5).map(str), max_size=3)


@st.composite
def _requests(draw: st.DrawFn) -> dict[str, Any]:
    models = draw(st.lists(_models, max_size=5))
    return {
        "user_id": 1, "requester_kind": "registered", "prompt": "p", "params": {},
        "expires_at": 1e9, "requested_max_length": 64,
        "state": draw(st.sampled_from(["waiting", "waiting", "done", "cancelled"])),
        "n_total": 3, "n_remaining": draw(st.integers(min_value=0, max_value=3)),
        "effective_start": draw(st.floats(min_value=0, max_value=100)), "created_at": 1.0,
        "is_chat": draw(st.booleans()), "max_length": draw(st.integers(min_value=1, max_value=4096)),
        "max_context_length": draw(st.integers(min_value=1, max_value=8192)),
        "prompt_tokens": draw(st.integers(min_value=0, max_value=4096)),
        "any_model": not models or draw(st.booleans()), "models": models,
        "targeted": draw(st.booleans()), "worker_allow": draw(st.lists(_names, max_size=18)),
        "worker_deny": draw(_lists), "failed_workers": draw(_lists), "failed_owners": draw(_owners),
        "required_features": draw(st.lists(st.sampled_from(["tools", "json"]), max_size=2)),
        "required_transports": draw(st.lists(st.sampled_from(["url"]), max_size=1)),
        "nsfw": draw(st.booleans()), "trusted_workers": draw(st.booleans()),
        "slow_workers": draw(st.booleans()),
    }  # fmt: skip


# A later change of a request, as the code makes them: a job taken or given back, a failure, an end.
_changes = st.lists(
    st.one_of(
        st.fixed_dictionaries({"n_remaining": st.integers(min_value=0, max_value=3)}),
        st.fixed_dictionaries({"state": st.sampled_from(["waiting", "done", "faulted", "cancelled"])}),
        st.fixed_dictionaries({"failed_workers": _lists, "failed_owners": _owners}),
        st.fixed_dictionaries({"expires_at": st.floats(min_value=0, max_value=1e9)}),
    ),
    max_size=4,
)


_ENTRY = ("request_id", "model", "target", "effective_start", "created_at", "is_chat", "need_length",
          "need_context", "nsfw", "trusted_workers", "slow_workers", "plain")  # fmt: skip
_FLAGS = frozenset(("is_chat", "nsfw", "trusted_workers", "slow_workers", "plain"))


def _expected(
    rid: str, row: dict[str, Any], refused: set[tuple[str, str]], owners: set[tuple[str, int]]
) -> Any:
    source = {c: row[c] for c in ENTRY_SOURCE_COLUMNS}  # the oracle sees only the declared columns
    entries = entry_rows({**source, "id": rid}) if has_entries(row) else []
    refused |= {
        (x["request_id"], x["worker_id"])
        for x in refusal_rows(rid, [*row["worker_deny"], *row["failed_workers"]])
    }
    owners |= {(rid, int(o)) for o in row["failed_owners"]}
    return sorted(tuple(e[c] for c in _ENTRY) for e in entries), set(refused), set(owners)


async def _held(engine: AsyncEngine, rid: str) -> Any:
    columns = [getattr(QueueEntry, c) for c in _ENTRY]
    async with engine.connect() as conn:
        entries = (await conn.execute(select(*columns).where(QueueEntry.request_id == rid))).all()
        refused = (await conn.execute(select(QueueRefusal.request_id, QueueRefusal.worker_id))).all()
        owners = (await conn.execute(select(QueueOwnerRefusal.request_id, QueueOwnerRefusal.owner_id))).all()
    # SQLite answers its booleans as integers.
    held = sorted(
        tuple(bool(v) if c in _FLAGS else v for c, v in zip(_ENTRY, r, strict=True)) for r in entries
    )
    return held, {tuple(r) for r in refused}, {tuple(r) for r in owners}


async def _check(engine: AsyncEngine, request: dict[str, Any], changes: list[dict[str, Any]]) -> None:
    rid = "r1"
    async with engine.begin() as conn:
        await conn.execute(delete(TextRequest.__table__))
        await conn.execute(insert(TextRequest.__table__), {**request, "id": rid})
    row = dict(request)
    refused: set[tuple[str, str]] = set()
    owners: set[tuple[str, int]] = set()
    want = _expected(rid, row, refused, owners)
    assert await _held(engine, rid) == want
    for change in changes:
        # The code only ever adds to the failure lists.
        change = {
            k: [*row[k], *v] if k in ("failed_workers", "failed_owners") else v for k, v in change.items()
        }
        async with engine.begin() as conn:
            await conn.execute(update(TextRequest.__table__).where(TextRequest.id == rid).values(**change))
        row.update(change)
        want = _expected(rid, row, refused, owners)
        assert await _held(engine, rid) == want, change


@pytest.fixture
def engine(db_url: str) -> Any:
    async def seed() -> AsyncEngine:
        made = make_engine(db_url, null_pool=True)
        async with made.begin() as conn:
            await conn.execute(insert(User.__table__), _USER)
        return made

    made = asyncio.run(seed())
    yield made
    asyncio.run(made.dispose())


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=_requests(), changes=_changes)
def test_the_triggers_keep_the_index_as_the_rule_says(
    engine: AsyncEngine, request: dict[str, Any], changes: list[dict[str, Any]]
) -> None:
    asyncio.run(_check(engine, request, changes))


def test_a_deleted_request_takes_its_index_with_it(engine: AsyncEngine) -> None:
    async def run() -> None:
        request = {"id": "gone", "user_id": 1, "requester_kind": "registered", "prompt": "p", "params": {},
                   "expires_at": 1e9, "requested_max_length": 64, "effective_start": 1.0, "created_at": 1.0,
                   "max_length": 64, "max_context_length": 1024, "models": ["m1", "m2"], "any_model": False,
                   "worker_deny": ["a"], "failed_workers": ["b"], "failed_owners": ["2"]}  # fmt: skip
        async with engine.begin() as conn:
            await conn.execute(insert(TextRequest.__table__), request)
            await conn.execute(delete(TextRequest.__table__).where(TextRequest.id == "gone"))
        assert await _held(engine, "gone") == ([], set(), set())

    asyncio.run(run())


# --- the installed triggers watch the declared columns ------------------------------------------


async def _trigger_sql(engine: AsyncEngine, name: str) -> str:
    async with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            query = "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgname = :name"
        else:
            query = "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = :name"
        found = (await conn.execute(text(query), {"name": name})).scalar_one()
    return str(found)


def _watched(sql: str) -> set[str]:
    """The columns whose change an update trigger's WHEN clause compares."""
    # PostgreSQL renders a varchar's comparison as `(new.state)::text IS DISTINCT FROM (old.state)::text`.
    compared = r"\(?new\.(\w+)\)?(?:::\w+)?\s+IS\s+(?:DISTINCT\s+FROM|NOT)\s+\(?old\."
    return {m.lower() for m in re.findall(compared, sql, re.I)}


def _trigger_names(engine: AsyncEngine) -> dict[str, str]:
    if engine.dialect.name == "postgresql":
        return {
            "requests": "text_requests_noted_up",
            "workers": "workers_noted_up",
            "queue": "text_requests_queue_up",
        }
    return {"requests": "text_requests_noted_update", "workers": "workers_noted_update",
            "queue": "text_requests_queue_update"}  # fmt: skip


def test_the_change_log_notes_the_columns_the_estimates_copy_reads(engine: AsyncEngine) -> None:
    names = _trigger_names(engine)
    requests = asyncio.run(_trigger_sql(engine, names["requests"]))
    workers = asyncio.run(_trigger_sql(engine, names["workers"]))
    assert _watched(requests) == set(NOTED_REQUEST_COLUMNS)
    # A worker's check-in is noted only when it jumps (compared by a sum, not IS NOT): see change_log.
    assert _watched(workers) == set(NOTED_WORKER_COLUMNS) - {"last_check_in"}
    assert "last_check_in" in workers


def test_the_index_is_rewritten_when_a_column_it_is_made_of_changes(engine: AsyncEngine) -> None:
    queue = asyncio.run(_trigger_sql(engine, _trigger_names(engine)["queue"]))
    assert _watched(queue) == {*ENTRY_SOURCE_COLUMNS, *REFUSAL_SOURCE_COLUMNS}
    # Whether the request has a job to hand out is compared as a whole, not column by column.
    assert "n_remaining" in queue.lower()
    assert "state" in queue.lower()
