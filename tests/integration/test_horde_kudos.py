"""Kudos through HTTP (docs/explanation/kudos_accounting.md): the requester pays reward + 1 and the
worker's owner earns the reward; upfront holds keyed `upfront:<request id>`, one per request,
consumed by charges and released on completion, cancel, fault and expiry; and a reconciliation
property over random sequences of creates, pops, submits, faults, lapses, cancels and expiries.

The invariant checked after every step (`reconcile`):

1. Ledger: for every user, `users.kudos` equals the sum of its `kudos_events`.
2. Conservation: every charged job has exactly one `reward` event (+r, to the worker's owner) and one
   `charge` event (-(r + 1), to the requester) with the same generation ref, so
   sum(all events) == sum(grant events) - number of charged jobs, and
   sum(users.kudos) equals the same figure: no kudos is created or lost, only the +1 fee is burnt.
3. Holds: at most one hold per request, keyed `upfront:<request id>`, never negative; an active hold
   belongs to an existing request that is still waiting or still has a job running; a request that
   is over (done, cancelled or faulted, nothing running) or removed has no active hold.
4. Jobs: a waiting request's jobs not yet handed out plus its live jobs (running or finished, fake
   ones excluded) equal its n; a request's `kudos_spent` equals its charge events (while its
   generations exist).
5. Usage: the usage history's kudos spent by each user and earned by each owner equal its charge
   and reward events, long after the requests expire.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.requests.prices import context_multiplier
from tests.support.horde import ANON, HordeClient
from tests.support.statements import statements_sent

EPS = 1e-6


async def _rows(client: HordeClient, sql: str, **params: Any) -> list[Any]:
    async with client.horde.sessionmaker() as session:
        return list((await session.execute(text(sql), params)).all())


async def _holds(client: HordeClient) -> list[Any]:
    rows = await _rows(client, "SELECT key, request_id, amount, remaining, active FROM kudos_holds")
    return [(*row[:4], bool(row[4])) for row in rows]  # SQLite returns booleans as 0/1


async def reconcile(client: HordeClient) -> None:
    async with client.horde.sessionmaker() as session:
        await _reconcile(session)


async def _reconcile(session: AsyncSession) -> None:
    async def q(sql: str) -> list[Any]:
        return list((await session.execute(text(sql))).all())

    # 1. Every balance is its ledger's sum.
    balances = await q(
        "SELECT u.id, u.kudos, "
        "(SELECT coalesce(sum(e.amount), 0) FROM kudos_events e WHERE e.user_id = u.id) FROM users u",
    )
    for user_id, kudos, ledger in balances:
        assert abs(kudos - ledger) < EPS, (user_id, kudos, ledger)
    # 2. Conservation: rewards and charges come in pairs that burn exactly 1 kudos.
    pairs = await q(
        "SELECT ref, sum(CASE WHEN kind = 'reward' THEN 1 ELSE 0 END), "
        "sum(CASE WHEN kind = 'charge' THEN 1 ELSE 0 END), sum(amount) "
        "FROM kudos_events WHERE kind IN ('reward', 'charge') GROUP BY ref",
    )
    for ref, rewards, charges, total in pairs:
        assert (rewards, charges) == (1, 1), ref
        assert abs(total + 1) < EPS, (ref, total)
    kinds = set(r[0] for r in await q("SELECT DISTINCT kind FROM kudos_events"))
    assert kinds <= {"grant", "reward", "charge"}
    [(events, grants, users_total)] = await q(
        "SELECT (SELECT coalesce(sum(amount), 0) FROM kudos_events), "
        "(SELECT coalesce(sum(amount), 0) FROM kudos_events WHERE kind = 'grant'), "
        "(SELECT coalesce(sum(kudos), 0) FROM users)",
    )
    assert abs(events - (grants - len(pairs))) < EPS
    assert abs(users_total - (grants - len(pairs))) < EPS
    # 5. The usage history is the ledger's, per user, as requester and as worker owner.
    for column, kind, sign, who in (
        ("kudos_spent", "charge", -1, "user_id"),
        ("kudos_earned", "reward", 1, "owner_id"),
    ):
        history = dict(await q(f"SELECT {who}, sum({column}) FROM usage_records GROUP BY {who}"))
        ledger = dict(
            await q(f"SELECT user_id, sum(amount) FROM kudos_events WHERE kind = '{kind}' GROUP BY user_id")
        )
        for user_id in set(history) | set(ledger):
            assert abs(history.get(user_id, 0.0) - sign * ledger.get(user_id, 0.0)) < EPS * 100, (
                column,
                user_id,
            )
    # 3. Holds.
    requests = {
        rid: (state, processing)
        for rid, state, processing in await q(
            "SELECT r.id, r.state, (SELECT count(*) FROM generations g WHERE g.request_id = r.id "
            "AND g.state = 'processing' AND NOT g.fake) FROM text_requests r",
        )
    }
    seen: set[str] = set()
    for key, request_id, amount, remaining, active in await q(
        "SELECT key, request_id, amount, remaining, active FROM kudos_holds"
    ):
        assert key == f"upfront:{request_id}"
        assert request_id not in seen
        seen.add(request_id)
        assert -EPS <= remaining <= amount + EPS
        if active:
            assert request_id in requests, f"active hold for a removed request {request_id}"
            state, processing = requests[request_id]
            assert state == "waiting" or processing > 0, (request_id, state)
        else:
            assert remaining == 0
    # 4. Job accounting and spent kudos.
    for row in await q(
        "SELECT r.id, r.n_total, r.n_remaining, (SELECT count(*) FROM generations g WHERE "
        "g.request_id = r.id AND NOT g.fake AND g.state IN ('processing', 'ok', 'censored')) "
        "FROM text_requests r WHERE r.state = 'waiting'",
    ):
        assert row[1] == row[2] + row[3], row
    for request_id, spent, charged in await q(
        "SELECT r.id, r.kudos_spent, (SELECT coalesce(-sum(e.amount), 0) FROM kudos_events e "
        "JOIN generations g ON g.id = e.ref WHERE g.request_id = r.id AND e.kind = 'charge') "
        "FROM text_requests r",
    ):
        assert abs(spent - charged) < 0.011, (request_id, spent, charged)


# --- settlement ----------------------------------------------------------------------------------


async def test_requester_pays_reward_plus_one_and_the_owner_earns_the_reward(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=10)
    requester = await client.user("requester", kudos=1000)
    params = {"max_length": 200, "max_context_length": 4096}
    request_id = (await client.create(requester, models=["Rocinante-X-12B-v1"], params=params)).json()["id"]
    job = (await client.pop(owner, "w1", models=["Rocinante-X-12B-v1"], max_context_length=8192)).json()
    reward = (await client.submit(owner, job["id"], "y" * 399)).json()["reward"]  # ceil(399/4) = 100 tokens
    assert reward == await client.expected_reward(request_id, 100, "Rocinante-X-12B-v1")
    # Priced at the context the job needs: the prompt (ceil(12 / 4) = 3 tokens) and max_length 200,
    # not the 4096 the request declared.
    assert await client.price(request_id) == (round(200 * 12 * context_multiplier(203) / 100 + 1, 2), 203)
    assert reward == pytest.approx(round(100 * 12 / 125 * context_multiplier(203), 2))
    assert await client.balance("owner") == pytest.approx(10 + reward)
    assert await client.balance("requester") == pytest.approx(1000 - reward - 1)
    assert (await client.status(request_id)).json()["kudos"] == pytest.approx(reward + 1)
    events = await _rows(
        client, "SELECT kind, amount, ref FROM kudos_events WHERE kind != 'grant' ORDER BY kind"
    )
    assert events == [("charge", -round(reward + 1, 2), job["id"]), ("reward", reward, job["id"])]
    await reconcile(client)


async def test_worker_records_its_earnings(client: HordeClient) -> None:
    owner = await client.user("owner")
    await client.create(ANON, params={"n": 2})
    total = 0.0
    for _ in range(2):
        job = (await client.pop(owner, "w1")).json()
        total += (await client.submit(owner, job["id"], "z" * 200)).json()["reward"]
    [(worker_id,)] = await _rows(client, "SELECT id FROM workers")
    worker = (await client.http.get(f"/api/v2/workers/{worker_id}")).json()
    assert worker["kudos_rewards"] == pytest.approx(total)
    assert worker["tokens_generated"] == 100
    assert worker["requests_fulfilled"] == 2
    found = (await client.http.get("/api/v2/find_user", headers={"apikey": owner})).json()
    assert found["kudos"] == pytest.approx(total)
    # The anonymous account paid and went below zero (its floor only limits holds).
    anon = (await client.http.get("/api/v2/find_user", headers={"apikey": ANON})).json()
    assert anon["kudos"] == pytest.approx(-(total + 2))
    await reconcile(client)


# --- holds ---------------------------------------------------------------------------------------


async def test_hold_is_placed_consumed_and_released_on_completion(client: HordeClient) -> None:
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=1000)
    body = {"models": ["m-12B"], "slow_workers": False, "params": {"n": 2, "max_length": 100}}
    created = await client.create(rich, **body)
    assert created.status_code == 202, created.text
    request_id = created.json()["id"]
    job_price, context = await client.price(request_id)
    cost = round(2 * job_price, 2)
    assert job_price == round(100 * 12 * context_multiplier(context) / 100 + 1, 2)
    assert created.json()["kudos"] == pytest.approx(cost)
    assert await _holds(client) == [(f"upfront:{request_id}", request_id, cost, cost, True)]
    # The hold is a reservation: the balance is untouched until jobs are charged.
    assert await client.balance("rich") == 1000

    job = (await client.pop(owner, "w1", models=["m-12B"])).json()
    reward = (await client.submit(owner, job["id"], "x" * 100)).json()["reward"]
    [(_, _, _, remaining, active)] = await _holds(client)
    assert active is True
    assert remaining == pytest.approx(cost - (reward + 1))
    await reconcile(client)

    job = (await client.pop(owner, "w1", models=["m-12B"])).json()
    await client.submit(owner, job["id"], "x" * 100)
    assert [h[3:] for h in await _holds(client)] == [(0.0, False)]
    await reconcile(client)


async def test_one_hold_per_request(client: HordeClient) -> None:
    rich = await client.user("rich", kudos=1000)
    ids = [(await client.create(rich, slow_workers=False)).json()["id"] for _ in range(3)]
    holds = await _holds(client)
    assert sorted(h[0] for h in holds) == sorted(f"upfront:{i}" for i in ids)
    # Free requests hold nothing.
    await client.create(rich)
    assert len(await _holds(client)) == 3


async def test_holds_limit_what_can_be_funded(client: HordeClient) -> None:
    # Registered floor 25, then room for three holds of the request's price and half of a fourth.
    quoter = await client.user("quoter", kudos=1000)
    price = (await client.create(quoter, slow_workers=False, dry_run=True)).json()["kudos"]
    rich = await client.user("rich", kudos=25 + 3.5 * price)
    codes = [(await client.create(rich, slow_workers=False)).status_code for _ in range(4)]
    assert codes == [202, 202, 202, 403]
    assert sum(h[3] for h in await _holds(client)) == pytest.approx(3 * price)


async def test_hold_released_on_cancel_once_running_jobs_end(client: HordeClient) -> None:
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=1000)
    request_id = (await client.create(rich, slow_workers=False, params={"n": 3})).json()["id"]
    job = (await client.pop(owner, "w1")).json()
    await client.cancel(request_id)
    assert [h[4] for h in await _holds(client)] == [True]  # a job still runs
    await reconcile(client)
    await client.submit(owner, job["id"], "x" * 40)
    assert [h[3:] for h in await _holds(client)] == [(0.0, False)]
    await reconcile(client)

    idle = (await client.create(rich, slow_workers=False)).json()["id"]
    await client.cancel(idle)
    assert all(not h[4] for h in await _holds(client))
    assert await client.balance("rich") == pytest.approx(
        1000 - (await client.status(request_id)).json()["kudos"]
    )


async def test_hold_released_on_fault(client: HordeClient) -> None:
    rich = await client.user("rich", kudos=1000)
    request_id = (await client.create(rich, slow_workers=False)).json()["id"]
    for name in ("w1", "w2", "w3"):  # a request faults once several distinct owners failed it
        owner = await client.user(f"owner-{name}")
        job = (await client.pop(owner, name)).json()
        await client.submit(owner, job["id"], "", state="faulted")
    assert (await client.status(request_id)).json()["faulted"] is True
    assert [h[3:] for h in await _holds(client)] == [(0.0, False)]
    assert await client.balance("rich") == 1000
    await reconcile(client)


async def test_hold_released_on_expiry(client: HordeClient) -> None:
    rich = await client.user("rich", kudos=1000)
    await client.create(rich, slow_workers=False)
    client.clock.advance(1201)
    await client.sweep()
    assert [h[3:] for h in await _holds(client)] == [(0.0, False)]
    assert await _rows(client, "SELECT id FROM text_requests") == []
    await reconcile(client)


async def test_a_submit_touches_holds_and_counts_jobs_only_where_they_can_be(client: HordeClient) -> None:
    """A free request has no hold, and a request of n = 1 runs one job at a time: the submit that
    ends it sends no statement of kudos_holds beyond its request's read, and no count of running
    jobs. A funded request of n = 2 still takes its first charge from its hold, then counts its
    other job and releases the hold with its last."""
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=1000)
    free = await client.create(rich, models=["a-7B"])
    funded = await client.create(rich, models=["m-12B"], slow_workers=False, params={"n": 2})
    assert [h[1] for h in await _holds(client)] == [funded.json()["id"]]  # the free one holds nothing

    async def submit_one(model: str) -> tuple[list[str], list[str]]:
        job = (await client.pop(owner, "w1", models=[model])).json()
        with statements_sent(client.horde.engine) as sent:
            assert (await client.submit(owner, job["id"], "x" * 40)).status_code == 200
        statements = [s.statement for s in sent]
        holds = [s for s in statements if "kudos_holds" in s and "FROM text_requests" not in s]
        return holds, [s for s in statements if "count(generations.id)" in s]

    assert await submit_one("a-7B") == ([], [])
    first_holds, first_counts = await submit_one("m-12B")
    assert (bool(first_holds), first_counts) == (True, []), first_holds
    last_holds, last_counts = await submit_one("m-12B")
    assert (len(last_holds), len(last_counts)) == (1, 1), (last_holds, last_counts)
    assert [h[3:] for h in await _holds(client)] == [(0.0, False)]
    assert (await client.status(free.json()["id"])).json()["done"] is True
    assert (await client.status(funded.json()["id"])).json()["done"] is True
    await reconcile(client)


async def test_lapse_keeps_the_hold_and_charges_nothing(client: HordeClient) -> None:
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=1000)
    await client.create(rich, slow_workers=False)
    await client.pop(owner, "w1")
    client.clock.advance(151)
    await client.sweep()
    assert [h[4] for h in await _holds(client)] == [True]  # the job was given back and waits
    assert await client.balance("rich") == 1000
    await reconcile(client)


# --- reconciliation over random sequences --------------------------------------------------------


async def _random_walk(client: HordeClient, seed: int, steps: int) -> Counter_:
    rng = random.Random(seed)
    keys = {
        "anon": ANON,
        "alice": await client.user("alice", kudos=400),
        "bob": await client.user("bob", kudos=60),
        "carol": await client.user("carol"),
        "dave": await client.user("dave", kudos=5),
    }
    moderator = await client.user("mod", moderator=True)
    workers = {"wa": "alice", "wb": "bob", "wc": "carol", "wd": "dave"}
    for name, owner in workers.items():
        await client.pop(keys[owner], name, models=["m-12B", "other"])
    [(paused_id,)] = await _rows(client, "SELECT id FROM workers WHERE name = 'wd'")
    pause = await client.http.put(
        f"/api/v2/workers/{paused_id}", json={"paused": True}, headers={"apikey": moderator}
    )
    assert pause.status_code == 200
    requests: list[str] = []
    # (generation id, the worker owner's key) of jobs handed out, not yet submitted / submitted.
    pending: list[tuple[str, str]] = []
    submitted: list[tuple[str, str]] = []
    # A fixed start, so every walk charges at least one job whatever its seed.
    requests.append((await client.create(keys["alice"], models=["m-12B"])).json()["id"])
    first = (await client.pop(keys["bob"], "wb", models=["m-12B", "other"])).json()
    assert (await client.submit(keys["bob"], first["id"], "x" * 80)).status_code == 200
    seen = Counter_()
    for _ in range(steps):
        op = rng.choices(
            ["create", "pop", "ok", "fault", "tick", "lapse", "cancel", "expire", "duplicate", "thief"],
            weights=[8, 8, 6, 2, 2, 1, 1, 0.3, 1, 0.5],
        )[0]
        seen[op] += 1
        if op == "create":
            who = rng.choice(["anon", "alice", "bob", "carol"])
            body: dict[str, Any] = {
                "params": {"n": rng.randint(1, 3), "max_length": rng.choice([16, 64, 200])},
                "models": rng.choice([[], ["m-12B"]]),
                "slow_workers": rng.random() < 0.7,
            }
            response = await client.create(keys[who], **body)
            # 503 NoEligibleWorker: a request the free floor refuses (n x max_length above it) while
            # no online worker can serve it.
            assert response.status_code in (202, 403, 429, 503), response.text
            if response.status_code == 202:
                requests.append(response.json()["id"])
        elif op == "pop":
            name = rng.choice(list(workers))
            key = keys[workers[name]]
            answer = await client.pop(
                key, name, models=["m-12B", "other"], amount=rng.randint(1, 2), threads=2
            )
            assert answer.status_code == 200, answer.text
            pending += [(g, key) for g in answer.json()["ids"]]
        elif op in ("ok", "fault", "duplicate", "thief") and (pending or submitted):
            # ok/fault/thief pick a job not yet submitted (when there is one); duplicate a submitted one.
            pool = submitted if (op == "duplicate" and submitted) or not pending else pending
            gen_id, key = rng.choice(pool)
            if op in ("ok", "fault") and pool is pending:
                pending.remove((gen_id, key))
                submitted.append((gen_id, key))
            if op == "thief":
                key = keys["carol"] if key != keys["carol"] else keys["bob"]
            state = "faulted" if op == "fault" else "ok"
            answer = await client.submit(key, gen_id, "w" * rng.randint(0, 600), state=state)
            assert answer.status_code in (200, 400, 403, 404), answer.text
            if answer.status_code != 200:
                rc = answer.json()["rc"]
                assert rc in ("DuplicateGen", "AbortedGen", "WrongCredentials", "InvalidJobID"), rc
        elif op == "tick":
            client.clock.advance(rng.uniform(0, 40))
            await client.sweep()
        elif op == "lapse":
            client.clock.advance(151)
            await client.sweep()
        elif op == "cancel" and requests:
            answer = await client.cancel(rng.choice(requests))
            assert answer.status_code in (200, 404)
        elif op == "expire":
            client.clock.advance(1201)
            await client.sweep()
        await reconcile(client)
    # Drain: everything lapses, then expires; nothing stays held.
    client.clock.advance(151)
    await client.sweep()
    client.clock.advance(1201)
    await client.sweep()
    await reconcile(client)
    assert await _rows(client, "SELECT key FROM kudos_holds WHERE active") == []
    assert await _rows(client, "SELECT id FROM text_requests") == []
    return seen


class Counter_(dict[str, int]):
    def __missing__(self, key: str) -> int:
        return 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_random_sequences_reconcile(client: HordeClient, seed: int) -> None:
    seen = await _random_walk(client, seed, steps=60)
    # The walk exercised the paths the invariant is about.
    for op in ("create", "pop", "ok", "tick"):
        assert seen[op] > 0, seen
    [(charges,)] = await _rows(client, "SELECT count(*) FROM kudos_events WHERE kind = 'charge'")
    assert charges > 1, seen


async def test_the_operators_model_reference_prices_and_rewards(db_url: str) -> None:
    from tests.integration.test_horde_requests import custom_client

    async with custom_client(
        db_url, kudos={"models": {"house-model": 30, "Rocinante-X-12B-v1": 6}}
    ) as client:
        rich = await client.user("rich", kudos=1000)
        owner = await client.user("owner")
        quote = await client.create(
            rich, models=["house-model"], params={"max_length": 70, "n": 2}, dry_run=True
        )
        # Upstream's quote at the context the job needs (a 3-token prompt and max_length), plus the burn.
        job_price = round(70 * (30 / 13) ** 0.2 * 30 * context_multiplier(73) / 100 + 1, 2)
        assert quote.json()["kudos"] == pytest.approx(round(job_price * 2, 2))
        listed = await client.create(rich, models=["Rocinante-X-12B-v1"], dry_run=True)
        # The reference beats the name.
        assert listed.json()["kudos"] == pytest.approx(round(80 * 6 * context_multiplier(83) / 100 + 1, 2))
        # 500 characters are 125 tokens, within the job's max_length (a reward counts no more).
        await client.create(
            rich, models=["house-model"], params={"max_length": 200, "max_context_length": 1024}
        )
        job = (await client.pop(owner, "w1", models=["house-model"])).json()
        reward = (await client.submit(owner, job["id"], "x" * 500)).json()["reward"]
        assert reward == pytest.approx(round(125 * (30 / 13) ** 0.2 * 30 / 125 * context_multiplier(203), 2))
        await reconcile(client)
