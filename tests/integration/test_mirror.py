"""Each process's copy of the queue and the fleet (queue/mirror.py), which the wait estimate
reads: it follows every commit made before an estimate, by this process or another, through the
change log the database's triggers write; it stops at the horizon; and it reads the queue from
memory, one short statement a catch-up."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import text

from horde_lite.app import create_app
from horde_lite.clock import ManualClock
from horde_lite.db import change_log
from horde_lite.queue.estimate import Estimate, estimate_request
from tests.conftest import is_postgres, make_settings
from tests.support.apps import app_for
from tests.support.horde import ANON, HordeClient
from tests.support.invariants import copy_matches_the_database
from tests.support.statements import Sent, statements_sent


async def _rows(client: HordeClient, sql: str, **params: Any) -> list[Any]:
    async with client.horde.sessionmaker() as session:
        return list((await session.execute(text(sql), params)).all())


async def _estimate(client: HordeClient, request_id: str, *, far: bool = False) -> Estimate:
    horde = client.horde
    rules = horde.rules(horde.clock.now())
    if far:
        rules = replace(rules, horizon_seconds=10**6)
    async with horde.sessionmaker() as session:
        return await estimate_request(horde, session, request_id, rules)


@pytest.fixture
async def short_horizon(db_url: str) -> AsyncIterator[HordeClient]:
    """A horde whose estimate stops after 2 s of work (the allowance curve ends at 2 s)."""
    allowance = {"wait_full_seconds": 1, "wait_floor_seconds": 2, "estimate_horizon_seconds": 2}
    app = app_for(make_settings(db_url, allowance=allowance), ManualClock())
    async with AsyncTestClient(app=app, timeout=30) as http:
        yield HordeClient(http, app.state.horde)


async def test_the_estimate_stops_at_its_horizon(short_horizon: HordeClient) -> None:
    client = short_horizon
    key = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    # One unmeasured worker (the assumed 10 tokens/s): 2 s of work is 20 tokens; each request is 100.
    assert (await client.pop(key, "w", models=["h-7B"])).json()["id"] is None
    for _ in range(5):
        await client.create(rich, models=["h-7B"], params={"max_length": 100})
    client.clock.advance(1)
    mine = (await client.create(ANON, models=["h-7B"], params={"max_length": 100})).json()["id"]
    stopped, far = await _estimate(client, mine), await _estimate(client, mine, far=True)
    # The walk stops at the first request that takes the count to the horizon: past it, the
    # figures are lower bounds (the allowance is at its floor either way).
    assert (stopped.competing_requests, stopped.competing_work) == (1, 100)
    assert (far.competing_requests, far.competing_work) == (5, 500)
    assert stopped.estimated_wait is not None
    assert stopped.estimated_wait >= client.horde.rules(client.horde.clock.now()).horizon_seconds


async def test_requests_a_slow_worker_may_take_only_without_a_capable_one(client: HordeClient) -> None:
    """Chat requests ahead that R's only eligible worker (a slow one) may take only while no capable
    worker for them is online: those a capable worker can take do not compete, those none can do."""
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
    for kind in ["a", "b", "a", "a", "b", "b", "a"]:
        chat = {"messages": [{"role": "user", "content": "Hi."}], "max_tokens": 100}
        targeting = {"workers": [slow]} if kind == "b" else {}
        response = await client.create(rich, models=["u-7B"], chat=chat, **targeting)
        assert response.status_code == 202, response.text
        client.clock.advance(1)
    created = await client.create(ANON, models=["u-7B"], workers=[slow], params={"max_length": 100})
    mine = created.json()["id"]
    near, far = await _estimate(client, mine), await _estimate(client, mine, far=True)
    assert (far.eligible_workers, far.eligible_speed) == (1, 0.5)
    assert (far.competing_requests, far.competing_work, far.competing_jobs) == (3, 300, 3)
    assert (near.competing_requests, near.competing_work) == (2, 200)  # 200 >= 150: it stops


async def test_an_estimate_reads_the_queue_from_memory(client: HordeClient) -> None:
    """A status read of a request deep in a queue runs one statement on the app's connection (its
    own row) and one on the copy's (what changed since its last read): no queue, no fleet."""
    key = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    assert (await client.pop(key, "w", models=["m-7B"])).json()["id"] is None
    for _ in range(30):
        await client.create(rich, models=["m-7B"], params={"max_length": 100})
    client.clock.advance(1)
    mine = (await client.create(ANON, models=["m-7B"], params={"max_length": 100})).json()["id"]
    await client.status(mine)  # the copy has caught up; its engine exists
    mirror_engine = client.horde.mirror.engine
    assert mirror_engine is not None
    with statements_sent(client.horde.engine) as by_app, statements_sent(mirror_engine) as by_copy:
        status = (await client.status(mine)).json()

    def work(sent: list[Sent]) -> list[str]:
        # Not the app's own background work (its policy watch reads policy_state and horde_modes now
        # and then), nor the rate limit's count (on PostgreSQL it counts in the database:
        # api/rate_counts.py).
        ours = ("policy_state", "horde_modes", "rate_counts")
        return [s.statement for s in sent if not s.control and not any(t in s.statement for t in ours)]

    app_statements, copy_statements = work(by_app), work(by_copy)
    assert (status["queue_position"], status["wait_time"]) == (31, 310)  # (30 x 100 + 100) / 10
    assert len(app_statements) == 1, app_statements
    assert len(copy_statements) == 1, copy_statements
    assert "change_log" in copy_statements[0]


