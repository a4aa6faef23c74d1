"""Pop, lease and submit (docs/reference/horde_api.md, "Workers"; docs/reference/chat_requests.md,
"Job lease"): the pop answer's shape, the lease (`ttl`),
DuplicateGen, AbortedGen, WrongCredentials, faults and lapses giving the job back, faulting after
more than 2 failures, lease speed samples and capacity, and concurrent pops on both databases."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from typing import Any

import httpx
import msgspec
import pytest
from sqlalchemy import event, select, text
from sqlalchemy.orm import Session

from horde_lite.accounts.workers import CHECK_IN_RESOLUTION
from horde_lite.core.context import Caller
from horde_lite.db.models import Generation, User, Worker
from horde_lite.inputs import PopInput
from horde_lite.jobs import dispatch
from horde_lite.requests import status
from tests.conftest import is_postgres
from tests.support.horde import ANON, HordeClient, quote
from tests.support.statements import statements_sent


def _post_blocking(client: HordeClient, path: str, key: str, body: dict[str, Any]) -> httpx.Response:
    """POST through the app's ASGI transport from a worker thread. AsyncTestClient runs the app on
    a blocking portal, so its own awaits are serialized; calls made from several threads at once
    run concurrently on that portal's event loop, like requests from several real workers."""
    request = httpx.Request("POST", f"{client.http.base_url}{path}", json=body, headers={"apikey": key})
    response = client.http._transport.handle_request(request)  # type: ignore[attr-defined]
    response.read()
    return response


async def concurrently(
    client: HordeClient, path: str, calls: list[tuple[str, dict[str, Any]]], allowed: tuple[str, ...] = ()
) -> list[Any]:
    """Send (key, body) POSTs to `path` all at once; returns the decoded answers in order. Every
    answer must be a 200 or an error whose rc is `allowed`."""
    answers = await asyncio.gather(
        *(asyncio.to_thread(_post_blocking, client, path, key, body) for key, body in calls)
    )
    for a in answers:
        assert a.status_code == 200 or (a.status_code < 500 and a.json()["rc"] in allowed), a.text
    return [a.json() for a in answers]


async def _rows(client: HordeClient, sql: str, **params: Any) -> list[Any]:
    async with client.horde.sessionmaker() as session:
        return list((await session.execute(text(sql), params)).all())


async def _worker(client: HordeClient, name: str) -> dict[str, Any]:
    [(worker_id,)] = await _rows(client, "SELECT id FROM workers WHERE name = :n", n=name)
    return (await client.http.get(f"/api/v2/workers/{worker_id}")).json()


async def test_job_answer_shape(client: HordeClient) -> None:
    key = await client.user("owner")
    await client.create(ANON, models=["m-12B"], params={"max_length": 64})
    job = (await client.pop(key, "w1", models=["m-12B"])).json()
    assert job["ttl"] == 150
    assert isinstance(job["id"], str)
    assert job["ids"] == [job["id"]]
    assert job["model"] == "m-12B"
    assert job["skipped"] == {}
    assert job["payload"]["max_length"] == 64
    [(popped_at, expires_at)] = await _rows(client, "SELECT popped_at, lease_expires_at FROM generations")
    assert expires_at - popped_at == 150
    assert popped_at == client.clock.now()


async def test_no_job_answer_shape(client: HordeClient) -> None:
    key = await client.user("owner")
    empty = await client.pop(key, "w1")
    assert empty.status_code == 200
    body = empty.json()
    assert body["id"] is None
    assert body["ids"] == []
    assert body["skipped"] == {}
    assert body["messages"] == []  # upstream's: the worker's unexpired messages
    # `payload` is present (empty) because horde-sdk's pop response model requires it.
    assert set(body) == {"id", "ids", "skipped", "payload", "messages"}
    await client.pop(key, "w1", max_length=2048, max_context_length=4096)
    await client.create(ANON, params={"max_length": 1024, "max_context_length": 4096})
    skipped = (await client.pop(key, "w1", max_length=512, max_context_length=4096)).json()
    assert skipped["id"] is None
    assert skipped["ids"] == []
    assert skipped["skipped"] == {"max_length": 1}


async def test_duplicate_submit_pays_nothing(client: HordeClient) -> None:
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=1000)
    await client.create(rich, models=["m-12B"])
    job = (await client.pop(owner, "w1", models=["m-12B"])).json()
    first = await client.submit(owner, job["id"], "x" * 100)
    assert first.status_code == 200
    reward = first.json()["reward"]
    assert reward > 0
    balances = (await client.balance("owner"), await client.balance("rich"))
    assert balances == (reward, round(1000 - reward - 1, 2))
    again = await client.submit(owner, job["id"], "x" * 4000)
    assert again.status_code == 400
    assert again.json()["rc"] == "DuplicateGen"
    assert (await client.balance("owner"), await client.balance("rich")) == balances
    assert (await _worker(client, "w1"))["requests_fulfilled"] == 1


