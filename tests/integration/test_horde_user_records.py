"""User records and moderation: find_user, GET /users, GET/PUT /users/{id}, and POST /kudos/transfer
(docs/reference/horde_api.md), with horde-sdk's own models parsing the answers."""

from __future__ import annotations

import asyncio

from horde_sdk.ai_horde_api.apimodels import (
    KudosTransferResponse,
    ListUsersDetailsResponse,
    ModifyUserResponse,
    UserDetailsResponse,
)
from sqlalchemy import text

from tests.integration.test_horde_jobs import _post_blocking
from tests.support.horde import ANON, HordeClient


async def _me(client: HordeClient, key: str) -> dict[str, object]:
    found = await client.http.get("/api/v2/find_user", headers={"apikey": key})
    assert found.status_code == 200, found.text
    UserDetailsResponse.model_validate(found.json())
    return found.json()


async def _ledger_matches_balances(client: HordeClient) -> None:
    async with client.horde.sessionmaker() as session:
        rows = (
            await session.execute(
                text(
                    "SELECT u.id, u.kudos, COALESCE(SUM(e.amount), 0) FROM users u "
                    "LEFT JOIN kudos_events e ON e.user_id = u.id GROUP BY u.id, u.kudos"
                )
            )
        ).all()
    for user_id, kudos, ledger in rows:
        assert abs(kudos - ledger) < 1e-6, (user_id, kudos, ledger)


async def test_anonymous_is_anonymous_0_everywhere(client: HordeClient) -> None:
    me = await _me(client, ANON)
    assert (me["username"], me["id"]) == ("Anonymous#0", 0)
    shown = await client.http.get("/api/v2/users/0")
    assert shown.status_code == 200
    assert (shown.json()["username"], shown.json()["id"]) == ("Anonymous#0", 0)
    async with client.horde.sessionmaker() as session:
        row_id = (await session.execute(text("SELECT id FROM users WHERE anonymous"))).scalar_one()
    # The anonymous row's own id is not a public one.
    assert (await client.http.get(f"/api/v2/users/{row_id}")).status_code == 404
    listed = (await client.http.get("/api/v2/users")).json()
    assert "Anonymous#0" in [u["username"] for u in listed]


async def test_find_user_shows_own_workers_and_shared_keys(client: HordeClient) -> None:
    key = await client.user("alice", kudos=50)
    await client.pop(key, "w1", models=["m"])
    await client.pop(key, "w2", models=["m"])
    shared = (
        await client.http.post("/api/v2/sharedkeys", json={"name": "lend"}, headers={"apikey": key})
    ).json()
    me = await _me(client, key)
    assert me["worker_count"] == 2
    assert len(me["worker_ids"]) == 2
    assert len(me["sharedkey_ids"]) == 1
    key_id = me["sharedkey_ids"][0]
    assert key_id != shared["id"]  # its hash, never the key itself
    # The owner can manage a key by that id (a lost key can still be deleted).
    shown = await client.http.get(f"/api/v2/sharedkeys/{key_id}")
    assert shown.json()["name"] == "lend"
    assert (
        await client.http.delete(f"/api/v2/sharedkeys/{key_id}", headers={"apikey": key})
    ).status_code == 200
    assert (await _me(client, key))["sharedkey_ids"] == []
    # Through a shared key: the owner's public record, named after the key (upstream).
    lent = (
        await client.http.post("/api/v2/sharedkeys", json={"name": "pal"}, headers={"apikey": key})
    ).json()
    via_key = await _me(client, lent["id"])
    assert via_key["username"] == f"alice#{me['id']} (Shared Key: pal)"
    assert "worker_ids" not in via_key
    assert "sharedkey_ids" not in via_key


async def test_user_by_id_privileges(client: HordeClient) -> None:
    alice = await client.user("alice", kudos=10)
    bob = await client.user("bob")
    moderator = await client.user("mod", moderator=True)
    await client.pop(alice, "w1")
    alice_id = (await _me(client, alice))["id"]
    public = await client.http.get(f"/api/v2/users/{alice_id}")
    assert public.status_code == 200
    UserDetailsResponse.model_validate(public.json())
    assert public.json()["username"] == f"alice#{alice_id}"
    assert public.json()["worker_count"] == 1
    assert "worker_ids" not in public.json()
    for key, privileged in ((bob, False), (alice, True), (moderator, True)):
        body = (await client.http.get(f"/api/v2/users/{alice_id}", headers={"apikey": key})).json()
        assert ("worker_ids" in body) is privileged, key
    bad_key = await client.http.get(f"/api/v2/users/{alice_id}", headers={"apikey": "x" * 22})
    assert bad_key.status_code == 401
    for missing in ("999999", "alice", "1.5", "\u00b2", "9" * 40):
        answer = await client.http.get(f"/api/v2/users/{missing}")
        assert answer.status_code == 404, missing
        assert answer.json()["rc"] == "UserNotFound"


