"""The queue's index (docs/explanation/dispatch.md, "Walking the queue"): entries enter with a
waiting request, leave when its last job is handed out or it stops waiting, and come back when a
job is given back; the pop walks past pages its rules refuse and skips lengths inside the index."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from horde_lite.accounts.workers import CHECK_IN_RESOLUTION
from horde_lite.jobs import dispatch
from horde_lite.queue import queue_index
from tests.support.horde import ANON, HordeClient
from tests.support.statements import statements_sent


async def _rows(client: HordeClient, sql: str, **params: Any) -> list[Any]:
    async with client.horde.sessionmaker() as session:
        return list((await session.execute(text(sql), params)).all())


async def _request_of(client: HordeClient, job: dict[str, Any]) -> str:
    """The request a popped job (a pop's answer) came from; fails when the pop handed out none."""
    [(request_id,)] = await _rows(client, "SELECT request_id FROM generations WHERE id = :g", g=job["id"])
    return str(request_id)


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

    # Its only job handed out: it leaves at once, and stays out once done.
    job = (await client.pop(key, "w1", models=["a-7B"], max_length=512, max_context_length=2048)).json()
    assert job["id"] is not None
    assert job["model"] == "a-7B"
    assert await _entries(client, any_id) == []
    assert (await client.submit(key, job["id"])).status_code == 200
    assert await _entries(client, any_id) == []


async def _queue_keys(client: HordeClient, request_id: str) -> set[tuple[float, float]]:
    rows = await _rows(
        client, "SELECT effective_start, created_at FROM queue_entries WHERE request_id = :r", r=request_id
    )
    return {(float(a), float(b)) for a, b in rows}


async def test_a_request_with_every_job_out_leaves_until_one_comes_back(client: HordeClient) -> None:
    """Jobs being generated are not in the index (on a busy horde they would fill the head of every
    walk): a request leaves when its last job is handed out, and a job given back, faulted or
    lapsed, brings it back at its old place, ahead of later requests."""
    keys = [await client.user(f"owner{i}") for i in range(6)]
    twice = (await client.create(ANON, models=["g-7B"], params={"max_length": 16, "n": 2})).json()["id"]
    client.clock.advance(1)
    once = (await client.create(ANON, models=["g-7B"], params={"max_length": 16})).json()["id"]
    keyed = {r: await _queue_keys(client, r) for r in (twice, once)}
    assert all(len(k) == 1 for k in keyed.values())

    first = (await client.pop(keys[0], "w0", models=["g-7B"])).json()["id"]
    assert await _queue_keys(client, twice) == keyed[twice]  # one of its two jobs is left
    second, third = [(await client.pop(keys[i], f"w{i}", models=["g-7B"])).json()["id"] for i in (1, 2)]
    assert None not in (first, second, third)
    assert await _entries(client, twice) == []
    assert await _entries(client, once) == []

    # A fault gives `twice` a job back: its entry returns as it was.
    assert (await client.submit(keys[0], first, state="faulted")).status_code == 200
    assert await _queue_keys(client, twice) == keyed[twice]
    # A lapse gives `once` its job back (the other running job is submitted first).
    assert (await client.submit(keys[1], second)).status_code == 200
    client.clock.advance(client.horde.settings.lease.base_seconds + 1)
    await client.sweep()
    assert await _queue_keys(client, once) == keyed[once]

    client.clock.advance(1)
    later = (await client.create(ANON, models=["g-7B"], params={"max_length": 16})).json()["id"]
    taken = []
    for i in (3, 4, 5):
        job = (await client.pop(keys[i], f"w{i}", models=["g-7B"])).json()
        request_id = await _request_of(client, job)
        taken.append(request_id)
    assert taken == [twice, once, later]


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


@pytest.mark.slow
@pytest.mark.parametrize("checked_in", [False, True], ids=["declaration changed", "checked in"])
async def test_the_pop_walks_past_a_page_its_rules_refuse(client: HordeClient, checked_in: bool) -> None:
    """More than a page of requests ahead that the index lets through but the claim refuses (an
    allow-list too long for the entries to name, without the worker): the pop pages on and finds
    the one behind them. A worker checked
    in already reads the first page before its transaction, which walks on from it; one whose
    declaration changed goes the whole way in the transaction."""
    key = await client.user("owner")
    assert (await client.pop(key, "denied", models=["p-7B"])).json()["id"] is None
    declared = {} if checked_in else {"max_context_length": 4096}
    # A rich requester's requests are ahead in the queue (effective start by priority).
    rich = await client.user("rich", kudos=1_000_000)
    others = await _others(client)
    for _ in range(dispatch.POP_PAGE + 3):
        response = await client.create(rich, models=["p-7B"], workers=others, params={"max_length": 16})
        assert response.status_code == 202, response.text
    client.clock.advance(1)
    wanted = (await client.create(ANON, models=["p-7B"], params={"max_length": 16})).json()["id"]
    job = (await client.pop(key, "denied", models=["p-7B"], **declared)).json()
    assert job["id"] is not None
    request_id = await _request_of(client, job)
    assert request_id == wanted


async def _others(client: HordeClient, count: int = queue_index.TARGET_ENTRIES + 1) -> list[str]:
    """An allow-list too long for the entries to name (a rule the index cannot see): workers that
    exist (an allow-list naming an unknown one is refused) and serve a model nobody asks."""
    key = await client.user("others")
    for i in range(count):
        assert (await client.pop(key, f"other{i}", models=["elsewhere-7B"])).status_code == 200
    return [await _worker_id(client, f"other{i}") for i in range(count)]


async def _behind_denied(client: HordeClient, model: str, count: int) -> tuple[str, str]:
    """`count` requests for `model` that only the claim finds refuse the worker "denied" (`_others`),
    then one it may take: its owner's key and that request's id. (Several requesters: one would
    pass the per-minute limit of creations.)"""
    key = await client.user("owner")
    assert (await client.pop(key, "denied", models=[model])).json()["id"] is None
    rich = [await client.user(f"rich{i}", kudos=1_000_000) for i in range(4)]
    others = await _others(client)
    for i in range(count):
        response = await client.create(rich[i % 4], models=[model], workers=others, params={"max_length": 16})
        assert response.status_code == 202, response.text
    client.clock.advance(1)
    return key, (await client.create(ANON, models=[model], params={"max_length": 16})).json()["id"]


@pytest.mark.slow
async def test_pages_past_refused_requests_grow(client: HordeClient) -> None:
    """Behind more than two pages' worth of requests the claim refuses (a long allow-list), the walk's
    pages double (32, then 64): the pop judges two pages, not three, and takes the request behind."""
    key, wanted = await _behind_denied(client, "q-7B", 2 * dispatch.POP_PAGE + 3)
    job, claims = await _claims_of(client, key, "denied", models=["q-7B"])
    request_id = await _request_of(client, job)
    assert (request_id, claims) == (wanted, 2)


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
        request_id = await _request_of(client, job)
        taken.append(request_id)
    assert taken == [theirs, own, head]


@pytest.mark.parametrize("since_check_in", [1.0, CHECK_IN_RESOLUTION])
async def test_an_existing_workers_found_pop_counts_its_statements(
    client: HordeClient, since_check_in: float
) -> None:
    """Owner and worker in one read, the check-in's update when it is due, the queue's page, the
    claim (with the speed gate's question for an over-capacity job), the request's update (whose
    trigger removes its entries: its only job is out), the job and its shadow record, these three
    one statement on PostgreSQL: no separate key lookup, entries' removal, capable question or ORM
    reload."""
    key = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    worker = {"models": ["s-7B"], "max_length": 2048, "max_context_length": 4096}
    assert (await client.pop(key, "w", **worker)).json()["id"] is None
    # Longer than an unmeasured worker's capacity (1200 tokens): the gate's question is asked.
    created = await client.create(
        rich, models=["s-7B"], params={"max_length": 2048, "max_context_length": 4096}
    )
    assert created.status_code == 202, created.text
    client.clock.advance(since_check_in)
    with statements_sent(client.horde.engine) as sent:
        job = (await client.pop(key, "w", **worker)).json()
    statements = [s.statement for s in sent if not s.control]
    assert job["id"] is not None
    [record] = await _rows(client, "SELECT over_capacity, capable_online FROM assignment_records")
    assert (bool(record[0]), record[1] is not None) == (True, True)
    due = since_check_in >= CHECK_IN_RESOLUTION
    check_ins = [s for s in statements if s.lstrip().upper().startswith("UPDATE WORKERS")]
    assert len(check_ins) == int(due), statements
    writes = 1 if client.horde.engine.dialect.name == "postgresql" else 3
    assert len(statements) == 3 + writes + due, statements


async def test_the_pop_skips_lengths_inside_the_index(client: HordeClient) -> None:
    """A request longer than the worker accepts is never a candidate; one that fits behind it is."""
    key = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    await client.create(rich, models=["l-7B"], params={"max_length": 1024, "max_context_length": 2048})
    client.clock.advance(1)
    small = (await client.create(ANON, models=["l-7B"], params={"max_length": 64})).json()["id"]
    job = (await client.pop(key, "small", models=["l-7B"], max_length=128, max_context_length=2048)).json()
    request_id = await _request_of(client, job)
    assert request_id == small
    assert (await client.pop(key, "small", models=["l-7B"], max_length=128)).json()["id"] is None


async def _claims_of(client: HordeClient, key: str, name: str, **body: Any) -> tuple[dict[str, Any], int]:
    """A pop's answer and how many claim statements it ran (one per page judged)."""
    with statements_sent(client.horde.engine) as sent:
        answer = (await client.pop(key, name, **body)).json()
    return answer, sum("AS claimed" in s.statement for s in sent)


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["nsfw", "trusted_workers", "slow_workers"])
@pytest.mark.parametrize("served", [1, queue_index.MANY_MODELS], ids=["by model", "whole queue"])
async def test_the_walk_skips_requests_whose_choices_refuse_the_worker(
    client: HordeClient, choice: str, served: int
) -> None:
    """More than a page of requests ahead that refuse the worker by their own choice (NSFW for a
    worker that declared none, trusted workers only for an untrusted one, no slow workers for a slow
    one): the walk skips them inside the index, so the pop judges one page and takes the request
    behind them; a worker they accept takes them first."""
    key, trusted = await client.user("owner"), await client.user("trusted", trusted=True)
    models = ["c-7B", *(f"other-{i}" for i in range(served - 1))]
    assert (await client.pop(key, "w", models=models)).json()["id"] is None
    assert (await client.pop(trusted, "ok", models=["c-7B"], nsfw=True)).json()["id"] is None
    await client.set_worker_speed("w", 1.0)  # slow: under [worker] slow_tokens_per_second (2)
    rich = await client.user("rich", kudos=1_000_000)
    refusing = {"nsfw": {"nsfw": True}, "trusted_workers": {"trusted_workers": True},
                "slow_workers": {"slow_workers": False}}[choice]  # fmt: skip
    ahead = []
    for _ in range(dispatch.POP_PAGE + 2):
        response = await client.create(rich, models=["c-7B"], params={"max_length": 16}, **refusing)
        assert response.status_code == 202, response.text
        ahead.append(response.json()["id"])
    client.clock.advance(1)
    wanted = (await client.create(ANON, models=["c-7B"], params={"max_length": 16})).json()["id"]
    job, claims = await _claims_of(client, key, "w", models=models)
    request_id = await _request_of(client, job)
    assert (request_id, claims) == (wanted, 1)
    job = (await client.pop(trusted, "ok", models=["c-7B"], nsfw=True)).json()
    request_id = await _request_of(client, job)
    assert request_id in ahead