async def test_a_submit_leaves_its_commit_no_flush(client: HordeClient) -> None:
    """A stored submit writes its rows as Core statements: the session's unit of work is never run
    (a flush at commit with nothing to write costs more than the submit's own statements)."""
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=1000)
    await client.create(rich, models=["m-12B"])
    job = (await client.pop(owner, "w1", models=["m-12B"])).json()
    flushed: list[str] = []

    def note(session: Session, *_: Any) -> None:
        flushed.append(", ".join(sorted(type(row).__name__ for row in session.dirty | session.new)))

    event.listen(Session, "before_flush", note)
    try:
        submitted = await client.submit(owner, job["id"], "x" * 100)
    finally:
        event.remove(Session, "before_flush", note)
    assert submitted.status_code == 200
    assert flushed == []
    reward = submitted.json()["reward"]
    assert reward > 0  # the writes were made all the same: the worker is paid, the job is done
    assert await client.balance("owner") == reward
    assert (await _worker(client, "w1"))["requests_fulfilled"] == 1


async def test_concurrent_submits_of_one_job_pay_once(client: HordeClient) -> None:
    owner = await client.user("owner")
    await client.create(ANON, models=["m-12B"])
    job = (await client.pop(owner, "w1", models=["m-12B"])).json()
    body = {"id": job["id"], "generation": "x" * 100, "state": "ok"}
    answers = await asyncio.gather(
        *(
            asyncio.to_thread(_post_blocking, client, "/api/v2/generate/text/submit", owner, body)
            for _ in range(4)
        )
    )
    codes = Counter(a.status_code for a in answers)
    assert codes == {200: 1, 400: 3}
    assert {a.json()["rc"] for a in answers if a.status_code == 400} == {"DuplicateGen"}
    assert len(await _rows(client, "SELECT id FROM kudos_events WHERE kind = 'reward'")) == 1


async def test_submit_by_another_user(client: HordeClient) -> None:
    owner = await client.user("owner")
    thief = await client.user("thief")
    await client.create(ANON)
    job = (await client.pop(owner, "w1")).json()
    stolen = await client.submit(thief, job["id"], "mine now")
    assert stolen.status_code == 403
    assert stolen.json()["rc"] == "WrongCredentials"
    anon = await client.submit(ANON, job["id"], "mine now")
    assert anon.status_code == 403
    assert (await client.submit(owner, job["id"], "real")).status_code == 200
    assert await client.balance("thief") == 0


async def test_unknown_generation(client: HordeClient) -> None:
    owner = await client.user("owner")
    for gen_id in ("00000000-0000-4000-8000-000000000000", "nope"):
        response = await client.submit(owner, gen_id, "x")
        assert response.status_code == 404
        assert response.json()["rc"] == "InvalidJobID"


async def test_a_posts_key_is_judged_before_its_job_and_read_with_it(client: HordeClient) -> None:
    """The owner's key is read in the statement that reads the job's request; a key that is not a
    registered user's own answers as before, whether or not the job exists: an unknown key
    InvalidAPIKey, a shared key WrongCredentials, and only a good key learns InvalidJobID."""
    owner = await client.user("owner", kudos=100)
    await client.create(ANON)
    job = (await client.pop(owner, "w1")).json()
    shared = await client.http.post("/api/v2/sharedkeys", json={"kudos": 10}, headers={"apikey": owner})
    assert shared.status_code == 200, shared.text
    missing = "00000000-0000-4000-8000-000000000000"
    for gen_id in (job["id"], missing):
        unknown = await client.submit("not-a-key", gen_id)
        assert (unknown.status_code, unknown.json()["rc"]) == (401, "InvalidAPIKey")
        by_shared = await client.submit(shared.json()["id"], gen_id)
        assert (by_shared.status_code, by_shared.json()["rc"]) == (403, "WrongCredentials")
    gone = await client.submit(owner, missing)
    assert (gone.status_code, gone.json()["rc"]) == (404, "InvalidJobID")
    with statements_sent(client.horde.engine) as sent:
        assert (await client.submit(owner, job["id"])).status_code == 200
    reads = [s.statement for s in sent if "FROM users" in s.statement or "JOIN users" in s.statement]
    assert len(reads) == 1, reads
    assert "FROM text_requests JOIN users" in reads[0], reads


