"""Flagged users over the horde API, on SQLite and PostgreSQL (docs/reference/accounts.md): a
moderator sets and clears `flagged` with PUT /users/{id}; the user and moderators see it in its
record, everyone in its workers' records; its workers are refused at the pop and earn nothing for a
job they held; its requests queue behind everyone's; kudos neither leave nor reach it. Upstream's
codes; a refusal moves nothing."""

from __future__ import annotations

from typing import Any

from horde_sdk.ai_horde_api.apimodels import ModifyUserResponse, UserDetailsResponse
from sqlalchemy import text

from tests.support.horde import ANON, HordeClient


async def _id(client: HordeClient, key: str) -> int:
    return int((await client.http.get("/api/v2/find_user", headers={"apikey": key})).json()["id"])


async def _flag(client: HordeClient, mod: str, user_id: int, value: Any = True) -> Any:
    return await client.http.put(f"/api/v2/users/{user_id}", json={"flagged": value}, headers={"apikey": mod})


async def _ledger(client: HordeClient) -> tuple[Any, ...]:
    async with client.horde.sessionmaker() as session:
        found = await session.execute(
            text("SELECT (SELECT count(*) FROM kudos_events), (SELECT coalesce(sum(kudos), 0) FROM users)")
        )
        return tuple(found.one())


