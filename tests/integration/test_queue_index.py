"""The queue's index (docs/explanation/dispatch.md, "Walking the queue"): entries enter with a
waiting request and leave when it stops waiting; the pop walks past pages its rules refuse and
skips lengths inside the index; the wait estimate stops at its horizon."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import event, text

from horde_lite.app import create_app
from horde_lite.clock import ManualClock
from horde_lite.lifecycle import dispatch
from horde_lite.lifecycle import estimate as estimate_module
from horde_lite.lifecycle.eligibility import built_once
from horde_lite.lifecycle.estimate import Estimate, estimate
from tests.conftest import is_postgres, make_settings
from tests.support.horde import ANON, HordeClient


async def _rows(client: HordeClient, sql: str, **params: Any) -> list[Any]:
    async with client.horde.sessionmaker() as session:
        return list((await session.execute(text(sql), params)).all())


async def _entries(client: HordeClient, request_id: str) -> list[tuple[str, int, int, bool]]:
    rows = await _rows(
        client,
        "SELECT model, need_length, need_context, is_chat FROM queue_entries WHERE request_id = :r "
        "ORDER BY model",
        r=request_id,
    )
    return [(m, int(a), int(b), bool(c)) for m, a, b, c in rows]


async def test_entries_follow_the_request(client: HordeClient) -> None:
    key = await client.user("owner")
    both = await client.create(
        ANON, models=["b-7B", "a-7B"], params={"max_length": 64, "max_context_length": 1024}
    )
    client.clock.advance(1)  # queue order: `both` first
    anywhere = await client.create(ANON, params={"max_length": 32, "max_context_length": 512})
    both_id, any_id = both.json()["id"], anywhere.json()["id"]
    # One entry per model asked for; "" for a request any model serves; the lengths a worker needs.
    assert await _entries(client, both_id) == [("a-7B", 64, 1024, False), ("b-7B", 64, 1024, False)]
    assert await _entries(client, any_id) == [("", 32, 512, False)]

    # Cancelled: it leaves at once, although its running job goes on.
    job = (await client.pop(key, "w1", models=["a-7B"], max_length=512, max_context_length=2048)).json()
    assert job["id"] is not None
    await client.cancel(both_id)
    assert await _entries(client, both_id) == []

    # Done: it leaves when its last job is submitted.
    job = (await client.pop(key, "w1", models=["a-7B"], max_length=512, max_context_length=2048)).json()
    assert job["id"] is not None
    assert job["model"] == "a-7B"
    assert await _entries(client, any_id) == [("", 32, 512, False)]  # handed out, not yet done
    assert (await client.submit(key, job["id"])).status_code == 200
    assert await _entries(client, any_id) == []


async def test_a_chat_entry_needs_the_prompt_and_the_reply(client: HordeClient) -> None:
    chat = {"messages": [{"role": "user", "content": "Hello there."}], "max_tokens": 40}
    response = await client.create(ANON, models=["c-7B"], chat=chat)
    assert response.status_code == 202, response.text
    [(model, need_length, need_context, is_chat)] = await _entries(client, response.json()["id"])
    [(prompt_tokens,)] = await _rows(client, "SELECT prompt_tokens FROM text_requests")
    assert (model, need_length, is_chat) == ("c-7B", 40, True)
    assert need_context == prompt_tokens + 40
    assert prompt_tokens > 0


async def test_faulted_and_expired_requests_leave(client: HordeClient) -> None:
    keys = [await client.user(f"owner{i}") for i in range(4)]
    faulted = (await client.create(ANON, models=["f-7B"], params={"max_length": 16})).json()["id"]
    for i, key in enumerate(keys[:3]):  # more than max_failures (2) distinct workers fail it
        job = (await client.pop(key, f"w{i}", models=["f-7B"])).json()
        assert job["id"] is not None
        assert (await client.submit(key, job["id"], state="faulted")).status_code == 200
    [(state,)] = await _rows(client, "SELECT state FROM text_requests WHERE id = :r", r=faulted)
    assert state == "faulted"
    assert await _entries(client, faulted) == []

    stale = (await client.create(ANON, models=["e-7B"], params={"max_length": 16})).json()["id"]
    client.clock.advance(client.horde.settings.request.expiry_seconds + 1)
    await client.sweep()
    assert await _rows(client, "SELECT count(*) FROM queue_entries WHERE request_id = :r", r=stale) == [(0,)]


async def test_the_pop_walks_past_a_page_its_rules_refuse(client: HordeClient) -> None:
    """More than a page of requests ahead that the worker's lengths allow but another rule refuses
    (trusted workers only): the pop pages on and finds the one behind them."""
    key = await client.user("owner")
    # A rich requester's requests are ahead in the queue (effective start by priority).
    rich = await client.user("rich", kudos=1_000_000)
    for _ in range(dispatch.POP_PAGE + 3):
        response = await client.create(rich, models=["p-7B"], trusted_workers=True, params={"max_length": 16})
        assert response.status_code == 202, response.text
    client.clock.advance(1)
    wanted = (await client.create(ANON, models=["p-7B"], params={"max_length": 16})).json()["id"]
    job = (await client.pop(key, "untrusted", models=["p-7B"])).json()
    assert job["id"] is not None
    [(request_id,)] = await _rows(client, "SELECT request_id FROM generations WHERE id = :g", g=job["id"])
    assert request_id == wanted


async def test_the_owners_request_behind_a_page_of_others_goes_first(client: HordeClient) -> None:
    """The first page is judged with the owner's and the priority users' requests, which go first:
    behind more than a page of takeable requests, the priority user's and the owner's are taken
    (in queue order among them), then the queue's head."""
    key = await client.user("owner")
    friend = await client.user("friend")
    rich = await client.user("rich", kudos=1_000_000)
    assert (await client.pop(key, "w", models=["o-7B"])).json()["id"] is None  # the worker exists
    head = (await client.create(rich, models=["o-7B"], params={"max_length": 16})).json()["id"]
    client.clock.advance(1)
    for _ in range(dispatch.POP_PAGE + 3):
        await client.create(rich, models=["o-7B"], params={"max_length": 16})
    client.clock.advance(1)
    theirs = (await client.create(friend, models=["o-7B"], params={"max_length": 16})).json()["id"]
    client.clock.advance(1)
    own = (await client.create(key, models=["o-7B"], params={"max_length": 16})).json()["id"]
    taken = []
    for _ in range(3):
        job = (await client.pop(key, "w", models=["o-7B"], priority_usernames=["friend"])).json()
        [(request_id,)] = await _rows(client, "SELECT request_id FROM generations WHERE id = :g", g=job["id"])
        taken.append(request_id)
    assert taken == [theirs, own, head]