async def test_a_stored_submit_counts_its_statements(client: HordeClient, db_url: str) -> None:
    """The job's request with the poster, the job with its worker, the balances (ascending, before
    their ledger rows), then every other write of the settlement: the ledger's two rows, the hour's
    usage row, the assignment record's outcome and the job's three rows, one statement on
    PostgreSQL. What they store is what separate statements store (SQLite sends them apart)."""
    owner = await client.user("owner")
    requester = await client.user("requester", kudos=100)
    request_id = (await client.create(requester, models=["m-12B"])).json()["id"]
    job = (await client.pop(owner, "w1", models=["m-12B"])).json()
    with statements_sent(client.horde.engine) as sent:
        assert (await client.submit(owner, job["id"], "y" * 39)).status_code == 200  # 10 tokens
    statements = [s.statement for s in sent if not s.control]
    assert len(statements) == (4 if is_postgres(db_url) else 9), statements
    reward = await client.expected_reward(request_id, 10, "m-12B")
    assert reward > 0
    assert await client.balance("owner") == reward
    assert await client.balance("requester") == round(100 - reward - 1, 2)
    async with client.horde.sessionmaker() as session:
        ledger = (await session.execute(text("SELECT kind, amount FROM kudos_events WHERE ref = :g"),
                                        {"g": job["id"]})).all()  # fmt: skip
        used = (
            await session.execute(text("SELECT jobs, tokens, kudos_spent, kudos_earned FROM usage_records"))
        ).one()
        outcome = (await session.execute(text("SELECT outcome FROM assignment_records"))).scalar_one()
    assert sorted(ledger) == sorted([("reward", reward), ("charge", -round(reward + 1, 2))])
    assert tuple(used) == (1, 10, round(reward + 1, 2), reward)
    assert outcome == "completed"


async def test_submit_after_the_lease_lapsed_is_aborted_even_before_the_sweep(client: HordeClient) -> None:
    owner = await client.user("owner")
    request_id = (await client.create(ANON)).json()["id"]
    job = (await client.pop(owner, "w1")).json()
    client.clock.advance(150.5)
    late = await client.submit(owner, job["id"], "too late")
    assert late.status_code == 400
    assert late.json()["rc"] == "AbortedGen"
    status = (await client.status(request_id)).json()
    assert (status["restarted"], status["waiting"], status["processing"], status["finished"]) == (1, 1, 0, 0)
    assert (await _worker(client, "w1"))["aborted_jobs"] == 1
    assert await client.balance("owner") == 0
    # Asking again gives the same answer; the job is offered again, to another owner's workers.
    assert (await client.submit(owner, job["id"], "still")).json()["rc"] == "AbortedGen"
    assert (await client.pop(owner, "w2")).json()["id"] is None
    assert (await client.pop(await client.user("other"), "x1")).json()["id"] is not None


async def test_a_late_post_keeps_the_lapse_it_finds(client: HordeClient) -> None:
    """The late submit itself aborts the job and gives it back (no status read, no sweep between),
    in the transaction it then commits; a post from another user's key changes nothing."""
    owner, other = await client.user("owner"), await client.user("other")
    request_id = (await client.create(ANON)).json()["id"]
    job = (await client.pop(owner, "w1")).json()
    client.clock.advance(151)

    async def rows() -> tuple[Any, ...]:
        async with client.horde.sessionmaker() as session:
            found = await session.execute(
                text("SELECT g.state, r.n_remaining, r.restarts, w.aborted_jobs FROM generations g "
                     "JOIN text_requests r ON r.id = g.request_id JOIN workers w ON w.id = g.worker_id "
                     "WHERE g.id = :id"), {"id": job["id"]})  # fmt: skip
            return tuple(found.one())

    wrong = await client.submit(other, job["id"], "not mine")
    assert (wrong.status_code, wrong.json()["rc"]) == (403, "WrongCredentials")
    assert await rows() == ("processing", 0, 0, 0)
    late = await client.submit(owner, job["id"], "too late")
    assert (late.status_code, late.json()["rc"]) == (400, "AbortedGen")
    assert await rows() == ("aborted", 1, 1, 1)
    assert (await client.status(request_id)).json()["restarted"] == 1  # counted once


async def test_a_status_read_honours_a_lapse_before_the_sweep(client: HordeClient) -> None:
    """A status read sees its request's lapsed job in the rows it reads, gives the job back (in its
    own transaction: kept) and answers with the job waiting again; a live job stays processing."""
    owner = await client.user("owner")
    request_id = (await client.create(ANON, params={"n": 2, "max_length": 64})).json()["id"]
    early = (await client.pop(owner, "w1")).json()["id"]
    client.clock.advance(100)
    late = (await client.pop(owner, "w2")).json()["id"]
    client.clock.advance(51)  # the first lease (150 s) has run out, the second has not
    status = (await client.status(request_id)).json()
    assert (status["processing"], status["waiting"], status["restarted"]) == (1, 1, 1)
    async with client.horde.sessionmaker() as session:
        states = dict((await session.execute(text("SELECT id, state FROM generations"))).all())
    assert states == {early: "aborted", late: "processing"}
    assert await client.sweep() == (0, 0)  # nothing left for the sweep