@pytest.mark.slow
@pytest.mark.parametrize("served", [1, queue_index.MANY_MODELS], ids=["by model", "whole queue"])
async def test_a_pop_does_not_page_past_jobs_being_generated(client: HordeClient, served: int) -> None:
    """More than a page of requests at the head whose jobs are all out: the pop's walk does not
    read them (one page, one claim), whether it merges its models' entries or, serving many
    models, walks the whole queue's order."""
    busy, key = await client.user("busy"), await client.user("owner")
    for _ in range(dispatch.POP_PAGE + 2):
        assert (await client.create(ANON, models=["h-7B"], params={"max_length": 16})).status_code == 202
        assert (await client.pop(busy, "busy", models=["h-7B"])).json()["id"] is not None
    models = ["h-7B", *(f"other-{i}" for i in range(served - 1))]
    assert (await client.pop(key, "w", models=models)).json()["id"] is None  # checked in; all are out
    client.clock.advance(1)
    wanted = (await client.create(ANON, models=["h-7B"], params={"max_length": 16})).json()["id"]
    job, claims = await _claims_of(client, key, "w", models=models)
    request_id = await _request_of(client, job)
    assert (request_id, claims) == (wanted, 1)


async def _worker_id(client: HordeClient, name: str) -> str:
    [(worker_id,)] = await _rows(client, "SELECT id FROM workers WHERE name = :n", n=name)
    return str(worker_id)


