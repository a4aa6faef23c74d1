"""Nothing minted, nothing lost (on SQLite and PostgreSQL, through HTTP): a job pays at most the
tokens it allowed whatever the worker says, a speed sample of an instant submit is bounded, a worker
that failed a request is not offered it again and one worker cannot fault it, shared-key budgets
hold for free requests and under concurrent use, and the free allowance counts all of a request's
jobs. The lock order (docs/explanation/locking.md) is exercised by concurrent creations and
submits for the same users."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

from sqlalchemy import text

from tests.integration.test_horde_jobs import _post_blocking, concurrently
from tests.support.horde import ANON, HordeClient

MODEL = "m-12B"
CHAT = {"max_completion_tokens": 512, "max_context_tokens": 4096}


async def rows(client: HordeClient, sql: str, **params: Any) -> list[Any]:
    async with client.horde.sessionmaker() as session:
        return list((await session.execute(text(sql), params)).all())


# --- 1. rewards and speed samples count at most what the job allowed ---------------------------


async def test_an_over_long_text_is_refused_and_one_within_the_bound_counted_at_max_length(
    client: HordeClient,
) -> None:
    owner = await client.user("owner")
    payer = await client.user("payer", kudos=1000)
    created = (await client.create(payer, models=[MODEL], params={"max_length": 16})).json()
    job = (await client.pop(owner, "w1", models=[MODEL])).json()
    client.clock.advance(10)
    # Past the job's output bound (16 tokens x 16 characters + 1024): refused, nothing stored or paid.
    refused = await client.submit(owner, job["id"], "x" * 1_000_000)
    assert (refused.status_code, refused.json()["rc"]) == (400, "GenerationTooLong")
    assert await client.balance("payer") == 1000
    # At the bound: kept as sent, counted (and paid) as the 16 tokens the job allowed.
    submitted = await client.submit(owner, job["id"], "x" * 1280)
    assert submitted.status_code == 200, submitted.text
    expected = await client.expected_reward(created["id"], 16, MODEL)
    assert submitted.json()["reward"] == expected
    [(tokens, length)] = await rows(client, "SELECT tokens, length(text) FROM generations")
    assert (tokens, length) == (16, 1280)
    assert await client.balance("payer") == round(1000 - expected - 1, 2)
    assert (await client.status(created["id"])).json()["kudos"] == round(expected + 1, 2)


async def test_reported_usage_above_max_tokens_is_not_believed(client: HordeClient) -> None:
    owner = await client.user("owner")
    await client.pop(owner, "chatty", models=[MODEL], chat=CHAT)
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
    created = (await client.create(ANON, models=[MODEL], chat=chat)).json()
    job = (await client.pop(owner, "chatty", models=[MODEL], chat=CHAT)).json()
    client.clock.advance(10)
    usage = {"prompt_tokens": 3, "completion_tokens": 10_000_000, "total_tokens": 10_000_003}
    submitted = await client.submit(
        owner, job["id"], "", chat={"message": {"role": "assistant", "content": "hi"}, "usage": usage}
    )
    assert submitted.status_code == 200, submitted.text
    assert submitted.json()["reward"] == await client.expected_reward(created["id"], 64, MODEL)
    [generation] = (await client.status(created["id"])).json()["generations"]
    assert generation["chat"]["usage"] == {"prompt_tokens": 3, "completion_tokens": 64, "total_tokens": 67}
    worker = (await client.http.get("/api/v2/workers")).json()[0]
    assert worker["lease_speed"] == 6.4  # 64 tokens in 10 s, not a million per second


async def test_an_instant_submit_measures_at_most_the_bounded_sample(client: HordeClient) -> None:
    owner = await client.user("owner")
    await client.create(ANON, params={"max_length": 80})
    job = (await client.pop(owner, "w1")).json()
    assert (await client.submit(owner, job["id"], "x" * 320)).status_code == 200  # 0 s after the pop
    worker = (await client.http.get("/api/v2/workers")).json()[0]
    assert worker["lease_speed"] == 80.0  # 80 tokens over the minimum of 1 s
    assert worker["capacity"] == 80 * 120


# --- 3. failed workers ---------------------------------------------------------------------------


async def test_one_worker_faulting_again_and_again_cannot_fault_a_request(client: HordeClient) -> None:
    owner = await client.user("owner")
    other = await client.user("other")
    created = (await client.create(ANON)).json()["id"]
    job = (await client.pop(owner, "bad")).json()
    assert (await client.submit(owner, job["id"], "", state="faulted")).status_code == 200
    for _ in range(3):  # the request is never offered to that worker again
        assert (await client.pop(owner, "bad")).json()["id"] is None
    status = (await client.status(created)).json()
    assert (status["faulted"], status["waiting"], status["is_possible"]) == (False, 1, False)
    job = (await client.pop(other, "good")).json()
    assert job["id"] is not None
    assert (await client.submit(other, job["id"], "fine")).status_code == 200
    assert (await client.status(created)).json()["done"] is True


async def test_a_lapsed_worker_is_not_offered_the_request_again(client: HordeClient) -> None:
    owner = await client.user("owner")
    await client.create(ANON)
    assert (await client.pop(owner, "slow")).json()["id"] is not None
    client.clock.advance(151)
    await client.sweep()
    # The request refuses it by name, and its owner, from now on, so its walks skip the request.
    refused = await rows(
        client, "SELECT r.worker_id FROM queue_refusals r JOIN workers w ON w.id = r.worker_id"
    )
    assert refused == await rows(client, "SELECT id FROM workers WHERE name = 'slow'")
    owners = await rows(client, "SELECT owner_id FROM queue_owner_refusals")
    assert owners == await rows(client, "SELECT owner_id FROM workers WHERE name = 'slow'")
    assert (await client.pop(owner, "slow")).json()["id"] is None
    assert (await client.pop(owner, "fresh")).json()["id"] is None  # a new name of the same owner
    other = await client.user("other")
    assert (await client.pop(other, "fresh2")).json()["id"] is not None


async def test_a_request_is_faulted_when_more_than_max_failures_distinct_owners_failed(
    client: HordeClient,
) -> None:
    created = (await client.create(ANON)).json()["id"]
    limit = client.horde.settings.request.max_failures
    for i in range(limit + 1):
        assert (await client.status(created)).json()["faulted"] is False
        owner = await client.user(f"owner{i}")
        job = (await client.pop(owner, f"w{i}")).json()
        assert (await client.submit(owner, job["id"], "", state="faulted")).status_code == 200
    assert (await client.status(created)).json()["faulted"] is True
    [(failed,)] = await rows(client, "SELECT failed_workers FROM text_requests")
    assert len(failed if isinstance(failed, list) else json.loads(failed)) == limit + 1
    assert await rows(client, "SELECT count(*) FROM queue_refusals") == [(limit + 1,)]


# --- 4. shared keys and the per-request allowance -------------------------------------------------


async def _shared_key(client: HordeClient, owner: str, budget: float) -> str:
    made = await client.http.post("/api/v2/sharedkeys", json={"kudos": budget}, headers={"apikey": owner})
    assert made.status_code == 200, made.text
    return made.json()["id"]


async def _quote(client: HordeClient, key: str, **body: object) -> float:
    """What a request would hold: its dry run's quote."""
    quoted = await client.create(key, dry_run=True, **body)
    assert quoted.status_code == 200, quoted.text
    return float(quoted.json()["kudos"])