async def test_a_status_poll_reads_outside_any_transaction(client: HordeClient, db_url: str) -> None:
    """Clients poll status: its read opens no transaction, so on SQLite it answers while another
    transaction holds the write lock (it waited out the busy timeout before, then answered 503),
    and on PostgreSQL its statement runs in autocommit (no BEGIN or COMMIT round trip)."""
    owner = await client.user("owner")
    request_id = (await client.create(ANON)).json()["id"]
    await client.pop(owner, "w1")
    with statements_sent(client.horde.engine) as sent:
        async with client.horde.transaction() as session:  # a writer holds its transaction open
            await session.execute(text("UPDATE workers SET name = name"))
            polled = await client.status(request_id)
    isolation = [s.options.get("isolation_level") for s in sent if "FROM text_requests" in s.statement]
    assert polled.status_code == 200, polled.text
    assert (polled.json()["processing"], polled.json()["waiting"]) == (1, 0)
    assert isolation == (["AUTOCOMMIT"] if is_postgres(db_url) else [None])


async def test_an_idle_pop_reads_outside_any_transaction(client: HordeClient, db_url: str) -> None:
    """Idle workers poll: a pop whose check-in would write nothing and that finds nothing to take
    opens no transaction. On SQLite it answers while another transaction holds the write lock (it
    waited out the busy timeout before, then answered 503); on PostgreSQL every statement runs in
    autocommit. Its answer is the pop's own: no job, the requests it is too small for counted."""
    owner = await client.user("owner")
    await client.pop(owner, "w1", models=["m"])  # the check-in: this pop writes
    await client.pop(owner, "big", models=["m", "other"], max_length=1024)
    await client.create(ANON, models=["other"])  # a model w1 does not serve
    await client.create(ANON, models=["m"], params={"max_length": 1024})  # longer than w1 takes
    async with client.horde.transaction() as session:  # a writer holds its transaction open
        await session.execute(text("UPDATE workers SET name = name"))
        with statements_sent(client.horde.engine) as sent:
            polled = await client.pop(owner, "w1", models=["m"])
    isolation = [s.options.get("isolation_level") for s in sent]
    assert polled.status_code == 200, polled.text
    assert polled.json()["id"] is None
    assert polled.json()["skipped"]["max_length"] == 1
    assert isolation
    assert set(isolation) == ({"AUTOCOMMIT"} if is_postgres(db_url) else {None})
    # A pop that finds something to take claims it in a transaction, as before.
    job = (await client.pop(owner, "w1", models=["m"], max_length=1024)).json()
    assert job["id"] is not None


async def test_a_worker_deleted_between_a_pops_read_and_its_claim_gets_no_job(client: HordeClient) -> None:
    """A pop reads its worker before its transaction and does not lock it there. A deletion that
    commits in between keeps the worker offline: the due check-in time is not written to the
    deleted row, and the claim, which judges the worker's live row, hands it nothing."""
    owner = await client.user("owner")
    await client.pop(owner, "w1")
    worker_id = (await client.http.get("/api/v2/workers")).json()[0]["id"]
    request_id = (await client.create(ANON)).json()["id"]
    client.clock.advance(CHECK_IN_RESOLUTION)  # the check-in time is due: the pop would write it
    body = msgspec.convert({"name": "w1"}, PopInput)
    looked = await dispatch.look(client.horde, Caller(apikey=owner), body)
    assert isinstance(looked, dispatch.Looked)
    assert looked.stamp
    assert looked.page.rows
    deleted = await client.http.delete(f"/api/v2/workers/{worker_id}", headers={"apikey": owner})
    assert deleted.status_code == 200, deleted.text
    async with client.horde.transaction() as session:
        _, job = await dispatch.pop(session, client.horde, looked.owner, body, looked=looked)
    assert job is None
    [(last_check_in,)] = await _rows(client, "SELECT last_check_in FROM workers WHERE id = :w", w=worker_id)
    assert last_check_in == 0
    assert (await client.status(request_id)).json()["waiting"] == 1


_DECLARED = {"models": ["m"], "max_length": 512, "max_context_length": 2048, "threads": 1,
             "bridge_agent": "a:1:x", "nsfw": False, "priority_usernames": []}  # fmt: skip
_CHANGED: list[tuple[str, Any, str, Any]] = [
    # (what the pop declares, its new value, the worker's column, what the column must hold)
    ("models", ["m", "n"], "models", ["m", "n"]),
    ("max_length", 1024, "max_length", 1024),
    ("max_context_length", 4096, "max_context_length", 4096),
    ("threads", 2, "threads", 2),
    ("bridge_agent", "b:2:y", "bridge_agent", "b:2:y"),
    ("nsfw", True, "nsfw", True),
    ("priority_usernames", ["friend"], "priority_user_ids", "friend"),
    ("chat", {"max_completion_tokens": 256, "max_context_tokens": 4096, "features": ["tools"]},
     "chat_features", ["tools"]),
]  # fmt: skip


