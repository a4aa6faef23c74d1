"""Users and keys on the horde API (docs/reference/horde_api.md): the anonymous key, registered keys
(22 characters, stored hashed), InvalidAPIKey, and /api/v2/find_user."""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from horde_lite.accounts.users import hash_key
from tests.integration.test_horde_jobs import _post_blocking
from tests.support.horde import ANON, HordeClient


async def test_anonymous_key_and_no_key_are_the_anonymous_requester(client: HordeClient) -> None:
    with_key = await client.create(ANON)
    assert with_key.status_code == 202, with_key.text
    without_key = await client.http.post("/api/v2/generate/text/async", json={"prompt": "hi"})
    assert without_key.status_code == 202, without_key.text
    async with client.horde.sessionmaker() as session:
        rows = (await session.execute(text("SELECT user_id, requester_kind FROM text_requests"))).all()
        anon = (await session.execute(text("SELECT id FROM users WHERE anonymous"))).scalars().all()
    assert len(anon) == 1  # one anonymous user, created on first use
    assert sorted(rows) == [(anon[0], "anonymous"), (anon[0], "anonymous")]


async def test_find_user_anonymous(client: HordeClient) -> None:
    for headers in ({"apikey": ANON}, {}):
        found = await client.http.get("/api/v2/find_user", headers=headers)
        assert found.status_code == 200, found.text
        body = found.json()
        assert body["username"] == f"Anonymous#{body['id']}"
        assert body["worker_count"] == 0


async def test_registered_key_is_22_characters_and_stored_hashed(client: HordeClient) -> None:
    keys = [await client.user(f"user{i}") for i in range(5)]
    assert all(len(k) == 22 for k in keys)
    assert len(set(keys)) == 5
    await client.create(ANON)  # the anonymous user too
    async with client.horde.sessionmaker() as session:
        rows = (await session.execute(text("SELECT * FROM users"))).all()
        hashes = set((await session.execute(text("SELECT api_key_hash FROM users"))).scalars())
    assert len(rows) == 6
    dump = repr(rows)
    for key in [*keys, ANON]:
        assert key not in dump
    assert {hash_key(k) for k in keys} <= hashes
    assert hash_key(ANON) in hashes


async def test_find_user_fields(client: HordeClient) -> None:
    key = await client.user("alice", kudos=123.456, trusted=True)
    found = await client.http.get("/api/v2/find_user", headers={"apikey": key})
    assert found.status_code == 200, found.text
    body = found.json()
    assert body["username"] == f"alice#{body['id']}"
    assert isinstance(body["id"], int)
    assert body["kudos"] == 123.46
    assert body["trusted"] is True
    assert body["moderator"] is False
    assert body["worker_count"] == 0

    await client.pop(key, "alice-w1", models=["m"])
    await client.pop(key, "alice-w2", models=["m"])
    body = (await client.http.get("/api/v2/find_user", headers={"apikey": key})).json()
    assert body["worker_count"] == 2


async def test_find_user_with_client_agent_headers(client: HordeClient) -> None:
    key = await client.user("bob")
    for header in ("Client-Agent", "client_agent"):
        found = await client.http.get("/api/v2/find_user", headers={"apikey": key, header: "probe:1:x"})
        assert found.status_code == 200


async def test_unknown_key_is_invalid_api_key(client: HordeClient) -> None:
    await client.user("carol")
    for key in ("x" * 22, "not-a-key", "00000000000"):
        for method, path, body in (
            ("GET", "/api/v2/find_user", None),
            ("POST", "/api/v2/generate/text/async", {"prompt": "hi"}),
            ("POST", "/api/v2/generate/text/pop", {"name": "w"}),
            ("POST", "/api/v2/sharedkeys", {}),
        ):
            response = await client.http.request(method, path, json=body, headers={"apikey": key})
            assert response.status_code == 401, (key, path, response.text)
            assert response.json() == {"message": response.json()["message"], "rc": "InvalidAPIKey"}
    async with client.horde.sessionmaker() as session:
        assert (await session.execute(text("SELECT count(*) FROM text_requests"))).scalar_one() == 0
        assert (await session.execute(text("SELECT count(*) FROM workers"))).scalar_one() == 0


async def test_bearer_header_is_accepted_on_the_horde_api(client: HordeClient) -> None:
    key = await client.user("dora")
    found = await client.http.get("/api/v2/find_user", headers={"Authorization": f"Bearer {key}"})
    assert found.status_code == 200
    assert found.json()["username"].startswith("dora#")


async def test_concurrent_first_anonymous_requests(client: HordeClient) -> None:
    """The anonymous user is created on first use; several first uses at once all succeed."""
    path = "/api/v2/generate/text/async"
    answers = await asyncio.gather(
        *(asyncio.to_thread(_post_blocking, client, path, ANON, {"prompt": "hi"}) for _ in range(6))
    )
    assert [a.status_code for a in answers] == [202] * 6, [a.text for a in answers]
    async with client.horde.sessionmaker() as session:
        assert (await session.execute(text("SELECT count(*) FROM users WHERE anonymous"))).scalar_one() == 1
        assert (await session.execute(text("SELECT count(*) FROM text_requests"))).scalar_one() == 6