async def test_users_list_pages_and_sorts(client: HordeClient) -> None:
    for i in range(27):
        await client.user(f"user{i:02d}", kudos=float(i))
    first = (await client.http.get("/api/v2/users")).json()
    ListUsersDetailsResponse.model_validate(first)
    assert len(first) == 25
    assert first[0]["username"].startswith("user26#")  # by kudos, highest first
    second = (await client.http.get("/api/v2/users", params={"page": 2})).json()
    assert [u["username"].split("#")[0] for u in second] == ["user01", "user00"]
    by_age = (await client.http.get("/api/v2/users", params={"sort": "age"})).json()
    assert by_age[0]["username"].startswith("user00#")
    assert (await client.http.get("/api/v2/users", params={"page": 0})).json() == first
    assert (await client.http.get("/api/v2/users", params={"page": 10**30})).json() == []
    assert all("worker_ids" not in u for u in first)
    bad = await client.http.get("/api/v2/users", params={"page": "x"})
    assert bad.status_code == 400


async def test_moderators_change_users(client: HordeClient) -> None:
    alice = await client.user("alice", kudos=10)
    bob = await client.user("bob")
    moderator = await client.user("mod", moderator=True)
    await client.pop(alice, "w1")
    alice_id = (await _me(client, alice))["id"]
    path = f"/api/v2/users/{alice_id}"

    refusals = [(bob, 403, "NotModerator"), (alice, 403, "NotModerator"), (ANON, 403, "NotModerator")]
    for key, status, rc in [*refusals, ("x" * 22, 401, "InvalidAPIKey")]:
        refused = await client.http.put(path, json={"kudos": 100}, headers={"apikey": key})
        assert refused.status_code == status, key
        assert refused.json()["rc"] == rc
    assert await client.balance("alice") == 10

    changed = await client.http.put(
        path, json={"kudos": 90.5, "trusted": True}, headers={"apikey": moderator}
    )
    assert changed.status_code == 200, changed.text
    assert changed.json() == {"new_kudos": 100.5, "trusted": True}
    ModifyUserResponse.model_validate(changed.json())
    assert await client.balance("alice") == 100.5
    assert (await _me(client, alice))["kudos_details"]["admin"] == 100.5  # the grant and the change
    w1 = (await client.http.get("/api/v2/workers")).json()[0]
    assert w1["trusted"] is True  # the flag reaches the user's workers at once
    taken = await client.http.put(
        path, json={"kudos": -200, "moderator": True}, headers={"apikey": moderator}
    )
    assert taken.json() == {"new_kudos": -99.5, "moderator": True}
    assert (await _me(client, alice))["moderator"] is True
    await _ledger_matches_balances(client)

    for body, rc in (
        ({}, "NoValidActions"),
        ({"concurrency": 5}, "BadRequest"),
        ({"kudos": 1e12}, "BadRequest"),
    ):
        refused = await client.http.put(path, json=body, headers={"apikey": moderator})
        assert refused.status_code == 400, body
        assert refused.json()["rc"] == rc
    anon = await client.http.put("/api/v2/users/0", json={"moderator": True}, headers={"apikey": moderator})
    assert anon.status_code == 400
    missing = await client.http.put("/api/v2/users/424242", json={"kudos": 1}, headers={"apikey": moderator})
    assert missing.status_code == 404


async def test_kudos_transfer(client: HordeClient) -> None:
    alice = await client.user("alice", kudos=100)
    bob = await client.user("bob")
    bob_name = (await _me(client, bob))["username"]
    alice_name = (await _me(client, alice))["username"]

    sent = await client.http.post(
        "/api/v2/kudos/transfer", json={"username": bob_name, "amount": 30}, headers={"apikey": alice}
    )
    assert sent.status_code == 200, sent.text
    assert sent.json() == {"transferred": 30.0}
    KudosTransferResponse.model_validate(sent.json())
    assert (await client.balance("alice"), await client.balance("bob")) == (70, 30)
    assert (await _me(client, alice))["kudos_details"]["gifted"] == 30
    assert (await _me(client, bob))["kudos_details"]["received"] == 30

    refusals = [
        (alice, {"username": alice_name, "amount": 1}, "KudosTransferToSelf"),
        (alice, {"username": bob_name, "amount": -5}, "NegativeKudosTransfer"),
        (alice, {"username": bob_name, "amount": 0}, "InvalidKudosTransferAmount"),
        (alice, {"username": bob_name, "amount": 70.01}, "KudosTransferNotEnough"),
        (alice, {"username": "Anonymous#0", "amount": 1}, "KudosTransferToAnon"),
        (alice, {"username": "nobody#999", "amount": 1}, "InvalidTargetUsername"),
        (alice, {"username": "bob#999", "amount": 1}, "InvalidTargetUsername"),
        (ANON, {"username": bob_name, "amount": 1}, "KudosTransferFromAnon"),
    ]
    for key, body, rc in refusals:
        refused = await client.http.post("/api/v2/kudos/transfer", json=body, headers={"apikey": key})
        assert refused.status_code == 400, (body, refused.text)
        assert refused.json()["rc"] == rc
    assert (await client.balance("alice"), await client.balance("bob")) == (70, 30)

    # What a waiting request holds is not transferable.
    held = (await client.create(alice, models=["m-12B"], params={"max_length": 100})).json()
    assert held["kudos"] > 0
    over = await client.http.post(
        "/api/v2/kudos/transfer", json={"username": bob_name, "amount": 70}, headers={"apikey": alice}
    )
    assert over.json()["rc"] == "KudosTransferNotEnough"

    # To a shared key: its owner receives, and a limited key's budget grows by the amount.
    lent = (await client.http.post("/api/v2/sharedkeys", json={"kudos": 10}, headers={"apikey": bob})).json()
    to_key = await client.http.post(
        "/api/v2/kudos/transfer", json={"username": lent["id"], "amount": 5}, headers={"apikey": alice}
    )
    assert to_key.status_code == 200
    assert await client.balance("bob") == 35
    assert (await client.http.get(f"/api/v2/sharedkeys/{lent['id']}")).json()["kudos"] == 15
    via_key = await client.http.post(
        "/api/v2/kudos/transfer", json={"username": alice_name, "amount": 1}, headers={"apikey": lent["id"]}
    )
    assert via_key.status_code == 403  # a shared key cannot send its owner's kudos away
    await _ledger_matches_balances(client)