@pytest.mark.parametrize(("field", "value", "column", "stored"), _CHANGED, ids=[c[0] for c in _CHANGED])
async def test_a_pop_right_after_a_check_in_still_stores_a_new_declaration(
    client: HordeClient, field: str, value: Any, column: str, stored: Any
) -> None:
    """Only a pop that would write nothing is answered outside a transaction: a declaration changed
    a moment after the last check-in (no check-in time due) is stored at once, as each pop did."""
    owner = await client.user("owner")
    await client.user("friend")  # a priority username must name a user
    assert (await client.pop(owner, "w1", **_DECLARED)).status_code == 200
    assert (await client.pop(owner, "w1", **_DECLARED)).status_code == 200  # unchanged: idle
    assert (await client.pop(owner, "w1", **{**_DECLARED, field: value})).status_code == 200
    async with client.horde.sessionmaker() as session:
        worker = (await session.execute(select(Worker).where(Worker.name == "w1"))).scalar_one()
        if stored == "friend":  # the user's id, known only now
            stored = [(await session.execute(select(User.id).where(User.username == "friend"))).scalar_one()]
    assert getattr(worker, column) == stored


async def test_a_pop_right_after_its_owner_became_trusted_stores_the_trust(client: HordeClient) -> None:
    owner = await client.user("owner")
    await client.pop(owner, "w1")
    async with client.horde.transaction() as session:
        await session.execute(text("UPDATE users SET trusted = :t WHERE username = 'owner'"), {"t": True})
    await client.pop(owner, "w1")  # no check-in is due, but the owner's trust changed
    async with client.horde.sessionmaker() as session:
        assert (await session.execute(select(Worker.trusted))).scalar_one() is True


async def test_the_read_only_routes_answer_while_a_writer_holds_its_transaction(client: HordeClient) -> None:
    """The listings and counts that dashboards, clients and Prometheus poll read outside any
    transaction too: on SQLite none of them waits for the write lock another transaction holds
    (each waited out SQLite's busy timeout before, then answered 503)."""
    owner = await client.user("owner")
    await client.create(ANON)
    await client.pop(owner, "w1")
    worker_id = (await client.http.get("/api/v2/workers")).json()[0]["id"]
    routes = ["/api/v2/status/models", "/api/v2/status/performance", "/api/v2/stats/text/totals",
              "/api/v2/stats/text/models", "/api/v2/workers", f"/api/v2/workers/{worker_id}",
              "/api/v2/workers/name/w1", "/metrics"]  # fmt: skip
    async with client.horde.transaction() as session:  # a writer holds its transaction open
        await session.execute(text("UPDATE workers SET name = name"))
        answers = [await client.http.get(route) for route in routes]
    assert [a.status_code for a in answers] == [200] * len(routes), [a.text[:200] for a in answers]
    assert answers[1].json()["text_worker_count"] == 1


@pytest.mark.postgres_only
async def test_a_status_read_counts_a_job_lapsed_by_another_transaction_once(
    client: HordeClient, db_url: str
) -> None:
    """The status read sees a job that lapsed, but the sweep gives it back first (another
    transaction): the read must count the job once, as waiting again, not also as processing from
    what it first read (the soak on PostgreSQL found that race)."""
    if not is_postgres(db_url):
        pytest.skip("SQLite has one writer: no sweep commits while a read of the request is open")
    owner = await client.user("owner")
    request_id = (await client.create(ANON)).json()["id"]
    job = (await client.pop(owner, "w1")).json()["id"]
    client.clock.advance(151)
    horde = client.horde
    async with horde.sessionmaker() as session, session.begin():
        # What the read's first statement saw: the job still processing, its lease run out.
        seen = await session.get(Generation, job)
        assert seen is not None
        assert seen.state == "processing"
        assert await client.sweep() == (1, 0)  # meanwhile, in its own transaction
        got = await status.status(session, horde, request_id)
    assert (got.processing, got.waiting, got.restarted) == (0, 1, 1)


async def test_submit_right_at_the_end_of_the_lease_counts(client: HordeClient) -> None:
    owner = await client.user("owner")
    await client.create(ANON)
    job = (await client.pop(owner, "w1")).json()
    client.clock.advance(150)
    assert (await client.submit(owner, job["id"], "just in time")).status_code == 200


