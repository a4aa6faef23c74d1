"""The durable usage history (docs/reference/usage.md), through HTTP on SQLite and PostgreSQL: one
row per hour, requester, worker, model and shared key, written by each settlement and kept after
requests expire; the statistics windows read it; it is trimmed by `[usage] keep_days`; concurrent
settlements add up exactly; `worker_totals` serves other code."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import text

from horde_lite.operators import usage
from tests.integration.test_horde_jobs import _post_blocking
from tests.integration.test_horde_requests import custom_client
from tests.support.horde import ANON, HordeClient

MODEL = "koboldcpp/Some-Model-12B"
COLUMNS = "hour, user_id, worker_id, model, shared_key_hash, owner_id, requests, jobs, tokens, " \
    "kudos_spent, kudos_earned"  # fmt: skip


async def _rows(client: HordeClient, sql: str, **params: Any) -> list[Any]:
    async with client.horde.sessionmaker() as session:
        return list((await session.execute(text(sql), params)).all())


async def _usage(client: HordeClient) -> list[Any]:
    return await _rows(client, f"SELECT {COLUMNS} FROM usage_records ORDER BY hour, user_id, worker_id")


async def _user_id(client: HordeClient, name: str) -> int:
    return (await _rows(client, "SELECT id FROM users WHERE username = :n", n=name))[0][0]


async def _ledger(client: HordeClient, user_id: int, kind: str) -> float:
    rows = await _rows(
        client, "SELECT coalesce(sum(amount), 0) FROM kudos_events WHERE user_id = :u AND kind = :k",
        u=user_id, k=kind,
    )  # fmt: skip
    return float(rows[0][0])


def _at_next_hour(client: HordeClient, into: float = 60) -> None:
    """Move the clock just past the start of the next clock hour, so a test's buckets are known."""
    now = client.clock.now()
    client.clock.advance(usage.HOUR - now % usage.HOUR + into)


async def _finish(client: HordeClient, worker_key: str, worker: str, requester: str, text_out: str,
                  **body: Any) -> dict[str, Any]:  # fmt: skip
    created = await client.create(requester, models=[MODEL], params={"max_length": 64}, **body)
    assert created.status_code == 202, created.text
    job = (await client.pop(worker_key, worker, models=[MODEL], max_length=512)).json()
    assert job["id"] is not None, job
    submitted = await client.submit(worker_key, job["id"], text_out)
    assert submitted.status_code == 200, submitted.text
    return {"request": created.json()["id"], "job": job["id"], "reward": submitted.json()["reward"]}


async def test_a_settlement_writes_its_hour_and_the_row_outlives_the_request(client: HordeClient) -> None:
    owner = await client.user("owner")
    alice = await client.user("alice", kudos=1000)
    _at_next_hour(client)
    hour = usage.hour_of(client.clock.now())
    assert await _usage(client) == []
    # A request of n = 2: counted once, by its first settled job; both jobs and their tokens add.
    created = await client.create(alice, models=[MODEL], params={"max_length": 64, "n": 2})
    assert created.status_code == 202, created.text
    rewards = 0.0
    for words in ("x" * 40, "y" * 80):  # 10 and 20 tokens
        job = (await client.pop(owner, "w1", models=[MODEL], max_length=512)).json()
        submitted = await client.submit(owner, job["id"], words)
        assert submitted.status_code == 200, submitted.text
        rewards += submitted.json()["reward"]
    [worker_id] = [r[0] for r in await _rows(client, "SELECT id FROM workers WHERE name = 'w1'")]
    alice_id, owner_id = await _user_id(client, "alice"), await _user_id(client, "owner")
    [row] = await _usage(client)
    assert row[:9] == (hour, alice_id, worker_id, MODEL, "", owner_id, 1, 2, 30)
    assert abs(row[9] + await _ledger(client, alice_id, "charge")) < 1e-6
    assert abs(row[10] - await _ledger(client, owner_id, "reward")) < 1e-6
    assert abs(row[10] - rewards) < 1e-6
    assert abs(row[9] - (rewards + 2)) < 1e-6

    # The request expires and is removed with its jobs; the history stays as it was.
    client.clock.advance(1300)
    await client.sweep()
    assert await _rows(client, "SELECT id FROM text_requests") == []
    assert await _usage(client) == [row]
    totals = (await client.http.get("/api/v2/stats/text/totals")).json()
    assert totals["minute"] == {"requests": 0, "tokens": 0}  # the live jobs are gone
    assert totals["day"] == totals["month"] == {"requests": 2, "tokens": 30}
    models = (await client.http.get("/api/v2/stats/text/models")).json()
    assert models == {"day": {MODEL: 2}, "month": {MODEL: 2}, "total": {MODEL: 2}}


