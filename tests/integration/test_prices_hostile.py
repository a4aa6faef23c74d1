"""A hostile participant cannot set a price: what a request costs is fixed at admission from the
horde's model sizes, every reward is bounded by its job's share of that quote, budgets hold because
the charge can never exceed the hold, and the database refuses any amount past the bounds.

Each test plays the attacker over HTTP (a worker declaring absurd model sizes and contexts, a
requester naming none, a shared key holder choosing a huge context), on SQLite and PostgreSQL.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from horde_lite.requests.prices import BURN, context_multiplier
from horde_lite.settings import KUDOS_LIMIT
from tests.integration.test_horde_requests import custom_client
from tests.support.horde import ANON, HordeClient
from tests.support.invariants import check

EVIL = {"models": ["evil-9000B", "evil-99999999B"], "max_length": 4096, "max_context_length": 1_048_576}


async def _serve(
    client: HordeClient, key: str, worker: str, text_out: str, **declared: Any
) -> dict[str, Any]:
    job = (await client.pop(key, worker, **declared)).json()
    assert job["id"] is not None, job
    submitted = await client.submit(key, job["id"], text_out)
    assert submitted.status_code == 200, submitted.text
    return {"job": job, "reward": submitted.json()["reward"]}


async def _assert_books(client: HordeClient) -> None:
    report = await check(client.horde.engine)
    assert report.ok, report.violations


async def test_a_worker_declaring_absurd_sizes_earns_at_most_the_quote(client: HordeClient) -> None:
    mallory = await client.user("mallory")
    payer = await client.user("payer", kudos=10_000)
    created = await client.create(payer, params={"max_length": 64})  # names no model
    assert created.status_code == 202, created.text
    quote = created.json()["kudos"]
    # Priced at admission as a 13B model's, at the context the job needs (3 prompt tokens + 64).
    assert quote == round(64 * 13 * context_multiplier(67) / 100 + BURN, 2)
    served = await _serve(client, mallory, "evil", "x" * (64 * 16 + 1024), **EVIL)  # at the bound
    assert served["job"]["model"] == "evil-9000B"  # served under the worker's own absurd name
    assert 0 < served["reward"] <= round(quote - BURN, 2)
    assert await client.balance("payer") >= 10_000 - quote
    assert (await client.status(created.json()["id"])).json()["kudos"] <= quote
    await _assert_books(client)


async def test_a_name_claims_at_most_the_name_limit(client: HordeClient) -> None:
    payer = await client.user("payer", kudos=10_000)
    named = await client.create(payer, models=["evil-9000B"], params={"max_length": 64}, dry_run=True)
    plain = await client.create(payer, params={"max_length": 64}, dry_run=True)
    assert named.json()["kudos"] == plain.json()["kudos"]  # 9000B in a name prices as 13B
    honest = await client.create(
        payer, models=["Llama-3.3-70B-Instruct"], params={"max_length": 64}, dry_run=True
    )
    assert honest.json()["kudos"] == plain.json()["kudos"]


async def test_the_operators_sizes_price_and_bound_an_honest_70b(db_url: str) -> None:
    async with custom_client(db_url, kudos={"models": {"Llama-3.3-70B-Instruct": 70}}) as client:
        owner = await client.user("owner", trusted=True)
        payer = await client.user("payer", kudos=100_000)
        body = {
            "models": ["Llama-3.3-70B-Instruct"],
            "params": {"max_length": 200, "max_context_length": 8192},
        }
        created = (await client.create(payer, **body)).json()
        job_price = round(200 * (70 / 13) ** 0.2 * 70 * context_multiplier(203) / 100 + BURN, 2)
        assert created["kudos"] == job_price
        served = await _serve(
            client, owner, "big", "y" * 800, models=["Llama-3.3-70B-Instruct"], max_context_length=131_072
        )
        expected = round(200 * (70 / 13) ** 0.2 * 70 / 125 * context_multiplier(203), 2)
        assert served["reward"] == expected  # upstream's reward, at the priced context
        assert served["reward"] <= job_price - BURN
        await _assert_books(client)


async def test_a_declared_context_does_not_raise_a_price_or_a_reward(client: HordeClient) -> None:
    mallory = await client.user("mallory")
    small = await client.create(ANON, params={"max_length": 64, "max_context_length": 2048})
    huge = await client.create(ANON, params={"max_length": 64, "max_context_length": 1_048_576})
    assert small.json()["kudos"] == huge.json()["kudos"]
    rewards = [
        (await _serve(client, mallory, "evil", "z" * 256, **EVIL))["reward"] for _ in range(2)
    ]  # fmt: skip
    assert rewards[0] == rewards[1]
    anon = (await client.http.get("/api/v2/find_user", headers={"apikey": ANON})).json()
    assert math.isfinite(anon["kudos"])
    assert anon["kudos"] >= -(small.json()["kudos"] + huge.json()["kudos"])
    await _assert_books(client)


async def test_a_long_prompt_is_priced_and_rewarded_at_its_real_context(client: HordeClient) -> None:
    owner = await client.user("owner")
    prompt = "p" * 40_000  # 10,000 tokens
    created = await client.create(
        ANON, prompt=prompt, params={"max_length": 64, "max_context_length": 16_384}
    )
    quote = created.json()["kudos"]
    assert quote == round(64 * 13 * context_multiplier(10_064) / 100 + BURN, 2)
    served = await _serve(client, owner, "w", "x" * 256, models=["m-12B"], max_context_length=16_384)
    assert served["reward"] == round(64 * 12 / 125 * context_multiplier(10_064), 2)
    await _assert_books(client)


async def test_a_shared_keys_budget_holds_whatever_its_holder_and_the_worker_declare(
    client: HordeClient,
) -> None:
    owner = await client.user("owner", kudos=100_000)
    mallory = await client.user("mallory")
    body = {"params": {"max_length": 512, "max_context_length": 1_048_576, "n": 2}}
    price = (await client.create(owner, dry_run=True, **body)).json()["kudos"]
    made = await client.http.post("/api/v2/sharedkeys", json={"kudos": price}, headers={"apikey": owner})
    key = made.json()["id"]
    created = await client.create(key, **body)
    assert created.status_code == 202, created.text
    assert (await client.create(key, **body)).json()["rc"] == "SharedKeyInsufficientKudos"
    for _ in range(2):
        await _serve(client, mallory, "evil", "x" * (512 * 16 + 1024), **EVIL)  # at the bound
    shown = (await client.http.get(f"/api/v2/sharedkeys/{key}", headers={"apikey": owner})).json()
    assert 0 < shown["utilized"] <= price
    await _assert_books(client)


async def test_an_unknown_model_earns_an_untrusted_owner_upstreams_flat_reward(client: HordeClient) -> None:
    stranger = await client.user("stranger")
    friend = await client.user("friend", trusted=True)
    payer = await client.user("payer", kudos=10_000)
    rewards = {}
    for name, key in (("stranger", stranger), ("friend", friend)):
        created = await client.create(payer, models=["mystery"], params={"max_length": 400})
        assert created.json()["kudos"] == round(400 * 0.027 * context_multiplier(403) + BURN, 2)
        rewards[name] = (await _serve(client, key, f"w-{name}", "x" * 1600, models=["mystery"]))["reward"]
    assert rewards["stranger"] == round(context_multiplier(403), 2)
    assert rewards["friend"] == round(400 * 0.027 * context_multiplier(403), 2)
    await _assert_books(client)


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE users SET kudos = 1e13",
        "UPDATE users SET kudos = -1e13",
        "UPDATE shared_keys SET utilized = 2e12",
        "UPDATE kudos_holds SET remaining = -5",
        "UPDATE text_requests SET job_price = 1e300",
        "UPDATE generations SET reward = 1e13",
        "UPDATE workers SET kudos_earned = -1",
        "INSERT INTO kudos_events (user_id, amount, kind, ref, created_at) "
        "SELECT id, 1e15, 'grant', 't', 0 FROM users",
    ],
)
@pytest.mark.slow
async def test_the_database_refuses_amounts_past_the_bounds(client: HordeClient, sql: str) -> None:
    owner = await client.user("owner", kudos=100)
    made = await client.http.post("/api/v2/sharedkeys", json={"kudos": 50}, headers={"apikey": owner})
    assert made.status_code == 200
    created = await client.create(owner, slow_workers=False)  # a hold and a request
    assert created.status_code == 202, created.text
    await _serve(client, owner, "w", "x" * 40)
    await client.create(owner, slow_workers=False)
    with pytest.raises(IntegrityError, match="kudos_bounded"):
        async with client.horde.sessionmaker() as session, session.begin():
            await session.execute(text(sql))


async def test_a_grant_past_the_bound_is_refused_cleanly(client: HordeClient) -> None:
    admin = await client.user("admin", moderator=True)
    await client.user("whale", kudos=KUDOS_LIMIT - 10)
    found = (await client.http.get("/api/v2/users", headers={"apikey": admin})).json()
    whale = next(u for u in found if u["username"].startswith("whale"))
    answer = await client.http.put(
        f"/api/v2/users/{whale['id']}", json={"kudos": 1000}, headers={"apikey": admin}
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["rc"] == "KudosLimit"
    assert await client.balance("whale") == KUDOS_LIMIT - 10
    await _assert_books(client)