@pytest.fixture
async def second(db_url: str, client: HordeClient) -> AsyncIterator[HordeClient]:
    """Another server process on the same database, with its own copy (and the same clock)."""
    app = create_app(make_settings(db_url), client.clock, run_sweeper=False)  # beside the first
    async with AsyncTestClient(app=app, timeout=30) as http:
        yield HordeClient(http, app.state.horde)


async def test_what_another_process_commits_is_in_the_next_estimate(
    client: HordeClient, second: HordeClient
) -> None:
    key = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    assert (await client.pop(key, "w1", models=["p-7B"])).json()["id"] is None
    assert (await second.pop(key, "w2", models=["p-7B"])).json()["id"] is None  # the other process's
    mine_created = await client.create(ANON, models=["p-7B"], params={"max_length": 100})
    mine = mine_created.json()["id"]
    assert (await client.status(mine)).json()["queue_position"] == 1
    # The other process: two requests ahead of R (a rich requester's).
    ahead = [(await second.create(rich, models=["p-7B"], params={"max_length": 100})).json()["id"]]
    ahead.append((await second.create(rich, models=["p-7B"], params={"max_length": 300})).json()["id"])
    est = await _estimate(client, mine)
    assert (est.eligible_workers, est.competing_requests, est.competing_work) == (2, 2, 400)
    # It cancels one, and its worker takes the other: nothing of them waits any more.
    assert (await second.http.delete(f"/api/v2/generate/text/status/{ahead[0]}")).status_code == 200
    job = (await second.pop(key, "w2", models=["p-7B"])).json()
    assert job["id"] is not None
    est = await _estimate(client, mine)
    assert (est.competing_requests, est.competing_work) == (0, 0)
    # Its worker is deleted: the copy here loses it.
    async with second.horde.sessionmaker() as session, session.begin():
        await session.execute(text("UPDATE workers SET deleted_at = 1, last_check_in = 0 WHERE name = 'w2'"))
    assert (await _estimate(client, mine)).eligible_workers == 1


async def test_a_worker_checking_in_between_two_notes_stays_online(client: HordeClient) -> None:
    """Check-ins a few seconds apart are not noted in the change log: the copy re-reads the
    check-in of a worker it would take for offline, and notes one read offline as such (its next
    check-in jumps, and is noted)."""
    horde = client.horde
    key = await client.user("owner")
    assert (await client.pop(key, "w", models=["c-7B"])).json()["id"] is None
    mine = (await client.create(ANON, models=["c-7B"], params={"max_length": 100})).json()["id"]
    start = horde.clock.now()
    assert (await _estimate(client, mine)).eligible_workers == 1
    async with horde.sessionmaker() as session, session.begin():  # a check-in 4 s later: not noted
        await session.execute(text("UPDATE workers SET last_check_in = :t"), {"t": start + 4})
    online = horde.settings.worker.online_seconds
    client.clock.advance(online + 2)  # past the check-in the copy read, not past the one it did not
    assert (await _estimate(client, mine)).eligible_workers == 1
    client.clock.advance(3)  # past both
    assert (await _estimate(client, mine)).eligible_workers == 0
    assert (await client.pop(key, "w", models=["c-7B"])).json()["id"] is not None  # back, and noted
    other = (await client.create(ANON, models=["c-7B"], params={"max_length": 100})).json()["id"]
    assert (await _estimate(client, other)).eligible_workers == 1


@pytest.mark.postgres_only
async def test_a_transaction_committed_after_a_later_one_is_still_read(
    client: HordeClient, db_url: str
) -> None:
    """PostgreSQL: a transaction that wrote its note before another's but commits after a read that
    saw the other's is read at the next catch-up (the read asks again for the transactions running
    at the last one), so the copy misses no change."""
    if not is_postgres(db_url):
        pytest.skip("PostgreSQL's concurrent writers")
    horde = client.horde
    key = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    assert (await client.pop(key, "w", models=["t-7B"])).json()["id"] is None
    early = (await client.create(rich, models=["t-7B"], params={"max_length": 100})).json()["id"]
    late = (await client.create(rich, models=["t-7B"], params={"max_length": 200})).json()["id"]
    client.clock.advance(1)
    mine = (await client.create(ANON, models=["t-7B"], params={"max_length": 100})).json()["id"]
    assert (await _estimate(client, mine)).competing_work == 300
    async with horde.sessionmaker() as first, horde.sessionmaker() as then:
        await first.execute(text("UPDATE text_requests SET n_remaining = 3 WHERE id = :r"), {"r": early})
        await then.execute(text("UPDATE text_requests SET n_remaining = 2 WHERE id = :r"), {"r": late})
        await then.commit()  # its note has the larger id, and commits first
        assert (await _estimate(client, mine)).competing_work == 100 + 400
        await first.commit()
    assert (await _estimate(client, mine)).competing_work == 300 + 400