async def test_sweep_aborts_lapsed_jobs_and_gives_them_back(client: HordeClient) -> None:
    owner = await client.user("owner")
    request_id = (await client.create(ANON, params={"n": 2})).json()["id"]
    first = (await client.pop(owner, "w1")).json()["id"]
    client.clock.advance(100)
    second = (await client.pop(owner, "w2")).json()["id"]
    client.clock.advance(60)  # the first lease lapsed 10 s ago, the second has 90 s left
    lapsed, expired = await client.sweep()
    assert (lapsed, expired) == (1, 0)
    states = dict(await _rows(client, "SELECT id, state FROM generations"))
    assert states == {first: "aborted", second: "processing"}
    status = (await client.status(request_id)).json()
    assert (status["restarted"], status["waiting"], status["processing"]) == (1, 1, 1)
    assert (await client.submit(owner, first, "late")).json()["rc"] == "AbortedGen"
    assert (await client.submit(owner, second, "fine")).status_code == 200
    other = await client.user("other")  # w1's owner is refused since its lapse
    third = (await client.pop(other, "w3")).json()["id"]
    assert third not in (first, second)
    assert (await client.submit(other, third, "redo")).status_code == 200
    status = (await client.status(request_id)).json()
    assert status["done"] is True
    assert status["finished"] == 2
    assert await client.sweep() == (0, 0)


async def test_faulted_submit_gives_the_job_back(client: HordeClient) -> None:
    owner = await client.user("owner")
    request_id = (await client.create(ANON)).json()["id"]
    job = (await client.pop(owner, "w1")).json()
    faulted = await client.submit(owner, job["id"], "", state="faulted")
    assert faulted.status_code == 200
    assert faulted.json() == {"reward": 0.0}
    status = (await client.status(request_id)).json()
    assert (status["waiting"], status["processing"], status["faulted"], status["done"]) == (
        1,
        0,
        False,
        False,
    )
    assert (await _worker(client, "w1"))["faulted_jobs"] == 1
    assert await client.balance("owner") == 0
    assert (await client.pop(owner, "w1")).json()["id"] is None  # w1 failed it: never offered again
    assert (await client.pop(owner, "w2")).json()["id"] is None  # nor to its owner's other workers
    again = (await client.pop(await client.user("other"), "x1")).json()
    assert again["id"] not in (None, job["id"])
    assert (await client.submit(owner, job["id"], "x", state="faulted")).json()["rc"] == "DuplicateGen"


async def test_more_than_two_failures_fault_the_request(client: HordeClient) -> None:
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=1000)
    request_id = (await client.create(rich, slow_workers=False, params={"n": 2})).json()["id"]
    assert await _rows(client, "SELECT active FROM kudos_holds") == [(True,)]
    # Failure 1: a lapse; failures 2 and 3: faults, each by another owner's worker (one owner's
    # failures count once). Meanwhile another job of it keeps running.
    lapsing = (await client.pop(owner, "w1")).json()["id"]
    client.clock.advance(140)
    keep = (await client.pop(owner, "w0")).json()["id"]
    client.clock.advance(20)
    await client.sweep()
    assert (await client.status(request_id)).json()["restarted"] == 1
    for name in ("w2", "w3"):
        failing = await client.user(f"owner-of-{name}")
        job = (await client.pop(failing, name)).json()
        assert job["id"] is not None
        await client.submit(failing, job["id"], "", state="faulted")
    status = (await client.status(request_id)).json()
    assert status["faulted"] is True
    assert (status["waiting"], status["processing"]) == (0, 1)
    assert (await client.pop(owner, "w4")).json()["id"] is None  # no longer offered
    # The hold stays while a job runs, then is released; the running job is still paid.
    assert await _rows(client, "SELECT active FROM kudos_holds") == [(True,)]
    assert (await client.submit(owner, keep, "x" * 80)).status_code == 200
    assert await _rows(client, "SELECT active, remaining FROM kudos_holds") == [(False, 0.0)]
    status = (await client.status(request_id)).json()
    assert status["faulted"] is True
    assert status["finished"] == 1
    assert (await client.submit(owner, lapsing, "late")).json()["rc"] == "AbortedGen"


async def test_lease_speed_samples_mean_and_capacity(client: HordeClient) -> None:
    owner = await client.user("owner")
    await client.pop(owner, "w1")
    for seconds, chars in ((10, 400), (50, 401)):  # 100 tokens in 10 s; ceil(401/4) = 101 tokens in 50 s
        await client.create(ANON, params={"max_length": 128})
        job = (await client.pop(owner, "w1")).json()
        client.clock.advance(seconds)
        assert (await client.submit(owner, job["id"], "x" * chars)).status_code == 200
    worker = await _worker(client, "w1")
    expected = (100 / 10 + 101 / 50) / 2
    assert worker["speed_measured"] is True
    assert math.isclose(worker["lease_speed"], expected, rel_tol=1e-6)
    assert worker["capacity"] == math.floor(expected * 120)
    assert worker["performance"] == f"{expected:.1f} tokens per second"
    [(tokens,)] = await _rows(client, "SELECT tokens FROM generations WHERE length(text) = 401")
    assert tokens == 101


