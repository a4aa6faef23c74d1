"""The migrations of the queue's index, on SQLite and PostgreSQL: 0011 keeps only requests with a
job to hand out (going back gives every waiting request its entries again, coming forward takes
them from the requests whose jobs are all out); 0013 gives the entries their request's choices;
0014 names the workers of a short allow-list (going back leaves one entry per model); 0016 says
which entries are plain; 0017 lists the workers each request refuses by name."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from sqlalchemy import Insert, column, insert, table, text

from horde_lite.db import migrate
from horde_lite.db.engine import make_engine
from horde_lite.db.migrate import _commands
from horde_lite.db.models import QueueEntry, QueueRefusal, RequestModel, TextRequest
from tests.support.queue_oracle import entry_rows, refusal_rows

BEFORE = "0010_check_in_jump_20"
# From 0020 on, the database's triggers write the index; these tests seed rows as the revisions
# before it did, by hand, so they seed at this revision and then come forward.
HAND_KEPT = "0019_request_prices"


def _seeded(url: str, seed: Callable[[str], Awaitable[None]]) -> None:
    _commands(url).downgrade(HAND_KEPT)
    asyncio.run(seed(url))
    migrate.upgrade(url)


def _request(request_id: str, *, left: int, models: list[str], state: str = "waiting") -> dict[str, object]:
    return {"id": request_id, "user_id": 1, "requester_kind": "registered", "state": state,
            "is_chat": False, "prompt": "p", "params": {}, "max_length": 512, "max_context_length": 2048,
            "effective_start": 1.0, "created_at": 2.0, "expires_at": 100.0, "requested_max_length": 512,
            "any_model": not models, "models": models, "n_total": 1, "n_remaining": left, "nsfw": False,
            "trusted_workers": False, "slow_workers": True}  # fmt: skip


_USER = {"id": 1, "username": "u", "api_key_hash": "h", "kudos": 0.0, "trusted": False, "moderator": False,
         "anonymous": False, "created_at": 0.0}  # fmt: skip


def users_insert(row: dict[str, object]) -> Insert:
    """An insert of `row` into users naming only its own columns: the model's later columns (with
    their defaults) do not exist yet at the revision a migration test goes back to."""
    return insert(table("users", *(column(name) for name in row)))


async def _seed(url: str) -> None:
    models = {"offered": ["m1"], "out": ["m1", "m2"], "out-any": [], "done": ["m1"]}
    requests = [
        {**_request("offered", left=1, models=models["offered"]), "nsfw": True, "slow_workers": False},
        _request("out", left=0, models=models["out"]),
        _request("out-any", left=0, models=models["out-any"]),
        _request("done", left=0, models=models["done"], state="done"),
    ]
    links = [{"request_id": r, "model": m} for r, asked in models.items() for m in asked]
    engine = make_engine(url, null_pool=True)
    try:
        async with engine.begin() as conn:
            await conn.execute(users_insert(_USER), _USER)
            await conn.execute(insert(TextRequest.__table__), requests)
            await conn.execute(insert(RequestModel.__table__), links)
            await conn.execute(insert(QueueEntry.__table__), entry_rows(requests[0]))  # as 0019 kept it
    finally:
        await engine.dispose()


async def _sql(url: str, sql: str) -> list[tuple[object, ...]]:
    engine = make_engine(url, null_pool=True)
    try:
        async with engine.connect() as conn:
            return [tuple(r) for r in await conn.execute(text(sql))]
    finally:
        await engine.dispose()


async def _entries(url: str) -> list[tuple[object, ...]]:
    sql = "SELECT request_id, model, need_length, need_context FROM queue_entries ORDER BY 1, 2"
    return await _sql(url, sql)


def test_entries_of_requests_with_every_job_out_go_and_come_back(db_url: str) -> None:
    try:
        _seeded(db_url, _seed)
        _commands(db_url).downgrade(BEFORE)
        assert asyncio.run(_entries(db_url)) == [
            ("offered", "m1", 512, 2048),
            ("out", "m1", 512, 2048),
            ("out", "m2", 512, 2048),
            ("out-any", "", 512, 2048),
        ]
        migrate.upgrade(db_url)
        assert asyncio.run(_entries(db_url)) == [("offered", "m1", 512, 2048)]
        choices = "SELECT nsfw, trusted_workers, slow_workers FROM queue_entries"
        assert [tuple(map(bool, r)) for r in asyncio.run(_sql(db_url, choices))] == [(True, False, False)]
    finally:
        migrate.upgrade(db_url)  # leave the shared database at the head for the other tests


async def _at_head(url: str, requests: list[dict[str, object]]) -> None:
    """Waiting requests (every row with the same keys) and their entries, written as by 0019."""
    engine = make_engine(url, null_pool=True)
    try:
        async with engine.begin() as conn:
            await conn.execute(users_insert(_USER), _USER)
            await conn.execute(insert(TextRequest.__table__), requests)
            await conn.execute(insert(QueueEntry.__table__), [e for r in requests for e in entry_rows(r)])
    finally:
        await engine.dispose()


async def _seed_targeted(url: str) -> None:
    crowd = [f"{i:036d}" for i in range(17)]
    requests = [
        {**_request("aimed", left=1, models=["m1", "m2"]), "targeted": True, "worker_allow": ["w2", "w1"]},
        {**_request("crowd", left=1, models=["m1"]), "targeted": True, "worker_allow": crowd},
    ]
    await _at_head(url, requests)


def test_a_short_allow_lists_workers_are_named_and_unnamed(db_url: str) -> None:
    named = [("aimed", m, w) for m in ("m1", "m2") for w in ("w1", "w2")] + [("crowd", "m1", "")]
    sql = "SELECT request_id, model, target FROM queue_entries ORDER BY 1, 2, 3"
    try:
        _seeded(db_url, _seed_targeted)
        assert asyncio.run(_sql(db_url, sql)) == named
        _commands(db_url).downgrade("0013_entries_carry_choices")
        unnamed = "SELECT request_id, model FROM queue_entries ORDER BY 1, 2"
        assert asyncio.run(_sql(db_url, unnamed)) == [("aimed", "m1"), ("aimed", "m2"), ("crowd", "m1")]
        migrate.upgrade(db_url)
        assert asyncio.run(_sql(db_url, sql)) == named
    finally:
        migrate.upgrade(db_url)


async def _seed_plain(url: str) -> None:
    crowd = [f"{i:036d}" for i in range(17)]
    lists = {"targeted": False, "worker_allow": [], "failed_workers": []}  # every row the same keys
    requests = [
        {**_request("bare", left=1, models=["m1"]), **lists, "is_chat": True},
        {**_request("failed", left=1, models=["m1"]), **lists, "failed_workers": ["w9"]},
        {**_request("crowd", left=1, models=["m1"]), **lists, "targeted": True, "worker_allow": crowd},
    ]
    await _at_head(url, requests)


def test_entries_say_whether_their_request_is_plain(db_url: str) -> None:
    """0016: an existing horde's entries are plain when their request has no lists to judge and no
    allow-list they do not name (going back drops the column); from 0017 on, failed workers are
    read from the request's refusals and leave its entries plain."""
    sql = "SELECT request_id, plain FROM queue_entries ORDER BY 1"
    want = [("bare", True), ("crowd", False), ("failed", True)]
    try:
        _seeded(db_url, _seed_plain)
        assert [(r, bool(p)) for r, p in asyncio.run(_sql(db_url, sql))] == want
        _commands(db_url).downgrade("0015_workers_capacity")
        _commands(db_url).upgrade("0016_entries_plain")
        at_0016 = [("bare", True), ("crowd", False), ("failed", False)]
        assert [(r, bool(p)) for r, p in asyncio.run(_sql(db_url, sql))] == at_0016
        migrate.upgrade(db_url)
        assert [(r, bool(p)) for r, p in asyncio.run(_sql(db_url, sql))] == want
    finally:
        migrate.upgrade(db_url)