async def test_a_moderator_flags_and_clears_a_user_only_it_and_moderators_see(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    alice = await client.user("alice")
    bob = await client.user("bob")
    alice_id = await _id(client, alice)

    flagged = await _flag(client, mod, alice_id)
    assert flagged.status_code == 200, flagged.text
    assert flagged.json() == {"flagged": True}
    ModifyUserResponse.model_validate(flagged.json())
    for key in (alice, mod):
        shown = await client.http.get(f"/api/v2/users/{alice_id}", headers={"apikey": key})
        assert shown.json()["flagged"] is True, shown.text
        UserDetailsResponse.model_validate(shown.json())
    assert (await client.http.get("/api/v2/find_user", headers={"apikey": alice})).json()["flagged"] is True
    for headers in ({}, {"apikey": bob}):
        public = await client.http.get(f"/api/v2/users/{alice_id}", headers=headers)
        assert "flagged" not in public.json(), public.text
    listed = (await client.http.get("/api/v2/users")).json()
    assert all("flagged" not in u for u in listed)

    # Refused: not a moderator (the user itself included), the anonymous user, a value not a boolean.
    for key, user_id, value, status, rc in (
        (alice, alice_id, False, 403, "NotModerator"),
        (bob, alice_id, False, 403, "NotModerator"),
        (ANON, alice_id, False, 403, "NotModerator"),
        (mod, 0, True, 400, "BadRequest"),
        (mod, alice_id, "yes", 400, "BadRequest"),
        (mod, alice_id, 1, 400, "BadRequest"),
        (mod, alice_id, None, 400, "NoValidActions"),
    ):
        refused = await _flag(client, key, user_id, value)
        said = (refused.status_code, refused.json()["rc"])
        assert said == (status, rc), (key, user_id, value, refused.text)
    assert "anonymous user cannot be flagged" in (await _flag(client, mod, 0)).json()["message"]
    anonymous = await client.http.get("/api/v2/users/0", headers={"apikey": mod})
    assert anonymous.json()["flagged"] is False
    assert (await client.http.get(f"/api/v2/users/{alice_id}", headers={"apikey": mod})).json()["flagged"]

    cleared = await _flag(client, mod, alice_id, False)
    assert cleared.json() == {"flagged": False}
    assert (await client.http.get("/api/v2/find_user", headers={"apikey": alice})).json()["flagged"] is False


async def test_a_flagged_users_workers_get_no_job_and_earn_nothing(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    owner = await client.user("owner")
    requester = await client.user("requester", kudos=100)
    owner_id = await _id(client, owner)
    assert (await client.pop(owner, "w1")).status_code == 200
    held = (await client.create(requester, params={"max_length": 32})).json()["id"]
    job = (await client.pop(owner, "w1")).json()
    assert job["id"] is not None
    waiting = (await client.create(requester, params={"max_length": 32})).json()["id"]
    worker_id = (await client.http.get("/api/v2/workers")).json()[0]["id"]
    assert (await client.http.get(f"/api/v2/workers/{worker_id}")).json()["flagged"] is False

    assert (await _flag(client, mod, owner_id)).status_code == 200
    record = (await client.http.get(f"/api/v2/workers/{worker_id}")).json()
    assert record["flagged"] is True
    assert (await client.http.get("/api/v2/workers/name/w1")).json()["flagged"] is True
    # Its known worker (answered before any transaction) and a new name (which would create one).
    for name in ("w1", "w2"):
        refused = await client.pop(owner, name)
        assert refused.status_code == 403, refused.text
        assert refused.json()["rc"] == "WorkerFlaggedMaintenance"
    assert [w["name"] for w in (await client.http.get("/api/v2/workers")).json()] == ["w1"]
    assert (await client.status(waiting)).json()["waiting"] == 1

    # The job it held is taken, and the requester gets its text, but the owner earns nothing: the
    # requester pays the burn alone.
    before = await client.balance("requester")
    submitted = await client.submit(owner, job["id"], "x" * 80)
    assert submitted.json() == {"reward": 0.0}, submitted.text
    assert await client.balance("owner") == 0
    assert round(before - await client.balance("requester"), 2) == 1.0
    assert (await client.status(held)).json()["generations"][0]["text"] == "x" * 80
    assert (await client.http.get(f"/api/v2/workers/{worker_id}")).json()["kudos_rewards"] == 0

    assert (await _flag(client, mod, owner_id, False)).status_code == 200
    served = (await client.pop(owner, "w1")).json()
    assert served["id"] is not None
    assert (await client.submit(owner, served["id"], "y" * 80)).json()["reward"] > 0


async def test_a_flagged_users_requests_queue_behind_everyones(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    worker = await client.user("worker")
    rich = await client.user("rich", kudos=50_000)
    poor = await client.user("poor", kudos=5)
    modest = await client.user("modest", kudos=100)
    await client.pop(worker, "w1")
    for key in (rich, poor):
        assert (await _flag(client, mod, await _id(client, key))).status_code == 200

    # All made at one instant. Unflagged, `rich` would go first (50000 kudos of priority); flagged,
    # its priority is a thousandth of its kudos (50), below `modest`'s 100, and `poor` (5 kudos,
    # flagged) queues behind even the anonymous user's request (priority 0).
    made = {}
    for name, key in (("rich", rich), ("poor", poor), ("anonymous", ANON), ("modest", modest)):
        created = await client.create(key, params={"max_length": 16})
        assert created.status_code == 202, created.text
        made[created.json()["id"]] = name
    order = []
    for _ in made:
        job = (await client.pop(worker, "w1")).json()
        order.append(made[await _request_of(client, job["id"])])
        await client.submit(worker, job["id"], "done")
    assert order == ["modest", "rich", "anonymous", "poor"]


async def _request_of(client: HordeClient, generation_id: str) -> str:
    async with client.horde.sessionmaker() as session:
        found = await session.execute(
            text("SELECT request_id FROM generations WHERE id = :id"), {"id": generation_id}
        )
        return str(found.scalar_one())


async def test_kudos_neither_leave_nor_reach_a_flagged_user(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    suspect = await client.user("suspect", kudos=500)
    friend = await client.user("friend", kudos=500)
    suspect_id = await _id(client, suspect)
    lent = await client.http.post("/api/v2/sharedkeys", json={"kudos": 100}, headers={"apikey": suspect})
    shared = lent.json()["id"]
    assert (await _flag(client, mod, suspect_id)).status_code == 200
    before = await _ledger(client)

    for key, body, rc in (
        (suspect, {"username": f"friend#{await _id(client, friend)}", "amount": 10}, "SourceAccountFlagged"),
        (friend, {"username": f"suspect#{suspect_id}", "amount": 10}, "TargetAccountFlagged"),
        (friend, {"username": "suspect", "amount": 10}, "TargetAccountFlagged"),
        (friend, {"username": shared, "amount": 10}, "TargetAccountFlagged"),
    ):
        refused = await client.http.post("/api/v2/kudos/transfer", json=body, headers={"apikey": key})
        assert (refused.status_code, refused.json()["rc"]) == (400, rc), (body, refused.text)
    award = {"username": f"suspect#{suspect_id}", "amount": 5}
    awarded = await client.http.post("/api/v2/kudos/award", json=award, headers={"apikey": mod})
    assert (awarded.status_code, awarded.json()["rc"]) == (400, "TargetAccountFlagged"), awarded.text
    assert await _ledger(client) == before

    # A moderator's own adjustment still moves its balance; once cleared, transfers work again.
    adjusted = await client.http.put(
        f"/api/v2/users/{suspect_id}", json={"kudos": -100}, headers={"apikey": mod}
    )
    assert adjusted.json()["new_kudos"] == 400
    assert (await _flag(client, mod, suspect_id, False)).status_code == 200
    sent = await client.http.post(
        "/api/v2/kudos/transfer", json={"username": "friend", "amount": 10}, headers={"apikey": suspect}
    )
    assert sent.json() == {"transferred": 10.0}, sent.text


async def test_the_dashboards_users_panel_flags_and_clears(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    alice = await client.user("alice")
    alice_id = await _id(client, alice)
    as_mod = {"apikey": mod}
    done = await client.http.post(
        f"/dashboard/users/{alice_id}/flags", data={"flagged": "true"}, headers=as_mod
    )
    assert done.status_code == 200, done.text
    assert "flagged on" in done.text
    assert (await client.http.get("/api/v2/find_user", headers={"apikey": alice})).json()["flagged"] is True
    panel = (await client.http.get("/dashboard/panels/users", headers=as_mod)).text
    row = panel[panel.index('data-user="alice#') :].split("</tr>")[0]
    assert 'name="flagged" value="false"' in row
    assert ">Unflag<" in row
    refused = await client.http.post("/dashboard/users/0/flags", data={"flagged": "true"}, headers=as_mod)
    assert refused.status_code == 400
    assert "anonymous user cannot be flagged" in refused.text
    cleared = await client.http.post(
        f"/dashboard/users/{alice_id}/flags", data={"flagged": "false"}, headers=as_mod
    )
    assert "flagged off" in cleared.text
    assert (await client.http.get("/api/v2/find_user", headers={"apikey": alice})).json()["flagged"] is False