async def test_free_requests_through_a_shared_key_fit_its_budget(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=1000)
    price = await _quote(client, owner)
    key = await _shared_key(client, owner, round(price / 2, 2))
    refused = await client.create(key)  # free by the allowance, but its price does not fit
    assert refused.status_code == 403, refused.text
    assert refused.json()["rc"] == "SharedKeyInsufficientKudos"
    key = await _shared_key(client, owner, round(2.5 * price, 2))
    assert (await client.create(key)).status_code == 202  # reserves 1 price of 2.5
    assert (await client.create(key)).status_code == 202  # 2 of 2.5
    third = await client.create(key)
    assert third.status_code == 403, third.text
    assert await rows(client, "SELECT count(*) FROM kudos_holds WHERE active AND NOT reserves_user") == [(2,)]


async def test_concurrent_free_requests_through_one_key_never_overspend(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=1000)
    key = await _shared_key(client, owner, round(2.5 * await _quote(client, owner, prompt="p"), 2))
    answers = await asyncio.gather(
        *(
            asyncio.to_thread(_post_blocking, client, "/api/v2/generate/text/async", key, {"prompt": "p"})
            for _ in range(6)
        )
    )
    assert Counter(a.status_code for a in answers) == {202: 2, 403: 4}


async def test_a_finished_free_request_releases_the_keys_reservation(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=1000)
    worker = await client.user("worker")
    price = await _quote(client, owner, params={"max_length": 16})
    # Room for one request, and for another once the first is charged its 2 tokens and released.
    key = await _shared_key(client, owner, round(1.9 * price, 2))
    created = await client.create(key, params={"max_length": 16})
    assert created.status_code == 202, created.text
    assert (await client.create(key, params={"max_length": 16})).json()["rc"] == "SharedKeyInsufficientKudos"
    job = (await client.pop(worker, "w1")).json()
    assert (await client.submit(worker, job["id"], "x" * 8)).status_code == 200
    assert await rows(client, "SELECT count(*) FROM kudos_holds WHERE active") == [(0,)]
    assert (await client.create(key, params={"max_length": 16})).status_code == 202  # less the charge