async def test_an_existing_workers_found_pop_runs_seven_statements(client: HordeClient) -> None:
    """Owner and worker in one read, the check-in's update, the queue's page, the claim (with the
    speed gate's question for an over-capacity job), the request's update, the job and its shadow
    record: no separate key lookup, capable question or ORM reload."""
    key = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    worker = {"models": ["s-7B"], "max_length": 2048, "max_context_length": 4096}
    assert (await client.pop(key, "w", **worker)).json()["id"] is None
    # Longer than an unmeasured worker's capacity (1200 tokens): the gate's question is asked.
    created = await client.create(
        rich, models=["s-7B"], params={"max_length": 2048, "max_context_length": 4096}
    )
    assert created.status_code == 202, created.text
    client.clock.advance(1)
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not statement.lstrip().upper().startswith(("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE")):
            statements.append(statement)

    engine = client.horde.engine.sync_engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        job = (await client.pop(key, "w", **worker)).json()
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert job["id"] is not None
    [record] = await _rows(client, "SELECT over_capacity, capable_online FROM assignment_records")
    assert (bool(record[0]), record[1] is not None) == (True, True)
    assert len(statements) == 7, statements


async def test_the_pop_skips_lengths_inside_the_index(client: HordeClient) -> None:
    """A request longer than the worker accepts is never a candidate; one that fits behind it is."""
    key = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    await client.create(rich, models=["l-7B"], params={"max_length": 1024, "max_context_length": 2048})
    client.clock.advance(1)
    small = (await client.create(ANON, models=["l-7B"], params={"max_length": 64})).json()["id"]
    job = (await client.pop(key, "small", models=["l-7B"], max_length=128, max_context_length=2048)).json()
    [(request_id,)] = await _rows(client, "SELECT request_id FROM generations WHERE id = :g", g=job["id"])
    assert request_id == small
    assert (await client.pop(key, "small", models=["l-7B"], max_length=128)).json()["id"] is None