@pytest.mark.slow
async def test_a_targeted_requests_entries_name_its_workers(client: HordeClient) -> None:
    """A short allow-list: an entry per model and named worker. A long one, or a deny-list: entries
    that name no worker ("", read by every walk), the allow-list judged by the claim as always; the
    one worker it names among many still takes it."""
    key = await client.user("owner")
    for name in ("a", "b"):
        assert (await client.pop(key, name, models=["t-7B"])).json()["id"] is None
    a, b = await _worker_id(client, "a"), await _worker_id(client, "b")
    both = (await client.create(ANON, models=["t-7B", "u-7B"], workers=[b, a])).json()["id"]
    pairs = "SELECT model, target FROM queue_entries WHERE request_id = :r ORDER BY 1, 2"
    assert await _rows(client, pairs, r=both) == sorted([(m, w) for m in ("t-7B", "u-7B") for w in (a, b)])
    client.clock.advance(1)
    denied = (await client.create(ANON, models=["t-7B"], workers=[a], worker_blacklist=True)).json()["id"]
    assert await _rows(client, pairs, r=denied) == [("t-7B", "")]
    client.clock.advance(1)
    many = [*await _others(client, queue_index.TARGET_ENTRIES), b]
    crowd = (await client.create(ANON, models=["t-7B"], workers=many)).json()["id"]
    assert await _rows(client, pairs, r=crowd) == [("t-7B", "")]
    # Queue order: `both`, `denied` (refuses a), `crowd` (b only).
    taken = []
    for name in ("a", "b", "b", "a"):
        job = (await client.pop(key, name, models=["t-7B"])).json()
        taken.append(job["id"] and await _request_of(client, job))
    assert taken == [both, denied, crowd, None]
    assert await _rows(client, "SELECT count(*) FROM queue_entries") == [(0,)]