async def test_what_is_not_settled_is_not_usage(client: HordeClient) -> None:
    """A faulted job, a lapsed job, a cancelled request and a paused worker's fake job pay nothing,
    so they add nothing; the job that finally serves the request counts it, once."""
    owner = await client.user("owner")
    other = await client.user("other")
    third = await client.user("third")
    alice = await client.user("alice", kudos=1000)
    moderator = await client.user("mod", moderator=True)
    await client.create(alice, models=[MODEL], params={"max_length": 64})
    first = (await client.pop(owner, "w1", models=[MODEL], max_length=512)).json()
    assert (await client.submit(owner, first["id"], "bad", state="faulted")).status_code == 200
    retry = (await client.pop(other, "w2", models=[MODEL], max_length=512)).json()
    assert retry["id"] is not None
    client.clock.advance(151)  # its lease lapses
    await client.sweep()
    cancelled = await client.create(alice, models=[MODEL], params={"max_length": 64})
    assert (await client.cancel(cancelled.json()["id"])).status_code == 200
    [w1] = [r[0] for r in await _rows(client, "SELECT id FROM workers WHERE name = 'w1'")]
    paused = await client.http.put(
        f"/api/v2/workers/{w1}", json={"paused": True}, headers={"apikey": moderator}
    )
    assert paused.status_code == 200, paused.text
    await client.create(alice, models=[MODEL], params={"max_length": 64})
    fake = (await client.pop(owner, "w1", models=[MODEL], max_length=512)).json()
    assert fake["id"] is not None  # a paused worker is handed a copy of a real job
    assert (await client.submit(owner, fake["id"], "fake")).status_code == 200
    assert await _usage(client) == []
    served = (await client.pop(third, "w3", models=[MODEL], max_length=512)).json()
    assert served["id"] is not None
    assert (await client.submit(third, served["id"], "z" * 8)).status_code == 200
    [row] = await _usage(client)
    assert (row[6], row[7], row[8]) == (1, 1, 2)
    assert row[5] == await _user_id(client, "third")


async def test_rows_part_by_requester_worker_model_shared_key_and_hour(client: HordeClient) -> None:
    owner = await client.user("owner")
    alice = await client.user("alice", kudos=1000)
    bob = await client.user("bob", kudos=1000)
    lent = await client.http.post("/api/v2/sharedkeys", json={"name": "billing"}, headers={"apikey": alice})
    assert lent.status_code == 200, lent.text
    shared = lent.json()["id"]
    _at_next_hour(client)
    await _finish(client, owner, "w1", alice, "a" * 40)
    await _finish(client, owner, "w1", shared, "b" * 40)  # alice pays, through the key
    await _finish(client, owner, "w2", bob, "c" * 40)
    await _finish(client, owner, "w1", ANON, "d" * 40)
    _at_next_hour(client)
    await _finish(client, owner, "w1", alice, "e" * 40)
    rows = await _usage(client)
    assert len(rows) == 5, rows
    keyed = [r for r in rows if r[4] != ""]
    assert len(keyed) == 1
    assert keyed[0][1] == await _user_id(client, "alice")
    assert keyed[0][4] != shared  # the key's hash, never the key
    assert sorted({r[0] for r in rows}) == sorted({rows[0][0], rows[0][0] + usage.HOUR})
    anonymous = await _rows(client, "SELECT id FROM users WHERE anonymous")
    assert anonymous[0][0] in {r[1] for r in rows}
    # Per-worker totals, for other code (team statistics).
    workers = dict(await _rows(client, "SELECT name, id FROM workers"))
    async with client.horde.sessionmaker() as session:
        everything = await usage.worker_totals(session, [workers["w1"], workers["w2"], "no-such-worker"])
        recent = await usage.worker_totals(session, [workers["w1"]], since=client.clock.now() - 600)
        assert await usage.worker_totals(session, []) == {}
    assert set(everything) == {workers["w1"], workers["w2"]}
    assert (everything[workers["w1"]].jobs, everything[workers["w1"]].tokens) == (4, 40)
    assert (everything[workers["w2"]].jobs, everything[workers["w2"]].tokens) == (1, 10)
    owner_id = await _user_id(client, "owner")
    earned = sum(t.kudos_earned for t in everything.values())
    assert abs(earned - await _ledger(client, owner_id, "reward")) < 0.01
    assert (recent[workers["w1"]].jobs, recent[workers["w1"]].requests) == (1, 1)


