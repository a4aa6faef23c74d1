"""Waiting pops (docs/reference/horde_api.md, "Waiting pops"): a pop with `wait_seconds` that finds
no job waits for one, is woken by a request admitted here or in another process (NOTIFY on
PostgreSQL, the watcher on SQLite), wakes only for models it serves and only as many as the jobs
need, claims nothing for a client that has gone, and upstream's pop is answered as before."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from horde_lite.clock import ManualClock
from horde_lite.core.notify import JOBS_CHANNEL, JobsArrived
from horde_lite.db.models import Generation, Worker
from horde_lite.demo.server import make_users
from horde_lite.jobs.pop_waiters import MARGIN
from horde_lite.operators import horde_modes
from tests.conftest import is_postgres, make_settings
from tests.support import prom
from tests.support.apps import app_for
from tests.support.horde import ANON, HordeClient
from tests.support.server import served
from tests.support.statements import statements_sent
from tests.support.worker_rig import MODEL, running, sqlite_rig

POP = "/api/v2/generate/text/pop"
PATIENCE = 30.0  # a hang guard, not a speed check


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.02)


async def waiting(client: HordeClient, count: int) -> None:
    await until(lambda: len(client.horde.pop_waiters) == count, f"{count} waiting pop(s)")


async def pop_aside(client: HordeClient, key: str, name: str, **body: Any) -> asyncio.Task[httpx.Response]:
    return asyncio.create_task(client.post_aside(POP, key, {"name": name, **body}))


async def count(client: HordeClient, model: type[Any]) -> int:
    async with client.horde.sessionmaker() as session:
        return int((await session.execute(select(func.count()).select_from(model))).scalar_one())


async def test_a_waiting_pop_gets_a_request_created_while_it_waits(client: HordeClient) -> None:
    key = await client.user("volunteer")
    pop = await pop_aside(client, key, "w1", models=["m"], wait_seconds=20)
    await waiting(client, 1)
    created = (await client.create(ANON, models=["m"])).json()
    answer = (await pop).json()
    assert answer["id"] is not None
    assert answer["model"] == "m"
    assert answer["wait_seconds"] == 20
    status = (await client.status(created["id"])).json()
    assert status["processing"] == 1
    assert status["waiting"] == 0
    metrics = await client.metrics()
    assert prom.value(metrics, "horde_pop_woken_total", outcome="job") == 1
    assert prom.value(metrics, "horde_pop_wakeups_total", source="local") >= 1
    assert prom.value(metrics, "horde_pop_waiting") == 0


async def test_the_bound_reached_answers_empty_with_skipped_and_messages(client: HordeClient) -> None:
    key = await client.user("volunteer")
    # A request too long for this worker: counted in `skipped`, never handed out.
    await client.create(ANON, models=["m"], params={"max_length": 512})
    answer = (await client.pop(key, "w1", models=["m"], max_length=64, wait_seconds=1)).json()
    assert answer["id"] is None
    assert answer["ids"] == []
    assert answer["payload"] == {}
    assert answer["skipped"] == {"max_length": 1}
    assert answer["messages"] == []
    assert answer["wait_seconds"] == 1
    assert await count(client, Generation) == 0
    assert len(client.horde.pop_waiters) == 0


@pytest.mark.slow
async def test_a_cancelled_request_wakes_nothing_and_is_claimed_by_no_one(client: HordeClient) -> None:
    key = await client.user("volunteer")
    created = (await client.create(ANON, models=["m"], params={"max_length": 512})).json()
    pop = await pop_aside(client, key, "w1", models=["m"], max_length=64, wait_seconds=2)
    await waiting(client, 1)
    cancelled = await client.cancel(created["id"])
    assert cancelled.status_code == 200
    answer = (await pop).json()
    assert answer["id"] is None
    metrics = await client.metrics()
    assert prom.value(metrics, "horde_pop_wakeups_total") == 0
    assert await count(client, Generation) == 0


@pytest.mark.slow
async def test_a_worker_whose_models_do_not_match_stays_waiting(client: HordeClient) -> None:
    key = await client.user("volunteer")
    pop = await pop_aside(client, key, "w1", models=["a"], wait_seconds=2)
    await waiting(client, 1)
    created = (await client.create(ANON, models=["b"])).json()
    answer = (await pop).json()
    assert answer["id"] is None
    assert prom.value(await client.metrics(), "horde_pop_wakeups_total") == 0
    assert (await client.status(created["id"])).json()["waiting"] == 1


@pytest.mark.slow
async def test_many_waiters_one_job_one_gets_it_and_few_try(client: HordeClient) -> None:
    key = await client.user("volunteer")
    names = [f"w{i}" for i in range(4)]
    for name in names:  # the workers first: four first pops take turns on their owner's row, and on
        await client.pop(key, name, models=["m"])  # a loaded machine outlasted the 3 s wait
    pops = [await pop_aside(client, key, name, models=["m"], wait_seconds=3) for name in names]
    await waiting(client, len(names))
    await client.create(ANON, models=["m"])
    answers = [(await pop).json() for pop in pops]
    assert sum(a["id"] is not None for a in answers) == 1
    metrics = await client.metrics()
    assert prom.value(metrics, "horde_pop_woken_total", outcome="job") == 1
    # The job and its margin woke, no more: the other waiters kept waiting to their bound.
    tries = prom.value(metrics, "horde_pop_woken_total")
    assert 1 <= tries <= 1 + MARGIN < len(names)
    assert await count(client, Generation) == 1


@pytest.mark.slow
async def test_a_wake_up_for_a_job_another_process_took_is_not_handed_on(client: HordeClient) -> None:
    key = await client.user("volunteer")
    created = (await client.create(ANON, models=["m"])).json()
    taken = await client.post_aside(POP, key, {"name": "taker", "models": ["m"]})
    assert taken.json()["id"] is not None  # the request has no job left to hand out
    names = [f"w{i}" for i in range(6)]
    pops = [await pop_aside(client, key, name, models=["m"], wait_seconds=2) for name in names]
    await waiting(client, len(names))
    # Another process's announcement of that job, as the LISTEN connection delivers it.
    client.horde.notifier.received_jobs(JobsArrived(created["id"], ("m",), 1).payload("another-process"))
    answers = [(await pop).json() for pop in pops]
    assert all(a["id"] is None for a in answers)
    metrics = await client.metrics()
    # The woken pops found nothing and the request has no job: nobody else was woken for it.
    assert prom.value(metrics, "horde_pop_woken_total") == 1 + MARGIN < len(names)
    assert prom.value(metrics, "horde_pop_wakeups_total", source="handed") == 0


async def test_a_job_given_back_wakes_a_waiting_pop(client: HordeClient) -> None:
    """A faulted job returns to its request (its worker's owner may not take it again): a waiting
    pop of another owner is woken for it."""
    first, second = await client.user("first"), await client.user("second")
    created = (await client.create(ANON, models=["m"])).json()
    job = (await client.pop(first, "w1", models=["m"])).json()
    assert job["id"] is not None
    pop = await pop_aside(client, second, "w2", models=["m"], wait_seconds=20)
    await waiting(client, 1)
    faulted = await client.submit(first, job["id"], state="faulted")
    assert faulted.status_code == 200, faulted.text
    answer = (await pop).json()
    assert answer["id"] is not None
    assert answer["id"] != job["id"]
    assert (await client.status(created["id"])).json()["processing"] == 1


@pytest.mark.slow
async def test_a_switch_of_the_horde_modes_wakes_each_waiting_pop_once(client: HordeClient) -> None:
    """Every pop reads the modes in force: a switch may free jobs a mode held back, so each waiting
    pop tries once more (here it finds none and waits on to its bound)."""
    key = await client.user("volunteer")
    pop = await pop_aside(client, key, "w1", models=["m"], wait_seconds=2)
    await waiting(client, 1)
    await horde_modes.switch(client.horde, {"raid": True}, "test", "test")
    assert (await pop).json()["id"] is None
    metrics = await client.metrics()
    assert prom.value(metrics, "horde_pop_wakeups_total", source="switch") == 1
    assert prom.value(metrics, "horde_pop_woken_total", outcome="empty") == 1


async def test_a_request_naming_no_model_wakes_any_waiter(client: HordeClient) -> None:
    key = await client.user("volunteer")
    pop = await pop_aside(client, key, "w1", models=["anything"], wait_seconds=20)
    await waiting(client, 1)
    await client.create(ANON)
    assert (await pop).json()["id"] is not None


@pytest.mark.parametrize("wait", [-1, 61, 10**9, "x", 1.5, True, None, [], {"a": 1}])
async def test_hostile_wait_seconds_get_a_400_and_store_nothing(client: HordeClient, wait: Any) -> None:
    key = await client.user("volunteer")
    answer = await client.pop(key, "w1", models=["m"], wait_seconds=wait)
    assert answer.status_code == 400, answer.text
    assert set(answer.json()) >= {"message", "rc"}
    assert "wait_seconds" in answer.json()["message"]
    assert await count(client, Worker) == 0
    assert len(client.horde.pop_waiters) == 0


async def test_upstreams_pop_without_the_field_is_answered_as_before(client: HordeClient) -> None:
    key = await client.user("volunteer")
    for body in ({}, {"wait_seconds": 0}):
        started = time.monotonic()
        empty = (await client.pop(key, "w1", models=["m"], **body)).json()
        assert empty == {
            "id": None, "ids": [], "payload": {}, "skipped": {}, "messages": [],
        }  # fmt: skip
        assert time.monotonic() - started < PATIENCE
    await client.create(ANON, models=["m"])
    job = (await client.pop(key, "w1", models=["m"])).json()
    assert job["id"] is not None
    assert "wait_seconds" not in job
    assert len(client.horde.pop_waiters) == 0


async def test_waiting_turned_off_horde_wide_answers_at_once_with_zero(db_url: str) -> None:
    from litestar.testing import AsyncTestClient

    app = app_for(make_settings(db_url, pops={"wait_max_seconds": 0}), ManualClock())
    async with AsyncTestClient(app=app, timeout=30) as http:
        client = HordeClient(http, app.state.horde)
        key = await client.user("volunteer")
        answer = (await client.pop(key, "w1", models=["m"], wait_seconds=30)).json()
        assert answer["id"] is None
        assert answer["wait_seconds"] == 0
        assert prom.value(await client.metrics(), "horde_pop_woken_total") == 0


# --- real server processes -------------------------------------------------------------------------


async def _waiting_on(base: str, count: int, within: float = PATIENCE) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        deadline = time.monotonic() + within
        while True:
            if prom.value((await http.get("/metrics")).text, "horde_pop_waiting") == count:
                return
            assert time.monotonic() < deadline, f"never {count} waiting pop(s) on {base}"
            await asyncio.sleep(0.05)


async def test_a_creations_writes_and_its_notify_are_one_statement(client: HordeClient, db_url: str) -> None:
    """PostgreSQL: a funded request under a rate limit is written (the request, its model, its
    records, its limit's note, its hold) in one statement, which also sends its jobs' NOTIFY, heard
    once by a listener; SQLite has no NOTIFY and writes the same rows."""
    mod = await client.user("mod", moderator=True)
    rich = await client.user("rich", kudos=1000)
    found = await client.http.get("/api/v2/find_user", headers={"apikey": rich})
    limited = await client.http.put(
        f"/api/v2/users/{found.json()['id']}", json={"requests_per_minute": 10}, headers={"apikey": mod}
    )
    assert limited.status_code == 200, limited.text
    heard: list[str] = []
    async with _jobs_listener(db_url, heard):
        with statements_sent(client.horde.engine) as sent:
            created = await client.create(rich, models=["m-12B"], slow_workers=False, params={"n": 2})
        assert created.status_code == 202, created.text
        request_id = created.json()["id"]
        if is_postgres(db_url):
            await until(lambda: bool(heard), "the creation's NOTIFY")
    writes = [
        s.statement
        for s in sent
        if ("INSERT INTO" in s.statement or "pg_notify" in s.statement) and "rate_counts" not in s.statement
    ]  # the address's rate-limit count is written before the route runs
    for table in ("text_requests", "request_models", "admission_records", "limit_admissions", "kudos_holds"):
        assert [w for w in writes if f"INSERT INTO {table} " in w], (table, writes)
    if is_postgres(db_url):
        assert len(writes) == 1, writes
        assert "pg_notify" in writes[0], writes
        assert [JobsArrived.parse(h.partition(":")[2]) for h in heard] == [
            JobsArrived(request_id, ("m-12B",), 2)
        ]
    else:
        assert not [w for w in writes if "pg_notify" in w]


async def test_jobs_announced_after_a_notice_go_at_commit(client: HordeClient, db_url: str) -> None:
    """`Notifier.jobs_notice` takes what the transaction announced so far; a job announced after it
    is sent at commit: each once. Nothing at all without the commit."""
    if not is_postgres(db_url):
        pytest.skip("NOTIFY is PostgreSQL's")
    notifier = client.horde.notifier
    first, second = JobsArrived("r-1", ("m",), 1), JobsArrived("r-2", (), 3)
    heard: list[str] = []
    async with _jobs_listener(db_url, heard):
        async with client.horde.sessionmaker() as session, session.begin():
            notifier.jobs_on_commit(session, first)
            notice = notifier.jobs_notice(session)
            assert notice is not None
            await session.execute(notice.statement, notice.params)
            assert notifier.jobs_notice(session) is None  # nothing new since
            notifier.jobs_on_commit(session, second)
        with pytest.raises(_RolledBack):
            await _announced_then_rolled_back(client, JobsArrived("r-3", (), 1))
        await until(lambda: len(heard) >= 2, "both announcements")
        await asyncio.sleep(0.3)  # room for a duplicate or the rolled-back one to arrive
    assert [JobsArrived.parse(h.partition(":")[2]) for h in heard] == [first, second]


class _RolledBack(Exception):
    pass


async def _announced_then_rolled_back(client: HordeClient, arrived: JobsArrived) -> None:
    async with client.horde.sessionmaker() as session, session.begin():
        client.horde.notifier.jobs_on_commit(session, arrived)
        notice = client.horde.notifier.jobs_notice(session)
        assert notice is not None
        await session.execute(notice.statement, notice.params)
        raise _RolledBack


@contextlib.asynccontextmanager
async def _jobs_listener(db_url: str, heard: list[str]) -> AsyncIterator[None]:
    """A LISTEN of our own on the jobs channel (PostgreSQL; nothing elsewhere), its payloads in
    `heard`."""
    if not is_postgres(db_url):
        yield
        return
    import asyncpg
    from sqlalchemy.engine import make_url

    url = make_url(db_url)
    conn = await asyncpg.connect(
        host=url.host, port=url.port or 5432, user=url.username, database=url.database
    )
    try:
        await conn.add_listener(JOBS_CHANNEL, lambda *args: heard.append(args[-1]))
        yield
    finally:
        await conn.close()


@pytest.mark.slow
async def test_a_waiting_pop_is_woken_by_a_request_created_in_another_process(
    db_url: str, tmp_path: Path
) -> None:
    """PostgreSQL: the NOTIFY on the jobs channel; SQLite (two processes on one file): the
    watcher's check of the change log."""
    keys = await make_users(db_url, {"volunteer": 0})
    # On PostgreSQL the watcher stays off (the listener is up): only the NOTIFY can wake the pop.
    overrides: dict[str, dict[str, object]] = {"pops": {"wait_poll_seconds": 0.2}}
    with served(db_url, overrides, tmp_path) as one, served(db_url, overrides, tmp_path) as other:
        async with httpx.AsyncClient(timeout=PATIENCE) as http:
            if is_postgres(db_url):
                await _listening(db_url, 2)
            body = {"name": "w1", "models": ["m"], "wait_seconds": 20}
            pop = asyncio.create_task(
                http.post(f"{one.base}{POP}", json=body, headers={"apikey": keys["volunteer"]})
            )
            await _waiting_on(one.base, 1)
            created = await http.post(
                f"{other.base}/api/v2/generate/text/async", json={"prompt": "Hi.", "models": ["m"]},
                headers={"apikey": ANON},
            )  # fmt: skip
            assert created.status_code == 202, created.text
            answer = (await pop).json()
            assert answer["id"] is not None
            metrics = (await http.get(f"{one.base}/metrics")).text
            source = "remote" if is_postgres(db_url) else "poll"
            assert prom.value(metrics, "horde_pop_wakeups_total", source=source) >= 1


async def _listening(db_url: str, processes: int) -> None:
    """Wait until `processes` server processes LISTEN on the jobs channel (they connect at
    start-up, after they answer): a NOTIFY sent before would reach none of them."""
    import asyncpg
    from sqlalchemy.engine import make_url

    url = make_url(db_url)
    conn = await asyncpg.connect(
        host=url.host, port=url.port or 5432, user=url.username, database=url.database
    )
    try:
        deadline = time.monotonic() + PATIENCE
        while True:
            found = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND query LIKE 'LISTEN %jobs%'",
                url.database,
            )
            if found >= processes:
                return
            assert time.monotonic() < deadline, "the servers never listened"
            await asyncio.sleep(0.1)
    finally:
        await conn.close()


@pytest.mark.slow
async def test_a_client_that_leaves_claims_nothing(db_url: str, tmp_path: Path) -> None:
    keys = await make_users(db_url, {"volunteer": 0})
    with served(db_url, {}, tmp_path) as one:
        body = {"name": "w1", "models": ["m"], "wait_seconds": 20}
        async with httpx.AsyncClient(base_url=one.base, timeout=1.0) as leaving:
            with pytest.raises(httpx.ReadTimeout):
                await leaving.post(POP, json=body, headers={"apikey": keys["volunteer"]})
        # The server saw the client go and stopped waiting, well before the pop's bound.
        await _waiting_on(one.base, 0, within=10)
        async with httpx.AsyncClient(base_url=one.base, timeout=PATIENCE) as http:
            request = {"prompt": "Hi.", "models": ["m"]}
            answer = await http.post("/api/v2/generate/text/async", json=request, headers={"apikey": ANON})
            created = answer.json()
            status = (await http.get(f"/api/v2/generate/text/status/{created['id']}")).json()
            assert status["waiting"] == 1
            assert status["processing"] == 0
            metrics = (await http.get("/metrics")).text
            assert prom.value(metrics, "horde_pop_woken_total") == 0
            # The job is still there for the next pop.
            job = (
                await http.post(POP, json={**body, "wait_seconds": 0}, headers={"apikey": keys["volunteer"]})
            ).json()
            assert job["id"] is not None


@pytest.mark.slow
async def test_horde_lite_worker_waits_at_the_horde_and_is_woken(
    tmp_path: Path, sqlite_template: Path
) -> None:
    """`horde-lite worker` asks to wait: a request created while it waits is taken by its woken pop
    (counted by the horde as a woken try), not by a later poll after a back-off."""
    async with sqlite_rig(tmp_path, sqlite_template) as rig, running(rig.worker("waiter", wait_seconds=20)):
        await rig.online("waiter")
        await _waiting_on(rig.horde_url, 1)
        body = {"prompt": "Hi.", "models": [MODEL], "params": {"max_length": 16}}
        created = (await rig.http.post("/api/v2/generate/text/async", json=body)).json()
        assert (await rig.until_done(created["id"]))["done"] == 1
        metrics = (await rig.http.get("/metrics")).text
        assert prom.value(metrics, "horde_pop_woken_total", outcome="job") == 1


async def test_the_schema_states_wait_seconds_in_the_pop_and_its_answer(client: HordeClient) -> None:
    schema = (await client.http.get("/api/swagger.json")).json()
    components = schema["components"]["schemas"]
    body = next(c for name, c in components.items() if name.endswith("PopInput"))
    expected = {"type": "integer", "minimum": 0, "maximum": 60, "default": 0}
    assert body["properties"]["wait_seconds"] == expected
    answer = components["GenerationPayloadKobold"]
    assert answer["properties"]["wait_seconds"] == answer["properties"]["ttl"]  # an optional integer
    assert "wait_seconds" not in answer.get("required", [])