@pytest.mark.parametrize("served", [1, queue_index.MANY_MODELS], ids=["by model", "whole queue"])
async def test_the_walk_skips_requests_targeted_at_other_workers(client: HordeClient, served: int) -> None:
    """More than a page of requests ahead targeted at another worker: the walk skips them inside the
    index (by model) or by the allow-list alone (the whole queue), so the pop judges one page and
    takes the request behind them; the worker they name takes them first."""
    key = await client.user("owner")
    models = ["v-7B", *(f"other-{i}" for i in range(served - 1))]
    assert (await client.pop(key, "w", models=models)).json()["id"] is None
    assert (await client.pop(key, "mine", models=["v-7B"])).json()["id"] is None
    mine = await _worker_id(client, "mine")
    ahead = []
    for _ in range(dispatch.POP_PAGE + 2):
        response = await client.create(ANON, models=["v-7B"], params={"max_length": 16}, workers=[mine])
        assert response.status_code == 202, response.text
        ahead.append(response.json()["id"])
    client.clock.advance(1)
    wanted = (await client.create(ANON, models=["v-7B"], params={"max_length": 16})).json()["id"]
    job, claims = await _claims_of(client, key, "w", models=models)
    request_id = await _request_of(client, job)
    assert (request_id, claims) == (wanted, 1)
    job = (await client.pop(key, "mine", models=["v-7B"])).json()
    request_id = await _request_of(client, job)
    assert request_id in ahead


@pytest.mark.slow
@pytest.mark.parametrize("served", [1, queue_index.MANY_MODELS], ids=["by model", "whole queue"])
async def test_the_walk_skips_requests_that_refuse_the_worker_by_name(
    client: HordeClient, served: int
) -> None:
    """More than a page of requests ahead whose deny-list names the worker: the walk skips them
    (their refusals, by model and over the whole queue), so the pop judges one page and takes the
    request behind them; a worker they do not name takes them first."""
    key = await client.user("owner")
    models = ["d-7B", *(f"other-{i}" for i in range(served - 1))]
    assert (await client.pop(key, "w", models=models)).json()["id"] is None
    assert (await client.pop(key, "ok", models=["d-7B"])).json()["id"] is None
    denied = await _worker_id(client, "w")
    rich = [await client.user(f"rich{i}", kudos=1_000_000) for i in range(2)]
    ahead = []
    for i in range(dispatch.POP_PAGE + 2):
        deny = {"worker_blacklist": [denied]} if i % 2 else {"workers": [denied], "worker_blacklist": True}
        response = await client.create(rich[i % 2], models=["d-7B"], params={"max_length": 16}, **deny)
        assert response.status_code == 202, response.text
        ahead.append(response.json()["id"])
    client.clock.advance(1)
    wanted = (await client.create(ANON, models=["d-7B"], params={"max_length": 16})).json()["id"]
    job, claims = await _claims_of(client, key, "w", models=models)
    request_id = await _request_of(client, job)
    assert (request_id, claims) == (wanted, 1)
    job = (await client.pop(key, "ok", models=["d-7B"])).json()
    assert await _request_of(client, job) in ahead


