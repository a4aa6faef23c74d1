"""Shared keys (docs/reference/horde_api.md, "Shared keys"): /api/v2/sharedkeys
create/show/patch/delete, a shared key as requester with its kudos budget, expiry and token cap,
utilized growing with charges, and no workers under a shared key."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import text

from horde_lite.accounts.users import hash_key
from tests.support.horde import ANON, HordeClient

DAY = 86400


async def _make(client: HordeClient, owner: str, **body: Any) -> dict[str, Any]:
    created = await client.http.post("/api/v2/sharedkeys", json=body, headers={"apikey": owner})
    assert created.status_code == 200, created.text
    return created.json()


async def _rows(client: HordeClient, sql: str) -> list[Any]:
    async with client.horde.sessionmaker() as session:
        return list((await session.execute(text(sql))).all())


async def _serve(client: HordeClient, request_id: str, text_out: str = "x" * 40) -> float:
    """A worker of another user takes one job of `request_id` and submits it; returns the reward."""
    worker_key = await client.user(f"worker-owner-{uuid.uuid4().hex[:6]}")
    job = (await client.pop(worker_key, f"w-{uuid.uuid4().hex[:6]}", models=["m-12B"])).json()
    assert job["id"] is not None, job
    assert job["payload"]["prompt"]
    submitted = await client.submit(worker_key, job["id"], text_out)
    assert submitted.status_code == 200, submitted.text
    status = (await client.status(request_id)).json()
    assert status["finished"] >= 1
    return submitted.json()["reward"]


async def test_create_show_patch_delete(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=100)
    now = client.clock.now()
    made = await _make(client, owner, kudos=500, expiry=2, name="for friends", max_text_tokens=1024)
    key = made["id"]
    assert str(uuid.UUID(key)) == key  # a canonical UUID4: the key is its own id
    assert uuid.UUID(key).version == 4
    assert made["username"].startswith("owner#")
    assert made["name"] == "for friends"
    assert made["kudos"] == 500
    assert made["utilized"] == 0
    assert made["max_text_tokens"] == 1024
    assert made["expiry"] == now + 2 * DAY  # epoch seconds

    shown = await client.http.get(f"/api/v2/sharedkeys/{key}")
    assert shown.status_code == 200
    assert shown.json() == made

    # PATCH changes only the fields it sends.
    patched = await client.http.patch(
        f"/api/v2/sharedkeys/{key}", json={"name": "renamed"}, headers={"apikey": owner}
    )
    assert patched.status_code == 200, patched.text
    assert patched.json() == {**made, "name": "renamed"}
    patched = await client.http.patch(
        f"/api/v2/sharedkeys/{key}", json={"kudos": -1, "expiry": -1}, headers={"apikey": owner}
    )
    assert patched.json()["kudos"] == -1
    assert patched.json()["expiry"] is None
    assert patched.json()["max_text_tokens"] == 1024
    assert (await client.http.get(f"/api/v2/sharedkeys/{key}")).json() == patched.json()

    deleted = await client.http.delete(f"/api/v2/sharedkeys/{key}", headers={"apikey": owner})
    assert deleted.status_code == 200
    assert deleted.json() == {"message": "OK"}
    gone = await client.http.get(f"/api/v2/sharedkeys/{key}")
    assert gone.status_code == 404
    assert gone.json()["rc"] == "SharedKeyNotFound"
    refused = await client.create(key)
    assert refused.status_code == 401
    assert refused.json()["rc"] == "InvalidAPIKey"


async def test_defaults_and_only_the_hash_is_stored(client: HordeClient) -> None:
    owner = await client.user("owner")
    made = await _make(client, owner)
    assert made["kudos"] == 5000  # upstream default budget
    assert made["expiry"] is None
    assert made["max_text_tokens"] == -1
    rows = await _rows(client, "SELECT * FROM shared_keys")
    assert len(rows) == 1
    assert made["id"] not in repr(rows)
    assert hash_key(made["id"]) in repr(rows)


async def test_who_may_manage_shared_keys(client: HordeClient) -> None:
    owner = await client.user("owner")
    other = await client.user("other")
    key = (await _make(client, owner))["id"]
    for method in ("PATCH", "DELETE"):
        response = await client.http.request(
            method, f"/api/v2/sharedkeys/{key}", json={"name": "mine"}, headers={"apikey": other}
        )
        assert response.status_code == 403
        assert response.json()["rc"] == "WrongCredentials"
    anon = await client.http.post("/api/v2/sharedkeys", json={}, headers={"apikey": ANON})
    assert anon.status_code == 403
    assert anon.json()["rc"] == "AnonForbidden"
    # A shared key cannot make or change shared keys.
    nested = await client.http.post("/api/v2/sharedkeys", json={}, headers={"apikey": key})
    assert nested.status_code == 403
    assert nested.json()["rc"] == "WrongCredentials"
    unknown = await client.http.get(f"/api/v2/sharedkeys/{uuid.uuid4()}")
    assert unknown.status_code == 404
    assert unknown.json()["rc"] == "SharedKeyNotFound"
    bad = await client.http.post("/api/v2/sharedkeys", json={"kudos": -5}, headers={"apikey": owner})
    assert bad.status_code == 400
    assert bad.json()["rc"] == "BadRequest"
    assert len(await _rows(client, "SELECT key_hash FROM shared_keys")) == 1


async def test_shared_key_as_requester_charges_the_owner(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=1000)
    key = (await _make(client, owner, kudos=-1))["id"]
    created = await client.create(key, models=["m-12B"], params={"max_length": 64})
    assert created.status_code == 202, created.text
    request_id = created.json()["id"]
    rows = await _rows(client, "SELECT requester_kind, user_id, shared_key_hash FROM text_requests")
    owner_id = (await client.http.get("/api/v2/find_user", headers={"apikey": owner})).json()["id"]
    assert rows == [("shared_key", owner_id, hash_key(key))]

    reward = await _serve(client, request_id)
    assert reward > 0
    assert await client.balance("owner") == round(1000 - (reward + 1), 2)
    shown = (await client.http.get(f"/api/v2/sharedkeys/{key}")).json()
    assert shown["utilized"] == round(reward + 1, 2)  # utilized grows with charges; -1 is unlimited

    created = await client.create(key, models=["m-12B"], params={"max_length": 64})
    assert created.status_code == 202
    second = await _serve(client, created.json()["id"])
    shown = (await client.http.get(f"/api/v2/sharedkeys/{key}")).json()
    assert shown["utilized"] == round(reward + 1 + second + 1, 2)


async def test_shared_key_budget_runs_empty(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=1000)
    body = {"models": ["m-12B"], "params": {"max_length": 64}}
    price = (await client.create(owner, dry_run=True, **body)).json()["kudos"]
    key = (await _make(client, owner, kudos=round(1.5 * price, 2)))["id"]
    # A free request must fit the key's budget at its price.
    created = await client.create(key, **body)
    assert created.status_code == 202, created.text
    await _serve(client, created.json()["id"], "x" * 200)  # 50 tokens
    charge = round(await client.expected_reward(created.json()["id"], 50, "m-12B") + 1, 2)
    shown = (await client.http.get(f"/api/v2/sharedkeys/{key}")).json()
    assert shown["utilized"] == charge
    short = await client.create(key, **body)
    assert short.status_code == 403
    assert short.json()["rc"] == "SharedKeyInsufficientKudos"  # 1.5 prices less the charge left
    await client.http.patch(f"/api/v2/sharedkeys/{key}", json={"kudos": charge}, headers={"apikey": owner})
    empty = await client.create(key, **body)
    assert empty.status_code == 403
    assert empty.json()["rc"] == "SharedKeyEmpty"
    # Raising the budget revives it.
    await client.http.patch(f"/api/v2/sharedkeys/{key}", json={"kudos": -1}, headers={"apikey": owner})
    assert (await client.create(key, **body)).status_code == 202


async def test_shared_key_budget_limits_a_funded_request(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=10_000)
    # slow_workers: false always needs a hold, at the request's price.
    body = {"models": ["m-12B"], "slow_workers": False, "params": {"max_length": 80}}
    price = (await client.create(owner, dry_run=True, **body)).json()["kudos"]
    budget = round(price - 1, 2)
    key = (await _make(client, owner, kudos=budget))["id"]
    refused = await client.create(key, **body)
    assert refused.status_code == 403
    assert refused.json()["rc"] == "SharedKeyInsufficientKudos"
    assert f"{budget:g}" in refused.json()["message"]
    # The owner's own key can pay for the same request.
    assert (await client.create(owner, **body)).status_code == 202
    # Half the tokens cost less, within the key's budget.
    half = {**body, "params": {"max_length": 40}}
    half_price = (await client.create(owner, dry_run=True, **half)).json()["kudos"]
    funded = await client.create(key, **half)
    assert funded.status_code == 202, funded.text
    holds = await _rows(client, "SELECT key, amount, active FROM kudos_holds ORDER BY amount")
    assert holds[0] == (f"upfront:{funded.json()['id']}", half_price, True)


async def test_shared_key_expiry(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=100)
    key = (await _make(client, owner, expiry=1))["id"]
    assert (await client.create(key)).status_code == 202
    client.clock.advance(DAY + 1)
    expired = await client.create(key)
    assert expired.status_code == 403
    assert expired.json()["rc"] == "SharedKeyExpired"
    # An expired key is refused whatever the request would have cost.
    expired = await client.create(key, slow_workers=False)
    assert expired.json()["rc"] == "SharedKeyExpired"
    assert len(await _rows(client, "SELECT id FROM text_requests")) == 1


async def test_shared_key_max_text_tokens(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=100)
    key = (await _make(client, owner, max_text_tokens=100))["id"]
    assert (await client.create(key, params={"max_length": 100})).status_code == 202
    over = await client.create(key, params={"max_length": 101})
    assert over.status_code == 403
    assert over.json()["rc"] == "SharedKeyInsufficientKudos"
    assert "100" in over.json()["message"]
    assert len(await _rows(client, "SELECT id FROM text_requests")) == 1
    # The free request reserves the key's budget only, not its owner's kudos.
    assert await _rows(client, "SELECT reserves_user FROM kudos_holds") == [(False,)]


async def test_shared_key_cannot_run_a_worker(client: HordeClient) -> None:
    owner = await client.user("owner")
    key = (await _make(client, owner))["id"]
    popped = await client.pop(key, "borrowed")
    assert popped.status_code == 403
    assert popped.json()["rc"] == "WrongCredentials"
    assert await _rows(client, "SELECT id FROM workers") == []


async def test_shared_key_values_out_of_range(client: HordeClient) -> None:
    owner = await client.user("owner")
    for body in ({"max_text_tokens": 10**12}, {"max_text_tokens": -2}, {"expiry": -2}, {"kudos": "lots"}):
        response = await client.http.post("/api/v2/sharedkeys", json=body, headers={"apikey": owner})
        assert response.status_code == 400, (body, response.text)
        assert response.json()["rc"] == "BadRequest"
    key = (await _make(client, owner))["id"]
    patched = await client.http.patch(
        f"/api/v2/sharedkeys/{key}", json={"max_text_tokens": 10**12}, headers={"apikey": owner}
    )
    assert patched.status_code == 400
    assert len(await _rows(client, "SELECT key_hash FROM shared_keys")) == 1
