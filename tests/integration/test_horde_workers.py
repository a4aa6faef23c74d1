"""Workers (docs/reference/horde_api.md, "Workers"): created by their first pop, each pop a check-in
storing the declarations, name ownership, maintenance and pause with fake jobs, and the public
worker records (declarations, lease speed, capacity, online)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from horde_lite.accounts.workers import CHECK_IN_RESOLUTION
from tests.support.horde import ANON, HordeClient


async def _worker(client: HordeClient, name: str) -> dict[str, Any]:
    listed = await client.http.get("/api/v2/workers")
    assert listed.status_code == 200
    found = [w for w in listed.json() if w["name"] == name]
    assert len(found) == 1, listed.json()
    shown = await client.http.get(f"/api/v2/workers/{found[0]['id']}")
    assert shown.status_code == 200
    assert shown.json() == found[0]
    return found[0]


async def _put(client: HordeClient, key: str, worker_id: str, **body: Any) -> Any:
    return await client.http.put(f"/api/v2/workers/{worker_id}", json=body, headers={"apikey": key})


async def _count(client: HordeClient, sql: str) -> int:
    async with client.horde.sessionmaker() as session:
        return (await session.execute(text(sql))).scalar_one()


async def test_first_pop_creates_the_worker_with_its_declarations(client: HordeClient) -> None:
    key = await client.user("owner", trusted=True)
    assert (await client.http.get("/api/v2/workers")).json() == []
    popped = await client.pop(
        key, "w1", models=["m-12B", "m-7B"], max_length=256, max_context_length=4096, threads=2,
        bridge_agent="KoboldCppEmbedWorker:2:https://example", nsfw=True,
    )  # fmt: skip
    assert popped.status_code == 200, popped.text
    worker = await _worker(client, "w1")
    assert worker["models"] == ["m-12B", "m-7B"]
    assert worker["max_length"] == 256
    assert worker["max_context_length"] == 4096
    assert worker["threads"] == 2
    assert worker["bridge_agent"] == "KoboldCppEmbedWorker:2:https://example"
    assert worker["nsfw"] is True
    assert worker["trusted"] is True
    assert worker["online"] is True
    assert worker["maintenance_mode"] is False
    assert worker["paused"] is False
    assert worker["type"] == "text"
    assert worker["chat"] is None
    # Unmeasured: the assumed speed (10 tokens/s) and its capacity floor(10 x 120) = 1200.
    assert worker["lease_speed"] is None
    assert worker["speed_measured"] is False
    assert worker["performance"] == "10.0 tokens per second"
    assert worker["capacity"] == 1200


async def test_every_pop_stores_new_declarations(client: HordeClient) -> None:
    key = await client.user("owner")
    await client.pop(key, "w1", models=["a"], max_length=128)
    first = await _worker(client, "w1")
    await client.pop(key, "w1", models=["b", "c"], max_length=1024, max_context_length=8192, threads=4)
    second = await _worker(client, "w1")
    assert second["id"] == first["id"]
    assert second["models"] == ["b", "c"]
    assert (second["max_length"], second["max_context_length"], second["threads"]) == (1024, 8192, 4)
    assert await _count(client, "SELECT count(*) FROM workers") == 1
    async with client.horde.sessionmaker() as session:
        rows = (await session.execute(text("SELECT model FROM worker_models ORDER BY model"))).scalars()
        assert list(rows) == ["b", "c"]
    # Upstream defaults when the worker sends only its name.
    await client.pop(key, "w2")
    bare = await _worker(client, "w2")
    assert (bare["max_length"], bare["max_context_length"], bare["threads"]) == (512, 2048, 1)
    assert bare["models"] == []


async def test_worker_name_belongs_to_its_owner(client: HordeClient) -> None:
    alice = await client.user("alice")
    bob = await client.user("bob")
    await client.pop(alice, "shared-name", models=["m"])
    stolen = await client.pop(bob, "shared-name", models=["evil"])
    assert stolen.status_code == 403
    assert stolen.json()["rc"] == "WrongCredentials"
    assert (await _worker(client, "shared-name"))["models"] == ["m"]


async def test_anonymous_cannot_run_a_worker(client: HordeClient) -> None:
    for headers in ({"apikey": ANON}, {}):
        popped = await client.http.post("/api/v2/generate/text/pop", json={"name": "anon-w"}, headers=headers)
        assert popped.status_code == 403
        assert popped.json()["rc"] == "AnonForbiddenWorker"
    assert await _count(client, "SELECT count(*) FROM workers") == 0


async def test_maintenance_by_owner_serves_only_the_owners_requests(client: HordeClient) -> None:
    owner = await client.user("owner")
    other = await client.user("other")
    await client.pop(owner, "w1", models=["m"])
    worker_id = (await _worker(client, "w1"))["id"]

    changed = await _put(client, owner, worker_id, maintenance=True, maintenance_msg="driver update")
    assert changed.status_code == 200, changed.text
    assert changed.json() == {"maintenance": True}  # upstream's ModifyWorker: what changed
    assert (await _worker(client, "w1"))["maintenance_mode"] is True

    theirs = (await client.create(other, models=["m"])).json()["id"]
    nothing = (await client.pop(owner, "w1", models=["m"])).json()
    assert nothing["id"] is None
    mine = (await client.create(owner, models=["m"])).json()["id"]
    job = (await client.pop(owner, "w1", models=["m"])).json()
    assert job["id"] is not None
    async with client.horde.sessionmaker() as session:
        taken = (
            await session.execute(text("SELECT request_id FROM generations WHERE id = :g"), {"g": job["id"]})
        ).scalar_one()
    assert taken == mine
    # Maintenance workers are not counted as serving the model.
    assert (await client.http.get("/api/v2/status/models?type=text")).json() == []

    assert (await _put(client, owner, worker_id, maintenance=False)).status_code == 200
    job = (await client.pop(owner, "w1", models=["m"])).json()
    async with client.horde.sessionmaker() as session:
        taken = (
            await session.execute(text("SELECT request_id FROM generations WHERE id = :g"), {"g": job["id"]})
        ).scalar_one()
    assert taken == theirs


async def test_who_may_set_maintenance_and_pause(client: HordeClient) -> None:
    owner = await client.user("owner")
    other = await client.user("other")
    moderator = await client.user("mod", moderator=True)
    await client.pop(owner, "w1")
    worker_id = (await _worker(client, "w1"))["id"]

    refused = await _put(client, other, worker_id, maintenance=True)
    assert refused.status_code == 403
    assert refused.json()["rc"] == "WrongCredentials"
    assert (await _worker(client, "w1"))["maintenance_mode"] is False

    by_mod = await _put(client, moderator, worker_id, maintenance=True)
    assert by_mod.status_code == 200
    assert (await _worker(client, "w1"))["maintenance_mode"] is True

    for key in (owner, other):
        not_mod = await _put(client, key, worker_id, paused=True)
        assert not_mod.status_code == 403
        assert not_mod.json()["rc"] == "NotModerator"
    assert (await _worker(client, "w1"))["paused"] is False
    paused = await _put(client, moderator, worker_id, paused=True)
    assert paused.status_code == 200
    assert paused.json()["paused"] is True
    assert (await _worker(client, "w1"))["paused"] is True

    anon = await _put(client, ANON, worker_id, maintenance=False)
    assert anon.status_code == 403
    missing = await _put(client, moderator, "00000000-0000-4000-8000-000000000000", paused=True)
    assert missing.status_code == 404
    assert missing.json()["rc"] == "WorkerNotFound"
    bad = await client.http.put(
        f"/api/v2/workers/{worker_id}", json={"paused": "yes"}, headers={"apikey": moderator}
    )
    assert bad.status_code == 400
    assert bad.json()["rc"] == "BadRequest"


async def test_paused_worker_gets_fake_jobs_that_move_nothing(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=100)
    requester = await client.user("requester", kudos=1000)
    moderator = await client.user("mod", moderator=True)
    await client.pop(owner, "cheat", models=["m-12B"])
    worker_id = (await _worker(client, "cheat"))["id"]
    await _put(client, moderator, worker_id, paused=True)

    # The owner's own request is never copied for its paused worker.
    own = (await client.create(owner, models=["m-12B"])).json()["id"]
    assert (await client.pop(owner, "cheat", models=["m-12B"])).json()["id"] is None

    request_id = (await client.create(requester, models=["m-12B"], prompt="Tell me a story.")).json()["id"]
    fake = (await client.pop(owner, "cheat", models=["m-12B"])).json()
    assert fake["id"] is not None
    assert fake["payload"]["prompt"] == "Tell me a story."  # indistinguishable from a real job
    assert fake["ttl"] == 150
    before = (await client.status(request_id)).json()
    assert (before["waiting"], before["processing"]) == (1, 0)

    submitted = await client.submit(owner, fake["id"], "x" * 400)
    assert submitted.status_code == 200
    assert submitted.json() == {"reward": 0.0}
    assert await client.balance("owner") == 100
    assert await client.balance("requester") == 1000
    after = (await client.status(request_id)).json()
    assert (after["waiting"], after["processing"], after["finished"], after["done"]) == (1, 0, 0, False)
    assert after["generations"] == []
    assert (await _worker(client, "cheat"))["requests_fulfilled"] == 0
    assert await _count(client, "SELECT count(*) FROM kudos_events WHERE kind != 'grant'") == 0

    # A second fake job of the same request, left to lapse, aborts nothing that counts.
    lapsing = (await client.pop(owner, "cheat", models=["m-12B"])).json()
    assert lapsing["id"] is not None
    client.clock.advance(151)
    await client.sweep()
    after_lapse = (await client.status(request_id)).json()
    assert (after_lapse["restarted"], after_lapse["waiting"]) == (0, 1)
    assert (await _worker(client, "cheat"))["aborted_jobs"] == 0

    # The request still waits for a real worker, which gets it and is paid.
    real = await client.user("real")
    job = (await client.pop(real, "honest", models=["m-12B"])).json()
    assert job["id"] is not None
    assert (await client.submit(real, job["id"], "y" * 40)).json()["reward"] > 0
    done = (await client.status(request_id)).json()
    assert done["done"] is True
    assert [g["worker_name"] for g in done["generations"]] == ["honest"]
    assert own  # the owner's request is still waiting, untouched by the paused worker
    assert (await client.status(own)).json()["waiting"] == 1


async def test_workers_list_shows_online_workers_only(client: HordeClient) -> None:
    key = await client.user("owner")
    await client.pop(key, "early", models=["m"])
    client.clock.advance(200)
    await client.pop(key, "late", models=["m"])
    names = [w["name"] for w in (await client.http.get("/api/v2/workers")).json()]
    assert names == ["early", "late"]
    client.clock.advance(150)  # early: 350 s since its check-in; late: 150 s
    listed = (await client.http.get("/api/v2/workers")).json()
    assert [w["name"] for w in listed] == ["late"]
    async with client.horde.sessionmaker() as session:
        early_id = (await session.execute(text("SELECT id FROM workers WHERE name = 'early'"))).scalar_one()
    shown = (await client.http.get(f"/api/v2/workers/{early_id}")).json()
    assert shown["online"] is False
    assert shown["name"] == "early"
    missing = await client.http.get("/api/v2/workers/not-a-worker")
    assert missing.status_code == 404
    assert missing.json()["rc"] == "WorkerNotFound"


async def test_a_polling_worker_writes_its_check_in_at_most_every_few_seconds(client: HordeClient) -> None:
    """Pops closer together than `CHECK_IN_RESOLUTION` leave the stored check-in alone (no write
    per idle poll); the first pop past it stores its time; a worker polling that way stays online
    until `online_seconds` after its last pop, less at most the resolution."""
    key = await client.user("owner")
    online_seconds = client.horde.settings.worker.online_seconds
    start = client.clock.now()
    await client.pop(key, "poller", models=["m"])

    async def stored() -> float:
        return await _count(client, "SELECT last_check_in FROM workers WHERE name = 'poller'")

    assert await stored() == start
    step = CHECK_IN_RESOLUTION / 4  # a power of two: the steps add up to the resolution exactly
    for _ in range(3):
        client.clock.advance(step)
        await client.pop(key, "poller", models=["m"])
        assert await stored() == start
    client.clock.advance(step)  # the resolution since the stored check-in
    await client.pop(key, "poller", models=["m"])
    assert await stored() == client.clock.now()
    client.clock.advance(CHECK_IN_RESOLUTION / 2)
    last_pop = client.clock.now()
    await client.pop(key, "poller", models=["m"])
    assert await stored() < last_pop
    worker_id = (await _worker(client, "poller"))["id"]

    async def online() -> bool:
        return (await client.http.get(f"/api/v2/workers/{worker_id}")).json()["online"]

    client.clock.advance(online_seconds - CHECK_IN_RESOLUTION)
    assert await online() is True
    client.clock.advance(CHECK_IN_RESOLUTION)  # online_seconds after its last pop
    assert await online() is False


async def test_measured_worker_shows_its_lease_speed_and_capacity(client: HordeClient) -> None:
    key = await client.user("owner")
    await client.pop(key, "w1", models=["m"])
    await client.set_worker_speed("w1", 4.0)
    await client.pop(key, "w1", models=["m"])  # a check-in keeps the capacity in step
    worker = await _worker(client, "w1")
    assert worker["lease_speed"] == 4.0
    assert worker["speed_measured"] is True
    assert worker["performance"] == "4.0 tokens per second"
    assert worker["capacity"] == 480


async def test_chat_block_is_shown(client: HordeClient) -> None:
    key = await client.user("owner")
    chat = {"max_completion_tokens": 1024, "max_context_tokens": 8192, "features": ["tools"]}
    await client.pop(key, "chatty", models=["m"], chat=chat)
    worker = await _worker(client, "chatty")
    assert worker["chat"] == {**chat, "image_transports": []}
    await client.pop(key, "chatty", models=["m"])  # a later pop without the block drops it
    assert (await _worker(client, "chatty"))["chat"] is None


async def test_priority_usernames_that_name_nobody(client: HordeClient) -> None:
    key = await client.user("owner")
    names = ["ghost", "ghost#1", "owner#12", "owner#" + "9" * 30, "#", "x#-1"]
    popped = await client.pop(key, "w1", priority_usernames=names)
    assert popped.status_code == 200, popped.text
    async with client.horde.sessionmaker() as session:
        assert (await session.execute(text("SELECT priority_user_ids FROM workers"))).scalar_one() in (
            [],
            "[]",
        )