async def test_lease_speed_is_the_mean_of_the_newest_20(client: HordeClient) -> None:
    owner = await client.user("owner")
    await client.create(ANON)
    job = (await client.pop(owner, "w1")).json()
    client.clock.advance(1)
    await client.submit(owner, job["id"], "x" * 1344)  # an outlier, counted at max_length: 80 tokens/s
    assert (await _worker(client, "w1"))["lease_speed"] == 80
    await client.create(ANON, params={"n": 20})
    for _ in range(20):
        job = (await client.pop(owner, "w1")).json()
        client.clock.advance(20)
        await client.submit(owner, job["id"], "x" * 200)  # 50 tokens in 20 s: 2.5 tokens/s
    worker = await _worker(client, "w1")
    assert worker["lease_speed"] == 2.5
    assert worker["capacity"] == 300
    assert worker["requests_fulfilled"] == 21


async def test_reported_completion_tokens_are_the_sample(client: HordeClient) -> None:
    owner = await client.user("owner")
    chat = {"max_completion_tokens": 512, "max_context_tokens": 4096}
    await client.pop(owner, "chatty", models=["m"], chat=chat)
    created = await client.create(ANON, models=["m"], chat={"messages": [{"role": "user", "content": "hi"}]})
    assert created.status_code == 202, created.text
    job = (await client.pop(owner, "chatty", models=["m"], chat=chat)).json()
    assert job["kind"] == "chat"
    client.clock.advance(10)
    submitted = await client.submit(
        owner, job["id"], "short",
        chat={"message": {"role": "assistant", "content": "short"}, "usage": {"completion_tokens": 300}},
    )  # fmt: skip
    assert submitted.status_code == 200, submitted.text
    assert (await _worker(client, "chatty"))["lease_speed"] == 30.0


async def test_concurrent_pops_never_hand_out_a_job_twice(client: HordeClient) -> None:
    owner = await client.user("owner")
    workers = [f"w{i}" for i in range(8)]
    for name in workers:
        await client.pop(owner, name)
    request_ids = [(await client.create(ANON, params={"n": 2})).json()["id"] for _ in range(6)]
    await client.create(ANON, params={"n": 3})
    total = 6 * 2 + 3
    handed: list[str] = []
    pops = [(owner, {"name": name, "amount": 2, "threads": 2}) for name in workers]
    for _ in range(40):
        answers = await concurrently(client, "/api/v2/generate/text/pop", pops)
        ids = [i for a in answers for i in a["ids"]]
        handed += ids
        if not ids and len(handed) >= total:
            break
    assert len(handed) == len(set(handed)) == total
    per_request = dict(
        await _rows(client, "SELECT request_id, count(*) FROM generations GROUP BY request_id")
    )
    totals = dict(await _rows(client, "SELECT id, n_total FROM text_requests"))
    assert per_request == totals
    assert all(per_request[r] == 2 for r in request_ids)
    assert await _rows(client, "SELECT id FROM text_requests WHERE n_remaining != 0") == []


async def test_concurrent_pops_on_one_big_request(client: HordeClient) -> None:
    owner = await client.user("owner")
    workers = [f"w{i}" for i in range(6)]
    for name in workers:
        await client.pop(owner, name)
    request_id = (await client.create(ANON, params={"n": 5})).json()["id"]
    handed: list[str] = []
    pops = [(owner, {"name": name}) for name in workers]
    for _ in range(20):
        handed += [i for a in await concurrently(client, "/api/v2/generate/text/pop", pops) for i in a["ids"]]
        if len(handed) >= 5:
            break
    # Nothing is left to hand out.
    handed += [i for a in await concurrently(client, "/api/v2/generate/text/pop", pops) for i in a["ids"]]
    assert len(handed) == len(set(handed)) == 5
    status = (await client.status(request_id)).json()
    assert (status["waiting"], status["processing"]) == (0, 5)


async def test_concurrent_first_pops_of_one_worker(client: HordeClient) -> None:
    """A worker with several threads may pop from each at once on its first start."""
    owner = await client.user("owner")
    await client.create(ANON, models=["m"], params={"n": 4})
    answers = await concurrently(
        client, "/api/v2/generate/text/pop", [(owner, {"name": "multi", "models": ["m"]}) for _ in range(4)]
    )
    ids = [i for a in answers for i in a["ids"]]
    assert len(ids) == len(set(ids))
    assert await _rows(client, "SELECT name FROM workers") == [("multi",)]
    assert await _rows(client, "SELECT model FROM worker_models") == [("m",)]
    # Its threads declare a new model list at once.
    answers = await concurrently(
        client,
        "/api/v2/generate/text/pop",
        [(owner, {"name": "multi", "models": ["n", "m"]}) for _ in range(4)],
    )
    assert await _rows(client, "SELECT model FROM worker_models ORDER BY model") == [("m",), ("n",)]


