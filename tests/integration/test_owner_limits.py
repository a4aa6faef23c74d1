"""No griefing by names (on SQLite and PostgreSQL, through HTTP): a request is faulted only by more
than `max_failures` distinct OWNERS, and an owner whose worker failed it is refused with all its
workers, named then or later; an owner whose workers fail too often is held in maintenance for a
cool-down without touching anyone else; and one user's workers and shared keys are bounded,
exactly at the limit and under concurrent creations."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import text

from horde_lite.clock import ManualClock
from tests.conftest import make_settings
from tests.integration.test_horde_jobs import concurrently
from tests.support.apps import app_for
from tests.support.horde import ANON, HordeClient

RULE = {"owner_failure_limit": 3, "owner_failure_window_seconds": 600, "owner_failure_cooldown_seconds": 600}
LIMITS = {"max_per_user": 2, "max_per_trusted_user": 3}


@pytest.fixture
async def limited(db_url: str, clock: ManualClock) -> AsyncIterator[HordeClient]:
    """The horde with the owner failure rule and the per-user limits on (the suite's defaults turn
    them off)."""
    settings = make_settings(db_url, worker={**RULE, **LIMITS}, sharedkeys=LIMITS)
    app = app_for(settings, clock)
    async with AsyncTestClient(app=app, timeout=30) as http:
        yield HordeClient(http, app.state.horde)


async def rows(client: HordeClient, sql: str, **params: Any) -> list[Any]:
    async with client.horde.sessionmaker() as session:
        return list((await session.execute(text(sql), params)).all())


async def fault(client: HordeClient, key: str, worker: str) -> bool:
    """Pop with `worker` and fault what it got; False when it got nothing."""
    job = (await client.pop(key, worker)).json()
    if job["id"] is None:
        return False
    assert (await client.submit(key, job["id"], "", state="faulted")).status_code == 200
    return True


async def worker_record(client: HordeClient, name: str) -> dict[str, Any]:
    [(worker_id,)] = await rows(client, "SELECT id FROM workers WHERE name = :n", n=name)
    return (await client.http.get(f"/api/v2/workers/{worker_id}")).json()


async def set_maintenance(client: HordeClient, key: str, name: str, on: bool) -> Any:
    worker = await worker_record(client, name)
    return await client.http.put(
        f"/api/v2/workers/{worker['id']}", json={"maintenance": on}, headers={"apikey": key}
    )


# --- 1. failures count owners, not names -----------------------------------------------------------


async def test_three_names_of_one_owner_cannot_fault_ten_requests(client: HordeClient) -> None:
    griefer = await client.user("griefer")
    names = ["g1", "g2", "g3"]
    for name in names:
        await client.pop(griefer, name)  # checked in before any request
    created = [(await client.create(ANON)).json()["id"] for _ in range(10)]
    faults = 0
    for _ in range(10):
        for name in names:
            faults += await fault(client, griefer, name)
    assert faults == 10  # each request failed once, by the owner's first worker to take it
    for request_id in created:
        status = (await client.status(request_id)).json()
        assert (status["faulted"], status["waiting"]) == (False, 1)
    for name in names:  # the owner is refused with every name it has, and any new one
        assert (await client.pop(griefer, name)).json()["id"] is None
    assert (await client.pop(griefer, "g4")).json()["id"] is None
    assert await rows(client, "SELECT count(*) FROM queue_owner_refusals") == [(10,)]
    # The requests still serve everyone else.
    honest = await client.user("honest")
    job = (await client.pop(honest, "h1")).json()
    assert job["id"] is not None
    assert (await client.submit(honest, job["id"], "fine")).status_code == 200


async def test_a_request_is_faulted_only_past_max_failures_distinct_owners(client: HordeClient) -> None:
    limit = client.horde.settings.request.max_failures
    created = (await client.create(ANON)).json()["id"]
    for i in range(limit + 1):
        owner = await client.user(f"owner{i}")
        assert (await client.status(created)).json()["faulted"] is False
        assert await fault(client, owner, f"w{i}a")
        assert not await fault(client, owner, f"w{i}b")  # its other names are refused
    assert (await client.status(created)).json()["faulted"] is True
    [(owners,)] = await rows(client, "SELECT count(*) FROM queue_owner_refusals")
    assert owners == limit + 1


async def test_a_lapse_refuses_the_owner_and_a_late_job_of_another_name_still_counts_once(
    client: HordeClient,
) -> None:
    owner = await client.user("owner")
    created = (await client.create(ANON, params={"n": 2})).json()["id"]
    first = (await client.pop(owner, "a")).json()
    second = (await client.pop(owner, "b")).json()  # both jobs out before any failure
    assert first["id"] is not None
    assert second["id"] is not None
    client.clock.advance(151)
    await client.sweep()  # both lapse: one owner, two names
    [(failed, owners)] = await rows(
        client, "SELECT failures, failed_owners FROM text_requests WHERE id = :i", i=created
    )
    assert failed == 2
    assert len(owners if isinstance(owners, list) else json.loads(owners)) == 1
    assert (await client.status(created)).json()["faulted"] is False
    assert (await client.pop(owner, "c")).json()["id"] is None
    other = await client.user("other")
    assert (await client.pop(other, "x", amount=2)).json()["id"] is not None


# --- 2. an owner whose workers keep failing is held in maintenance -------------------------------------


@pytest.mark.slow
async def test_an_owner_failing_too_often_is_held_in_maintenance_and_others_are_not(
    limited: HordeClient,
) -> None:
    client = limited
    griefer = await client.user("griefer")
    honest = await client.user("honest")
    await client.pop(griefer, "g1")
    await client.pop(griefer, "g2")
    await client.pop(honest, "h1")
    for _ in range(5):
        await client.create(ANON)
    assert await fault(client, griefer, "g1")
    assert await fault(client, griefer, "g2")
    assert (await worker_record(client, "g1"))["maintenance_mode"] is False  # 2 of 3
    assert await fault(client, griefer, "g1")  # the third within the window
    for name in ("g1", "g2"):
        record = await worker_record(client, name)
        assert record["maintenance_mode"] is True
    assert (await worker_record(client, "h1"))["maintenance_mode"] is False
    # In maintenance, the griefer's workers take no one else's jobs; the honest worker does.
    assert (await client.pop(griefer, "g2")).json()["id"] is None
    job = (await client.pop(honest, "h1")).json()
    assert job["id"] is not None
    assert (await client.submit(honest, job["id"], "fine")).status_code == 200
    # Lifting it during the cool-down is refused; a worker lifted anyway would go back in.
    refused = await set_maintenance(client, griefer, "g1", False)
    assert refused.status_code == 403
    assert refused.json()["rc"] == "WorkerMaintenance"
    assert set(refused.json()) >= {"message", "rc"}
    client.clock.advance(601)
    assert (await set_maintenance(client, griefer, "g1", False)).status_code == 200
    assert (await client.pop(griefer, "g1")).json()["id"] is not None
    assert (await worker_record(client, "g2"))["maintenance_mode"] is True  # each lifted by hand


async def test_a_worker_skipped_by_the_rule_is_put_in_maintenance_at_its_next_pop(
    limited: HordeClient,
) -> None:
    client = limited
    griefer = await client.user("griefer")
    for _ in range(3):
        await client.create(ANON)
    for _ in range(3):
        assert await fault(client, griefer, "g1")
    # A worker named during the cool-down starts in maintenance (its check-in puts it there).
    await client.create(ANON)
    assert (await client.pop(griefer, "g2")).json()["id"] is None
    assert (await worker_record(client, "g2"))["maintenance_mode"] is True


async def test_lapses_count_against_the_owner_and_failures_outside_the_window_do_not(
    limited: HordeClient,
) -> None:
    client = limited
    owner = await client.user("owner")
    for _ in range(4):
        await client.create(ANON)
    for _ in range(2):
        assert await fault(client, owner, "w1")
        client.clock.advance(400)  # the window is 600 s: the earlier failure leaves it
    assert (await worker_record(client, "w1"))["maintenance_mode"] is False
    assert (await client.pop(owner, "w1")).json()["id"] is not None
    client.clock.advance(151)
    await client.sweep()  # a lapse: the second failure inside the window
    assert (await worker_record(client, "w1"))["maintenance_mode"] is False
    assert await fault(client, owner, "w1")  # the third
    assert (await worker_record(client, "w1"))["maintenance_mode"] is True


async def test_a_paused_workers_fake_jobs_never_count(limited: HordeClient) -> None:
    client = limited
    moderator = await client.user("mod", moderator=True)
    owner = await client.user("owner")
    await client.pop(owner, "w1")
    worker = await worker_record(client, "w1")
    paused = await client.http.put(
        f"/api/v2/workers/{worker['id']}", json={"paused": True}, headers={"apikey": moderator}
    )
    assert paused.status_code == 200
    await client.create(ANON)
    for _ in range(5):
        assert await fault(client, owner, "w1")  # a fake copy each time
    assert (await worker_record(client, "w1"))["maintenance_mode"] is False
    [(recent,)] = await rows(client, "SELECT recent_failures FROM users WHERE username = 'owner'")
    assert recent in ([], "[]")


async def test_a_moderator_lift_ends_the_cool_down(limited: HordeClient) -> None:
    client = limited
    moderator = await client.user("mod", moderator=True)
    owner = await client.user("owner")
    for _ in range(4):
        await client.create(ANON)
    for _ in range(3):
        assert await fault(client, owner, "w1")
    assert (await set_maintenance(client, moderator, "w1", False)).status_code == 200
    assert (await client.pop(owner, "w1")).json()["id"] is not None
    assert (await worker_record(client, "w1"))["maintenance_mode"] is False


# --- 3. per-user limits on workers and shared keys -------------------------------------------------


async def test_workers_at_the_limit_and_one_more(limited: HordeClient) -> None:
    client = limited
    owner = await client.user("owner")
    assert (await client.pop(owner, "w1")).status_code == 200
    assert (await client.pop(owner, "w2")).status_code == 200  # exactly the limit, 2
    refused = await client.pop(owner, "w3")
    assert refused.status_code == 403
    assert refused.json()["rc"] == "TooManyWorkers"
    assert "message" in refused.json()
    assert await rows(client, "SELECT count(*) FROM workers") == [(2,)]
    await client.create(ANON)
    assert (await client.pop(owner, "w1")).json()["id"] is not None  # existing workers keep working
    worker = await worker_record(client, "w2")
    deleted = await client.http.delete(f"/api/v2/workers/{worker['id']}", headers={"apikey": owner})
    assert deleted.status_code == 200
    assert (await client.pop(owner, "w3")).status_code == 200  # a deleted worker frees its place


async def test_trusted_users_have_the_higher_limit(limited: HordeClient) -> None:
    client = limited
    trusted = await client.user("trusted", trusted=True)
    for name in ("t1", "t2", "t3"):
        assert (await client.pop(trusted, name)).status_code == 200
    assert (await client.pop(trusted, "t4")).json()["rc"] == "TooManyWorkers"


async def test_concurrent_first_pops_never_exceed_the_limit(limited: HordeClient) -> None:
    client = limited
    owner = await client.user("owner")
    calls = [(owner, {"name": f"w{i}"}) for i in range(6)]
    answers = await concurrently(client, "/api/v2/generate/text/pop", calls, allowed=("TooManyWorkers",))
    assert sum(1 for a in answers if a.get("rc") == "TooManyWorkers") == 4
    assert await rows(client, "SELECT count(*) FROM workers") == [(2,)]
    # Concurrent first pops of one name make one worker, and are not refused by each other.
    other = await client.user("other")
    same = [(other, {"name": "same"}) for _ in range(4)]
    assert all("rc" not in a for a in await concurrently(client, "/api/v2/generate/text/pop", same))
    assert await rows(client, "SELECT count(*) FROM workers WHERE name = 'same'") == [(1,)]


async def _make_key(client: HordeClient, owner: str) -> Any:
    return await client.http.post("/api/v2/sharedkeys", json={"kudos": 10}, headers={"apikey": owner})


async def test_shared_keys_at_the_limit_and_one_more(limited: HordeClient) -> None:
    client = limited
    owner = await client.user("owner", kudos=100)
    made = [await _make_key(client, owner) for _ in range(2)]
    assert [m.status_code for m in made] == [200, 200]
    refused = await _make_key(client, owner)
    assert refused.status_code == 403
    assert refused.json()["rc"] == "TooManySharedKeys"
    assert "message" in refused.json()
    assert await rows(client, "SELECT count(*) FROM shared_keys") == [(2,)]
    key = made[0].json()["id"]
    assert (
        await client.http.delete(f"/api/v2/sharedkeys/{key}", headers={"apikey": owner})
    ).status_code == 200
    assert (await _make_key(client, owner)).status_code == 200
    moderator = await client.user("mod", moderator=True)
    assert [(await _make_key(client, moderator)).status_code for _ in range(4)] == [200, 200, 200, 403]


async def test_concurrent_shared_key_creations_never_exceed_the_limit(limited: HordeClient) -> None:
    client = limited
    owner = await client.user("owner", kudos=100)
    calls = [(owner, {"kudos": 10}) for _ in range(6)]
    answers = await concurrently(client, "/api/v2/sharedkeys", calls, allowed=("TooManySharedKeys",))
    assert sum(1 for a in answers if a.get("rc") == "TooManySharedKeys") == 4
    assert await rows(client, "SELECT count(*) FROM shared_keys") == [(2,)]