async def _seed_refusing(url: str) -> None:
    lists = {"worker_deny": [], "failed_workers": []}  # every row the same keys
    requests = [
        {**_request("bare", left=1, models=["m1"]), **lists},
        {**_request("denies", left=1, models=["m1"]), **lists, "worker_deny": ["w2", "w1", "n" * 37]},
        {**_request("failed", left=0, models=["m1"], state="done"), **lists, "failed_workers": ["w3"]},
        {**_request("both", left=1, models=["m1"]), "worker_deny": ["w1"], "failed_workers": ["w4"]},
    ]
    await _at_head(url, requests)
    engine = make_engine(url, null_pool=True)
    try:
        async with engine.begin() as conn:
            named = [refusal_rows(str(r["id"]), [*r["worker_deny"], *r["failed_workers"]]) for r in requests]
            await conn.execute(insert(QueueRefusal.__table__), [row for rows in named for row in rows])
    finally:
        await engine.dispose()


def test_a_requests_refusals_are_its_deny_list_and_failed_workers(db_url: str) -> None:
    """0017: an existing horde's requests, waiting or not, refuse the workers their deny-list names
    and those that failed them (a name longer than a worker id refuses none), as admission and
    give-backs write them, and their entries are plain; going back drops the table, and entries of
    requests with such lists are not plain."""
    sql = "SELECT request_id, worker_id FROM queue_refusals ORDER BY 1, 2"
    want = [("both", "w1"), ("both", "w4"), ("denies", "w1"), ("denies", "w2"), ("failed", "w3")]
    plain = "SELECT DISTINCT request_id, plain FROM queue_entries ORDER BY 1"
    try:
        _seeded(db_url, _seed_refusing)
        assert asyncio.run(_sql(db_url, sql)) == want
        _commands(db_url).downgrade("0016_entries_plain")  # drops the table: coming back rebuilds it
        before = [("bare", True), ("both", False), ("denies", False), ("failed", False)]
        assert [(r, bool(p)) for r, p in asyncio.run(_sql(db_url, plain))] == before
        migrate.upgrade(db_url)
        assert asyncio.run(_sql(db_url, sql)) == want
        after = [("bare", True), ("both", True), ("denies", True), ("failed", True)]
        assert [(r, bool(p)) for r, p in asyncio.run(_sql(db_url, plain))] == after
    finally:
        migrate.upgrade(db_url)