async def test_concurrent_settlements_of_one_row_add_up(client: HordeClient) -> None:
    """Jobs of one worker for one requester, submitted at once, all land in one row: on PostgreSQL
    the upsert adds each settlement to the row another just wrote, none is lost."""
    owner = await client.user("owner")
    alice = await client.user("alice", kudos=10_000)
    _at_next_hour(client)
    jobs = []
    for _ in range(6):
        created = await client.create(alice, models=[MODEL], params={"max_length": 16})
        assert created.status_code == 202, created.text
    while len(jobs) < 6:
        popped = await client.pop(owner, "w1", models=[MODEL], max_length=512, threads=6, amount=6)
        ids = popped.json()["ids"]
        assert ids, popped.text
        jobs += ids
    answers = await asyncio.gather(
        *(
            asyncio.to_thread(
                _post_blocking, client, "/api/v2/generate/text/submit", owner,
                {"id": job, "generation": "q" * 4 * (i + 1), "state": "ok"},
            )
            for i, job in enumerate(jobs)
        )
    )  # fmt: skip
    assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]
    [row] = await _usage(client)
    assert (row[6], row[7], row[8]) == (6, 6, 1 + 2 + 3 + 4 + 5 + 6)
    alice_id, owner_id = await _user_id(client, "alice"), await _user_id(client, "owner")
    assert abs(row[9] + await _ledger(client, alice_id, "charge")) < 1e-6
    assert abs(row[10] - await _ledger(client, owner_id, "reward")) < 1e-6


async def test_the_statistics_windows_count_whole_hours(client: HordeClient) -> None:
    owner = await client.user("owner")
    alice = await client.user("alice", kudos=1000)
    _at_next_hour(client, into=30 * 60)  # half past
    await _finish(client, owner, "w1", alice, "a" * 40)
    client.clock.advance(45 * 60)  # a quarter past the next hour: the job's hour has ended
    body = (await client.http.get("/api/v2/stats/text/totals")).json()
    assert body["hour"] == {"requests": 0, "tokens": 0}
    assert body["day"] == {"requests": 1, "tokens": 10}
    await _finish(client, owner, "w1", alice, "b" * 80)
    body = (await client.http.get("/api/v2/stats/text/totals")).json()
    assert body["minute"] == body["hour"] == {"requests": 1, "tokens": 20}
    assert body["day"] == body["month"] == body["total"] == {"requests": 2, "tokens": 30}
    client.clock.advance(86400 - 45 * 60 + 60)  # the first job's hour began more than a day ago
    body = (await client.http.get("/api/v2/stats/text/totals")).json()
    assert body["day"] == {"requests": 1, "tokens": 20}
    assert body["month"] == {"requests": 2, "tokens": 30}
    models = (await client.http.get("/api/v2/stats/text/models")).json()
    assert models == {"day": {MODEL: 1}, "month": {MODEL: 2}, "total": {MODEL: 2}}


async def test_keep_days_trims_the_history_and_zero_keeps_it(db_url: str) -> None:
    async with custom_client(db_url, usage={"keep_days": 2}) as client:
        owner = await client.user("owner")
        alice = await client.user("alice", kudos=1000)
        _at_next_hour(client)
        await _finish(client, owner, "w1", alice, "a" * 40)
        client.clock.advance(86400)
        await _finish(client, owner, "w1", alice, "b" * 40)
        await client.sweep()
        assert len(await _usage(client)) == 2
        client.clock.advance(86400 + 3600)  # the first hour is now more than two days old
        await client.sweep()
        [kept] = await _usage(client)
        assert kept[8] == 10
        assert (await client.http.get("/api/v2/stats/text/models")).json()["total"] == {MODEL: 1}
    async with custom_client(db_url, usage={"keep_days": 0}) as client:
        owner = await client.user("owner2")
        alice = await client.user("alice2", kudos=1000)
        await _finish(client, owner, "w9", alice, "a" * 40)
        client.clock.advance(400 * 86400)
        await client.sweep()
        assert len([r for r in await _usage(client) if r[8] == 10]) >= 1