async def test_pruned_notes_and_a_copy_left_behind(client: HordeClient) -> None:
    """The sweep prunes old notes; a copy whose last read is older than half their keeping reloads
    everything instead of reading notes that may be gone."""
    horde = client.horde
    key = await client.user("owner")
    assert (await client.pop(key, "w", models=["r-7B"])).json()["id"] is None
    first = (await client.create(ANON, models=["r-7B"], params={"max_length": 100})).json()["id"]
    assert (await _estimate(client, first)).eligible_workers == 1
    async with horde.sessionmaker() as session, session.begin():
        assert await change_log.prune(session, keep=-1) > 0  # every note, even the newest
    # A note written after the newest one was pruned still has a larger id than any read.
    rich = await client.user("rich", kudos=1_000_000)
    await client.create(rich, models=["r-7B"], params={"max_length": 300})
    assert (await _estimate(client, first)).competing_work == 300
    # A copy left behind (its last read long ago) reloads, and finds the same.
    horde.mirror._read_at -= change_log.KEEP_SECONDS
    await client.create(rich, models=["r-7B"], params={"max_length": 500})
    assert (await _estimate(client, first)).competing_work == 800
    assert await client.sweep() == (0, 0)


async def test_the_copy_follows_every_kind_of_change(client: HordeClient) -> None:
    """After each step of a horde's life (creations of several jobs, pops, submits, faults, lapses,
    cancels, expiries, a worker's new declarations and speed, maintenance, deletion), the copy the
    app caught up holds what a fresh load of the database reads."""
    horde = client.horde
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)

    async def agrees() -> None:
        await copy_matches_the_database(horde)

    await client.pop(owner, "w1", models=["f-7B"], max_length=512)
    await agrees()
    three = (await client.create(rich, models=["f-7B"], params={"max_length": 100, "n": 3})).json()["id"]
    other = (await client.create(ANON, models=["f-7B", "g-7B"], params={"max_length": 200})).json()["id"]
    await agrees()
    first = (await client.pop(owner, "w1", models=["f-7B"], max_length=512)).json()["id"]  # n: 3 -> 2
    await agrees()
    await client.submit(owner, first, state="faulted")  # the job back: n 3 again, w1 failed it
    await agrees()
    second = await client.user("second")  # w1's owner is refused by `three` since its fault
    await client.pop(second, "w2", models=["f-7B", "g-7B"], max_length=1024, max_context_length=4096)
    await agrees()
    lapsing = (await client.pop(second, "w2", models=["f-7B"], max_length=1024)).json()["id"]
    assert lapsing is not None
    client.clock.advance(horde.settings.lease.base_seconds + 1)
    await client.sweep()  # the lease lapses: the job back again
    await agrees()
    await client.set_worker_speed("w2", 3.0)  # a new speed: a new capacity
    async with horde.sessionmaker() as session, session.begin():
        await session.execute(text("UPDATE workers SET maintenance = true WHERE name = 'w1'"))
    await agrees()
    await client.cancel(other)
    await agrees()
    client.clock.advance(horde.settings.request.expiry_seconds + 1)
    await client.sweep()  # `three` expires
    await agrees()
    async with horde.sessionmaker() as session, session.begin():
        await session.execute(text("UPDATE workers SET deleted_at = 1, last_check_in = 0 WHERE name = 'w2'"))
    await agrees()
    assert (await client.status(three)).status_code in (200, 404)


async def test_the_triggers_note_a_check_in_only_past_the_jump_the_code_uses(client: HordeClient) -> None:
    """`change_log.CHECK_IN_NOTED_JUMP` repeats the triggers' number: a check-in moved forward by
    that much is not noted, by more is; one moved back always is. A pop writes its check-in at
    most every half of it, so a polling worker's are never noted."""
    key = await client.user("owner")
    await client.pop(key, "w", models=["j-7B"])
    jump = change_log.CHECK_IN_NOTED_JUMP

    count = text("SELECT count(*) FROM change_log WHERE kind = 'w'")
    move = text("UPDATE workers SET last_check_in = last_check_in + :d")

    async def noted_after(moved_by: float) -> bool:
        async with client.horde.sessionmaker() as session, session.begin():
            before = (await session.execute(count)).scalar_one()
            await session.execute(move, {"d": moved_by})
            return (await session.execute(count)).scalar_one() > before

    assert not await noted_after(jump)
    assert await noted_after(jump + 1)
    assert await noted_after(-1)