async def test_concurrent_last_submits_finish_the_request(client: HordeClient) -> None:
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=1000)
    for _ in range(3):
        request_id = (await client.create(rich, slow_workers=False, params={"n": 3})).json()["id"]
        job = (await client.pop(owner, "w1", amount=3, threads=3)).json()
        assert len(job["ids"]) == 3
        submits = [(owner, {"id": gen_id, "generation": "x" * 40, "state": "ok"}) for gen_id in job["ids"]]
        await concurrently(client, "/api/v2/generate/text/submit", submits)
        status = (await client.status(request_id)).json()
        assert (status["finished"], status["done"]) == (3, True)
    assert await _rows(client, "SELECT key FROM kudos_holds WHERE active") == []


async def _job_accounting(client: HordeClient) -> list[Any]:
    """Requests whose n_remaining plus live jobs (running or finished) is not n_total."""
    return await _rows(
        client,
        "SELECT r.id, r.n_total, r.n_remaining, "
        "(SELECT count(*) FROM generations g WHERE g.request_id = r.id AND NOT g.fake "
        "AND g.state IN ('processing', 'ok', 'censored')) AS live "
        "FROM text_requests r WHERE r.state = 'waiting'",
    )


async def test_concurrent_pops_faults_and_lapses_keep_the_job_count(db_url: str) -> None:
    from tests.integration.test_horde_requests import custom_client

    async with custom_client(db_url, request={"max_failures": 10_000}) as client:
        owner = await client.user("owner")
        workers = [f"w{i}" for i in range(6)]
        for name in workers:
            await client.pop(owner, name)
        for _ in range(3):
            await client.create(ANON, params={"n": 8})
        running: list[str] = []
        for round_ in range(12):
            pops = [(owner, {"name": name, "amount": 2, "threads": 2}) for name in workers]
            faults = [(owner, {"id": g, "generation": "", "state": "faulted"}) for g in running[:4]]
            oks = [(owner, {"id": g, "generation": "ok", "state": "ok"}) for g in running[4:6]]
            running = running[6:]
            answers = await asyncio.gather(
                concurrently(client, "/api/v2/generate/text/pop", pops),
                concurrently(client, "/api/v2/generate/text/submit", faults, allowed=("AbortedGen",)),
                concurrently(client, "/api/v2/generate/text/submit", oks, allowed=("AbortedGen",)),
                client.sweep(),
            )
            running += [i for a in answers[0] for i in a["ids"]]
            if round_ % 3 == 2:
                client.clock.advance(151)  # everything running now lapses at the next sweep
            for row in await _job_accounting(client):
                assert row[1] == row[2] + row[3], row


async def test_concurrent_funded_requests_never_overspend(client: HordeClient) -> None:
    # A floor of 25, then room for three holds of the request's price and half of a fourth. Its
    # price: 80 tokens named no model (13B) at a context of 1 prompt token + 80.
    price = quote(80, 13, 81)
    key = await client.user("rich", kudos=25 + 3.5 * price)
    body = {"prompt": "p", "slow_workers": False}
    answers = await asyncio.gather(
        *(
            asyncio.to_thread(_post_blocking, client, "/api/v2/generate/text/async", key, body)
            for _ in range(6)
        )
    )
    assert Counter(a.status_code for a in answers) == {202: 3, 403: 3}
    assert {a.json()["rc"] for a in answers if a.status_code == 403} == {"KudosUpfront"}
    [(held,)] = await _rows(client, "SELECT sum(remaining) FROM kudos_holds WHERE active")
    assert held == pytest.approx(3 * price)


async def test_users_paying_each_other_concurrently(client: HordeClient) -> None:
    """Submits that pay in opposite directions at once (A's worker serves B, B's serves A)."""
    alice = await client.user("alice", kudos=1000)
    bob = await client.user("bob", kudos=1000)
    await client.pop(alice, "wa")
    await client.pop(bob, "wb")
    [(wa,), (wb,)] = await _rows(client, "SELECT id FROM workers ORDER BY name")
    await client.create(alice, workers=[wb], params={"n": 4})
    await client.create(bob, workers=[wa], params={"n": 4})
    jobs = [(alice, (await client.pop(alice, "wa", amount=4, threads=4)).json())]
    jobs.append((bob, (await client.pop(bob, "wb", amount=4, threads=4)).json()))
    submits = [
        (key, {"id": g, "generation": "x" * 40, "state": "ok"}) for key, job in jobs for g in job["ids"]
    ]
    assert len(submits) == 8
    answers = await concurrently(client, "/api/v2/generate/text/submit", submits)
    assert all(a["reward"] > 0 for a in answers)
    total = sum(a["reward"] for a in answers)
    assert await client.balance("alice") + await client.balance("bob") == round(2000 + total - (total + 8), 2)