async def test_a_worker_of_many_models_skips_requests_for_others(client: HordeClient) -> None:
    """A worker serving many models walks the whole queue's order: more than a page of requests
    ahead for a model it does not serve is skipped by the walk (one claim), not judged."""
    key = await client.user("owner")
    models = [f"many-{i}" for i in range(queue_index.MANY_MODELS)]
    assert (await client.pop(key, "w", models=models)).json()["id"] is None
    assert (await client.pop(key, "other", models=["elsewhere-7B"])).json()["id"] is None
    for _ in range(dispatch.POP_PAGE + 2):
        response = await client.create(ANON, models=["elsewhere-7B"], params={"max_length": 16})
        assert response.status_code == 202, response.text
    client.clock.advance(1)
    wanted = (await client.create(ANON, models=[models[-1]], params={"max_length": 16})).json()["id"]
    job, claims = await _claims_of(client, key, "w", models=models)
    request_id = await _request_of(client, job)
    assert (request_id, claims) == (wanted, 1)


@pytest.mark.slow
async def test_later_pages_share_one_claim_statement(client: HordeClient) -> None:
    """Behind three pages' worth of requests only the claim refuses, the pop judges pages of 32, 64
    and 128 (the last one partly filled): the two later claims send one statement text, their ids
    bound as one list, whatever their lengths (one prepared statement per connection, not one per
    length)."""
    key, wanted = await _behind_denied(client, "p-7B", 3 * dispatch.POP_PAGE + 3)
    with statements_sent(client.horde.engine) as sent:
        job = (await client.pop(key, "denied", models=["p-7B"])).json()
    claims = [s.statement for s in sent if "AS claimed" in s.statement]
    request_id = await _request_of(client, job)
    assert (request_id, len(claims)) == (wanted, 3)
    assert claims[1] == claims[2]


@pytest.mark.parametrize("served", [1, queue_index.MANY_MODELS], ids=["by model", "whole queue"])
async def test_the_walk_skips_chat_requests_the_speed_gate_refuses(client: HordeClient, served: int) -> None:
    """More than a page of chat requests ahead longer than a slow worker can finish inside a lease,
    while a worker that can is online: the walk asks the speed gate of their entries (by model) or
    of the requests (the whole queue) and skips them, so the slow worker's pop judges one page and
    takes the first request behind them it may have: one whose deny-list names the fast worker (no
    capable worker may take it, so the gate lets the slow one), read from its refusals. Requests
    with a deny-list are plain like the others; the fast worker takes the requests the gate kept
    from the slow one."""
    key = await client.user("owner")
    chat_limits = {"chat": {"max_completion_tokens": 4096, "max_context_tokens": 8192}}
    models = ["g-7B", *(f"other-{i}" for i in range(served - 1))]
    assert (await client.pop(key, "slow", models=models, **chat_limits)).json()["id"] is None
    assert (await client.pop(key, "fast", models=["g-7B"], **chat_limits)).json()["id"] is None
    await client.set_worker_speed("slow", 1.0)  # capacity: far under 512 tokens
    await client.set_worker_speed("fast", 100.0)
    fast = await _worker_id(client, "fast")

    async def chat(max_tokens: int, **body: Any) -> str:
        asked = {"messages": [{"role": "user", "content": "Hello there."}], "max_tokens": max_tokens}
        response = await client.create(ANON, models=["g-7B"], chat=asked, **body)
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    [bystander] = await _others(client, 1)  # a deny-list names a worker that exists
    ahead = [
        await chat(512, **({"worker_blacklist": [bystander]} if i % 2 else {}))
        for i in range(dispatch.POP_PAGE + 2)
    ]
    client.clock.advance(1)
    spared = await chat(512, worker_blacklist=[fast])
    client.clock.advance(1)
    await chat(16)
    [(entries, plain)] = await _rows(
        client, "SELECT count(*), sum(CASE WHEN plain THEN 1 ELSE 0 END) FROM queue_entries"
    )
    assert (entries, plain) == (len(ahead) + 2, len(ahead) + 2)
    job, claims = await _claims_of(client, key, "slow", models=models, **chat_limits)
    request_id = await _request_of(client, job)
    assert (request_id, claims) == (spared, 1)
    job = (await client.pop(key, "fast", models=["g-7B"], **chat_limits)).json()
    request_id = await _request_of(client, job)
    assert request_id in ahead