async def test_the_free_allowance_counts_every_job_of_a_request(client: HordeClient) -> None:
    owner = await client.user("owner")
    await client.pop(owner, "idle", max_length=4096, max_context_length=8192)  # allowance: 4096
    big = await client.create(ANON, params={"n": 20, "max_length": 4096, "max_context_length": 8192})
    assert big.status_code == 403, big.text
    assert big.json()["rc"] == "KudosUpfront"
    assert await rows(client, "SELECT count(*) FROM text_requests") == [(0,)]
    one_job = await client.create(ANON, params={"n": 1, "max_length": 4096, "max_context_length": 8192})
    assert one_job.status_code == 202, one_job.text
    await client.cancel(one_job.json()["id"])
    twenty = await client.create(ANON, params={"n": 20, "max_length": 300})
    assert twenty.status_code == 403, twenty.text
    assert "6000 (20 jobs x 300)" in twenty.json()["message"]
    lowered = await client.create(ANON, params={"n": 20, "max_length": 300}, allow_downgrade=True)
    assert lowered.status_code == 202, lowered.text
    assert await rows(client, "SELECT max_length, n_total FROM text_requests WHERE state = 'waiting'") == [
        (4096 // 20, 20)
    ]


# --- 5. one lock order ---------------------------------------------------------------------------


async def test_concurrent_creations_and_submits_for_the_same_users_never_fail(client: HordeClient) -> None:
    """Funded creations lock their requester's users row while submits move the same balances: in
    the old order (ledger insert, then balance update) PostgreSQL found deadlocks here."""
    alice = await client.user("alice", kudos=100_000)
    bob = await client.user("bob", kudos=100_000)
    await client.pop(alice, "wa")
    await client.pop(bob, "wb")
    [(wa,), (wb,)] = await rows(client, "SELECT id FROM workers ORDER BY name")
    funded = {"prompt": "p", "slow_workers": False, "params": {"max_length": 16}}
    for _ in range(3):
        # Each user's worker serves the other's request: every submit moves both balances.
        await client.create(alice, **{**funded, "workers": [wb], "params": {"max_length": 16, "n": 8}})
        await client.create(bob, **{**funded, "workers": [wa], "params": {"max_length": 16, "n": 8}})
        jobs = [(alice, (await client.pop(alice, "wa", amount=8, threads=8)).json())]
        jobs.append((bob, (await client.pop(bob, "wb", amount=8, threads=8)).json()))
        submits = [
            (k, {"id": g, "generation": "x" * 40, "state": "ok"}) for k, job in jobs for g in job["ids"]
        ]
        creates = [(k, funded) for k in (alice, bob) for _ in range(4)]
        answers = await asyncio.gather(
            concurrently(client, "/api/v2/generate/text/submit", submits),
            asyncio.gather(
                *(
                    asyncio.to_thread(_post_blocking, client, "/api/v2/generate/text/async", k, b)
                    for k, b in creates
                )
            ),
        )
        assert all(a.status_code == 202 for a in answers[1]), [a.text for a in answers[1]]
    ledger = await rows(
        client,
        "SELECT u.kudos, (SELECT coalesce(sum(e.amount), 0) FROM kudos_events e WHERE e.user_id = u.id) "
        "FROM users u",
    )
    assert all(round(balance, 2) == round(total, 2) for balance, total in ledger), ledger