async def _walks(client: HordeClient, request_id: str, *, stopped_page: int, far_page: int) -> list[Estimate]:
    """The estimate of `request_id` walked in pages of `stopped_page` (it may stop at the horizon),
    in pages of 10 (the queues here fit in one), and in pages of `far_page` with a horizon past
    the queue."""
    horde = client.horde
    async with horde.sessionmaker() as session:
        rules = horde.rules(horde.clock.now())
        return [
            await estimate(session, request_id, rules, page=stopped_page),
            await estimate(session, request_id, rules, page=10),
            await estimate(session, request_id, replace(rules, horizon_seconds=10**6), page=far_page),
        ]


@pytest.fixture
async def short_horizon(db_url: str) -> Any:
    """A horde whose estimate stops after 2 s of work (the allowance curve ends at 2 s)."""
    allowance = {"wait_full_seconds": 1, "wait_floor_seconds": 2, "estimate_horizon_seconds": 2}
    app = create_app(make_settings(db_url, allowance=allowance), ManualClock(), run_sweeper=False)
    async with AsyncTestClient(app=app, timeout=30) as http:
        yield HordeClient(http, app.state.horde)


async def test_the_estimate_stops_at_its_horizon(short_horizon: HordeClient) -> None:
    client = short_horizon
    key = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    # One unmeasured worker (the assumed speed): 2 s of work is a few tokens; each request is 100.
    assert (await client.pop(key, "w", models=["h-7B"])).json()["id"] is None
    for _ in range(5):
        await client.create(rich, models=["h-7B"], params={"max_length": 100})
    client.clock.advance(1)
    mine = (await client.create(ANON, models=["h-7B"], params={"max_length": 100})).json()["id"]
    stopped, whole, far = await _walks(client, mine, stopped_page=2, far_page=2)
    # The walk stops after the first page that reaches the horizon; a walk of one page, or a
    # horizon past the queue, counts every request ahead.
    assert (stopped.competing_requests, stopped.competing_work) == (2, 200)
    assert (whole.competing_requests, whole.competing_work) == (5, 500)
    assert (far.competing_requests, far.competing_work) == (5, 500)
    assert stopped.estimated_wait is not None
    assert stopped.estimated_wait >= client.horde.rules(client.horde.clock.now()).horizon_seconds