async def test_concurrent_transfers_never_overdraw(client: HordeClient) -> None:
    alice = await client.user("alice", kudos=100)
    bob = await client.user("bob", kudos=100)
    names = [(await _me(client, k))["username"] for k in (alice, bob)]
    path = "/api/v2/kudos/transfer"
    # Both send each other 60 a few times at once: opposite directions, so lock order matters.
    calls = [
        asyncio.to_thread(_post_blocking, client, path, key, {"username": names[1 - i], "amount": 60})
        for _ in range(3)
        for i, key in enumerate((alice, bob))
    ]
    answers = await asyncio.gather(*calls)
    assert {a.status_code for a in answers} <= {200, 400}, [a.text for a in answers]
    assert min(await client.balance("alice"), await client.balance("bob")) >= 0
    assert await client.balance("alice") + await client.balance("bob") == 200
    await _ledger_matches_balances(client)


async def test_shared_key_created_with_put_as_upstream(client: HordeClient) -> None:
    key = await client.user("alice")
    made = await client.http.put(
        "/api/v2/sharedkeys", json={"name": "via put", "kudos": 7}, headers={"apikey": key}
    )
    assert made.status_code == 200, made.text
    assert (made.json()["name"], made.json()["kudos"]) == ("via put", 7)
    assert (await client.http.put("/api/v2/sharedkeys", json={}, headers={"apikey": ANON})).status_code == 403


async def test_records_come_from_the_usage_history_and_outlive_requests(client: HordeClient) -> None:
    """Upstream's `records`, text only: `usage` (tokens the user's requests got) and `request`
    (its requests served) as a requester; `contribution` (tokens) and `fulfillment` (jobs) of its
    workers. Kept after the requests expire, and parsed by horde-sdk's own model."""
    owner = await client.user("owner")
    alice = await client.user("alice", kudos=1000)
    blank = await _me(client, alice)
    assert blank["records"] == {
        "usage": {"tokens": 0, "megapixelsteps": 0.0},
        "contribution": {"tokens": 0, "megapixelsteps": 0.0},
        "fulfillment": {"text": 0, "image": 0, "interrogation": 0},
        "request": {"text": 0, "image": 0, "interrogation": 0},
    }
    created = await client.create(alice, models=["m"], params={"max_length": 64, "n": 2})
    assert created.status_code == 202, created.text
    for out in ("x" * 40, "y" * 20):  # 10 and 5 tokens
        job = (await client.pop(owner, "w1", models=["m"])).json()
        assert (await client.submit(owner, job["id"], out)).status_code == 200
    await client.create(alice, models=["m"], params={"max_length": 64})  # waiting: not served yet
    client.clock.advance(1300)
    await client.sweep()
    alice_id = (await _me(client, alice))["id"]
    owner_id = (await _me(client, owner))["id"]
    for path in (f"/api/v2/users/{alice_id}", "/api/v2/find_user"):
        answer = await client.http.get(path, headers={"apikey": alice})
        parsed = UserDetailsResponse.model_validate(answer.json())
        assert parsed.records is not None
        assert parsed.records.usage is not None
        assert parsed.records.usage.tokens == 15
        assert parsed.records.request is not None
        assert parsed.records.request.text == 1
        assert answer.json()["records"]["fulfillment"]["text"] == 0
    shown = (await client.http.get(f"/api/v2/users/{owner_id}")).json()  # public: records are public
    assert shown["records"]["contribution"]["tokens"] == 15
    assert shown["records"]["fulfillment"]["text"] == 2
    assert shown["records"]["usage"]["tokens"] == 0
    assert shown["contributions"] == {"fulfillments": 2, "tokens": 15, "megapixelsteps": 0.0}
    listed = (await client.http.get("/api/v2/users")).json()
    ListUsersDetailsResponse.model_validate(listed)
    by_name = {u["username"].split("#")[0]: u for u in listed}
    assert by_name["alice"]["records"]["request"]["text"] == 1
    assert by_name["owner"]["records"]["fulfillment"]["text"] == 2