async def test_undecided_requests_are_judged_when_they_could_reach_the_horizon(client: HordeClient) -> None:
    """Chat requests ahead that R's only eligible worker (a slow one) may take only while no capable
    worker for them is online are asked about once their work could reach the horizon, or at the
    end: the walk stops after the page it stopped after when each page asked, with the same count."""
    key = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    chat_block = {"max_completion_tokens": 4096, "max_context_tokens": 8192, "features": []}
    for name in ("slow", "fast"):  # fast: unmeasured, so capable of every request here
        assert (await client.pop(key, name, models=["u-7B"], chat=chat_block)).json()["id"] is None
    async with client.horde.sessionmaker() as session, session.begin():
        # 0.5 tokens/s: capacity 60, below each request's 100; R's horizon: 0.5 x 300 s = 150 tokens.
        await session.execute(text("UPDATE workers SET lease_speed = 0.5, capacity = 60 WHERE name = 'slow'"))
    [(slow,)] = await _rows(client, "SELECT id FROM workers WHERE name = 'slow'")
    # "a": the fast worker can take it, so the slow one may not: not competing. "b": targets the
    # slow worker, so no capable worker can take it and the slow one may: competing.
    order = ["a", "b", "a", "a", "b", "b", "a"]
    for kind in order:
        chat = {"messages": [{"role": "user", "content": "Hi."}], "max_tokens": 100}
        targeting = {"workers": [slow]} if kind == "b" else {}
        response = await client.create(rich, models=["u-7B"], chat=chat, **targeting)
        assert response.status_code == 202, response.text
        client.clock.advance(1)
    created = await client.create(ANON, models=["u-7B"], workers=[slow], params={"max_length": 100})
    mine = created.json()["id"]
    paged, whole, far = await _walks(client, mine, stopped_page=2, far_page=1)
    assert (whole.eligible_workers, whole.eligible_speed) == (1, 0.5)
    # Pages of 2: [a b] 100, [a a] 100, [b b] 300 >= 150: it stops there, having counted 3 requests.
    assert (paged.competing_requests, paged.competing_work) == (3, 300)
    assert (whole.competing_requests, whole.competing_work) == (3, 300)
    assert (far.competing_requests, far.competing_work, far.competing_jobs) == (3, 300, 3)


async def test_the_capable_question_finds_its_requests_by_key(client: HordeClient, db_url: str) -> None:
    """The estimate's "which of these requests could a capable worker take" reads each request by
    its primary key, however long the queue: SQLite's plan searches text_requests, never scans it
    (PostgreSQL's plans are read by bench/perf.py on a queue of 100,000)."""
    if is_postgres(db_url):
        pytest.skip("SQLite's query plan")
    horde = client.horde
    statement = built_once(horde.rules(horde.clock.now()), ("estimate capable",), estimate_module._capable)

    def explain(conn: Any, cursor: Any, sql: str, parameters: Any, context: Any, many: bool) -> Any:
        return f"EXPLAIN QUERY PLAN {sql}", parameters

    async with horde.engine.connect() as conn:
        event.listen(conn.sync_connection, "before_cursor_execute", explain, retval=True)
        plan = [row[-1] for row in (await conn.execute(statement, {"now": horde.clock.now(), "ids": ["x"]}))]
    assert any(step.startswith("SEARCH text_requests") for step in plan), plan
    assert not any(step.startswith("SCAN text_requests") for step in plan), plan


async def test_a_long_walk_sizes_its_later_pages_by_what_the_horizon_needs(client: HordeClient) -> None:
    """After its first page, the walk asks for as many rows as the horizon still needs at the work
    per row read so far (within [page, 1000]): 12 requests ahead, read 2 then the rest in one page
    instead of six pages, with the same count."""
    key = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    assert (await client.pop(key, "w", models=["p-7B"])).json()["id"] is None
    for _ in range(12):
        await client.create(rich, models=["p-7B"], params={"max_length": 100})
    client.clock.advance(1)
    mine = (await client.create(ANON, models=["p-7B"], params={"max_length": 100})).json()["id"]
    horde = client.horde
    pages: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "queue_entries" in statement:
            pages.append(statement)

    async with horde.sessionmaker() as session:
        conn = await session.connection()
        event.listen(conn.sync_connection, "before_cursor_execute", count)
        rules = replace(horde.rules(horde.clock.now()), horizon_seconds=10**6)
        got = await estimate(session, mine, rules, page=2)
    assert (got.competing_requests, got.competing_work) == (12, 1200)
    assert len(pages) == 2
