"""Registration, invite codes and a user's own key rotation over HTTP (docs/reference/accounts.md),
on SQLite and PostgreSQL: each `[accounts] registration` mode, every state of an invite code, the
codes' moderator routes, concurrent registrations with a one-use code, hostile names and codes,
rotation, and the registration rate limit per client address."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from litestar.testing import AsyncTestClient
from sqlalchemy import text

from horde_lite.accounts.users import hash_key
from horde_lite.clock import ManualClock
from tests.conftest import make_settings
from tests.integration.test_horde_jobs import _post_blocking
from tests.support.apps import app_for
from tests.support.horde import ANON, HordeClient

REGISTER = "/api/v2/register"
INVITES = "/api/v2/invites"
ROTATE = "/api/v2/find_user/rotate_key"


@asynccontextmanager
async def horde_in(db_url: str, mode: str, **tables: dict[str, object]) -> AsyncIterator[HordeClient]:
    """The app with `[accounts] registration = mode` (no registration limit unless `tables` sets one)."""
    tables = {"ratelimit": {"register_per_hour": 0}, **tables, "accounts": {"registration": mode}}
    app = app_for(make_settings(db_url, **tables), ManualClock())
    async with AsyncTestClient(app=app, timeout=30) as http:
        yield HordeClient(http, app.state.horde)


async def post_json(client: HordeClient, path: str, body: Any) -> httpx.Response:
    """`body` as ASCII JSON (a lone surrogate as its escape, which httpx's own encoding cannot send)."""
    content = json.dumps(body).encode()
    return await client.http.post(path, content=content, headers={"content-type": "application/json"})


async def register(client: HordeClient, username: Any, invite: Any = None) -> httpx.Response:
    body = {"username": username, **({} if invite is None else {"invite": invite})}
    return await post_json(client, REGISTER, body)


async def invite(client: HordeClient, moderator: str, **body: Any) -> dict[str, Any]:
    made = await client.http.post(INVITES, json=body, headers={"apikey": moderator})
    assert made.status_code == 200, made.text
    return dict(made.json())


async def listed(client: HordeClient, moderator: str) -> dict[int, dict[str, Any]]:
    found = await client.http.get(INVITES, headers={"apikey": moderator})
    assert found.status_code == 200, found.text
    return {i["id"]: i for i in found.json()}


async def users(client: HordeClient) -> list[str]:
    async with client.horde.sessionmaker() as session:
        rows = await session.execute(text("SELECT username FROM users WHERE NOT anonymous ORDER BY id"))
        return list(rows.scalars())


def refused(response: httpx.Response, status: int, rc: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["rc"] == rc, body
    assert body["message"], body


async def me(client: HordeClient, key: str) -> httpx.Response:
    return await client.http.get("/api/v2/find_user", headers={"apikey": key})


# --- the modes ---------------------------------------------------------------------------------------


async def test_registration_is_closed_by_default(client: HordeClient) -> None:
    moderator = await client.user("mod", moderator=True)
    code = (await invite(client, moderator))["code"]  # a code changes nothing while closed
    for body in ({"username": "alice"}, {"username": "alice", "invite": code}):
        refused(await client.http.post(REGISTER, json=body), 403, "RegistrationClosed")
    assert await users(client) == ["mod"]
    assert (await listed(client, moderator))[1]["uses_left"] == 1
    page = await client.http.get("/register")
    assert page.status_code == 200
    assert "Registration is closed" in page.text
    assert 'name="username"' not in page.text


async def test_open_registration_makes_an_ordinary_user_whose_key_works(db_url: str) -> None:
    async with horde_in(db_url, "open") as client:
        made = await register(client, "  alice  ", invite="ignored-in-open-mode")
        assert made.status_code == 200, made.text
        body = made.json()
        assert set(body) == {"id", "username", "api_key"}
        assert body["username"] == f"alice#{body['id']}"
        assert len(body["api_key"]) == 22
        found = await me(client, body["api_key"])
        assert found.status_code == 200, found.text
        record = found.json()
        assert (record["username"], record["id"]) == (body["username"], body["id"])
        assert (record["kudos"], record["trusted"], record["moderator"]) == (0, False, False)
        async with client.horde.sessionmaker() as session:
            dump = repr((await session.execute(text("SELECT * FROM users"))).all())
        assert body["api_key"] not in dump
        assert hash_key(body["api_key"]) in dump
        # The name is taken now, by name as written; another user's name is refused by name.
        refused(await register(client, "alice"), 400, "NameAlreadyExists")
        assert await users(client) == ["alice"]


# --- invite codes ------------------------------------------------------------------------------------


async def test_an_invite_allows_its_uses_and_then_refuses(db_url: str) -> None:
    async with horde_in(db_url, "invite") as client:
        moderator = await client.user("mod", moderator=True)
        made = await invite(client, moderator, uses=2, days=1)
        code = made["code"]
        assert len(code) == 22
        assert made["state"] == "active"
        assert (made["uses"], made["uses_left"]) == (2, 2)
        assert made["created_by"] == (await me(client, moderator)).json()["username"]
        assert made["expires_at"] == client.clock.now() + 86400

        refused(await register(client, "nobody"), 403, "InviteRequired")
        refused(await register(client, "nobody", ""), 403, "InviteRequired")
        refused(await register(client, "nobody", "x" * 22), 404, "InviteNotFound")
        assert (await register(client, "first", code)).status_code == 200
        assert (await listed(client, moderator))[made["id"]]["uses_left"] == 1
        assert (await register(client, "second", code)).status_code == 200
        refused(await register(client, "third", code), 403, "InviteUsedUp")
        shown = (await listed(client, moderator))[made["id"]]
        assert (shown["state"], shown["uses_left"], shown["hint"]) == ("used up", 0, code[:4])
        assert "code" not in shown  # shown once, when made
        assert await users(client) == ["mod", "first", "second"]
        async with client.horde.sessionmaker() as session:
            stored = repr((await session.execute(text("SELECT * FROM invite_codes"))).all())
        assert code not in stored
        assert hash_key(code) in stored


async def test_an_expired_invite_is_refused(db_url: str) -> None:
    async with horde_in(db_url, "invite") as client:
        moderator = await client.user("mod", moderator=True)
        day = (await invite(client, moderator, days=1))["code"]
        forever = await invite(client, moderator, days=0)
        assert forever["expires_at"] is None
        client.clock.advance(86400 + 1)  # past the day
        refused(await register(client, "late", day), 403, "InviteExpired")
        shown = await listed(client, moderator)
        assert [shown[i]["state"] for i in sorted(shown)] == ["expired", "active"]
        client.clock.advance(100 * 365 * 86400)
        assert (await register(client, "later", forever["code"])).status_code == 200
        assert await users(client) == ["mod", "later"]


async def test_a_revoked_invite_is_refused(db_url: str) -> None:
    async with horde_in(db_url, "invite") as client:
        moderator = await client.user("mod", moderator=True)
        by_code = await invite(client, moderator, uses=5)
        by_id = await invite(client, moderator, uses=5)
        gone = await client.http.delete(f"{INVITES}/{by_code['code']}", headers={"apikey": moderator})
        assert gone.status_code == 200, gone.text
        assert (gone.json()["state"], gone.json()["id"]) == ("revoked", by_code["id"])
        gone = await client.http.delete(f"{INVITES}/{by_id['id']}", headers={"apikey": moderator})
        assert (gone.status_code, gone.json()["id"]) == (200, by_id["id"])
        again = await client.http.delete(f"{INVITES}/{by_id['id']}", headers={"apikey": moderator})
        assert again.json()["revoked_at"] == gone.json()["revoked_at"]  # revoking twice changes nothing
        for made in (by_code, by_id):
            refused(await register(client, "nobody", made["code"]), 403, "InviteRevoked")
        for unknown in ("999", "x" * 22, "0", "\u0430" * 22, "9" * 5000):
            missing = await client.http.delete(f"{INVITES}/{unknown}", headers={"apikey": moderator})
            refused(missing, 404, "InviteNotFound")
        assert await users(client) == ["mod"]


async def test_a_refused_registration_gives_the_invites_use_back(db_url: str) -> None:
    async with horde_in(db_url, "invite") as client:
        moderator = await client.user("mod", moderator=True)
        made = await invite(client, moderator)
        refused(await register(client, "mod", made["code"]), 400, "NameAlreadyExists")
        refused(await register(client, "Anonymous", made["code"]), 400, "BadRequest")
        assert (await listed(client, moderator))[made["id"]]["uses_left"] == 1
        assert (await register(client, "fresh", made["code"])).status_code == 200
        assert await users(client) == ["mod", "fresh"]


async def _concurrently(client: HordeClient, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    return list(
        await asyncio.gather(
            *(asyncio.to_thread(_post_blocking, client, REGISTER, ANON, body) for body in bodies)
        )
    )


async def test_concurrent_registrations_with_a_one_use_code_make_one_user(db_url: str) -> None:
    async with horde_in(db_url, "invite") as client:
        moderator = await client.user("mod", moderator=True)
        made = await invite(client, moderator, uses=1)
        bodies = [{"username": f"u{i}", "invite": made["code"]} for i in range(8)]
        answers = await _concurrently(client, bodies)
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [200] + [403] * 7, [a.text for a in answers]
        assert {a.json()["rc"] for a in answers if a.status_code == 403} == {"InviteUsedUp"}
        winner = next(a.json() for a in answers if a.status_code == 200)
        assert await users(client) == ["mod", winner["username"].partition("#")[0]]
        async with client.horde.sessionmaker() as session:
            used = (await session.execute(text("SELECT used FROM invite_codes"))).scalar_one()
        assert used == 1


async def test_concurrent_registrations_of_one_name_make_one_user(db_url: str) -> None:
    async with horde_in(db_url, "open") as client:
        answers = await _concurrently(client, [{"username": "same"} for _ in range(6)])
        assert sorted(a.status_code for a in answers) == [200] + [400] * 5, [a.text for a in answers]
        assert {a.json()["rc"] for a in answers if a.status_code == 400} == {"NameAlreadyExists"}
        assert await users(client) == ["same"]


async def test_invite_routes_are_for_moderators(db_url: str) -> None:
    async with horde_in(db_url, "invite") as client:
        moderator = await client.user("mod", moderator=True)
        plain = await client.user("plain")
        shared = await client.http.post("/api/v2/sharedkeys", json={}, headers={"apikey": moderator})
        assert shared.status_code == 200, shared.text
        for headers in ({}, {"apikey": ANON}, {"apikey": plain}, {"apikey": shared.json()["id"]}):
            refused(await client.http.post(INVITES, json={}, headers=headers), 403, "NotModerator")
            refused(await client.http.get(INVITES, headers=headers), 403, "NotModerator")
            refused(await client.http.delete(f"{INVITES}/1", headers=headers), 403, "NotModerator")
        refused(await client.http.get(INVITES, headers={"apikey": "x" * 22}), 401, "InvalidAPIKey")
        for body in ({"uses": 0}, {"uses": 10_001}, {"uses": -1}, {"uses": "2"}, {"days": -1},
                     {"days": 36_501}, {"days": 1.5}, {"uses": 2**63}, {"extra": 1}):  # fmt: skip
            bad = await client.http.post(INVITES, json=body, headers={"apikey": moderator})
            refused(bad, 400, "BadRequest")
        assert await listed(client, moderator) == {}
        made = await invite(client, moderator)  # the defaults: one use, seven days
        assert (made["uses"], made["expires_at"]) == (1, client.clock.now() + 7 * 86400)


# --- hostile names and codes -------------------------------------------------------------------------

HOSTILE_NAMES: dict[str, tuple[Any, str]] = {
    "empty": ("", "BadRequest"),
    "spaces only": ("   ", "BadRequest"),
    "101 characters": ("a" * 101, "BadRequest"),
    "10,000 characters": ("a" * 10_000, "BadRequest"),
    "NUL": ("a\u0000b", "BadRequest"),
    "newline": ("a\nb", "BadRequest"),
    "zero-width space": ("bob\u200b", "BadRequest"),
    "right-to-left override": ("\u202eevil", "BadRequest"),
    "lone surrogate": ("\ud800", "BadRequest"),
    "reserved": ("anonymous", "BadRequest"),
    "a '#'": ("bob#1", "BadRequest"),
    "a number": (5, "BadRequest"),
    "a list": (["bob"], "BadRequest"),
    "null": (None, "BadRequest"),
}


async def test_hostile_names_are_refused_by_name_and_change_nothing(db_url: str) -> None:
    async with horde_in(db_url, "open") as client:
        assert (await register(client, "admin")).status_code == 200
        for what, (name, rc) in HOSTILE_NAMES.items():
            answer = await post_json(client, REGISTER, {"username": name})
            assert 400 <= answer.status_code < 500, (what, answer.text)
            assert answer.json()["rc"] == rc, (what, answer.text)
            assert answer.json()["message"], what
        refused(await client.http.post(REGISTER, json={}), 400, "BadRequest")
        refused(await client.http.post(REGISTER, json={"username": "x", "is": 1}), 400, "BadRequest")
        refused(await client.http.post(REGISTER, content=b"username=x"), 400, "BadRequest")
        assert await users(client) == ["admin"]


async def test_a_look_alike_name_is_another_user_and_takes_nothing(db_url: str) -> None:
    """A Cyrillic "a" (U+0430) makes another name, a user of its own id, which reaches nothing of the
    first one's; a fullwidth "a" folds (NFKC) to the plain letter, so that name is taken."""
    async with horde_in(db_url, "open") as client:
        first = (await register(client, "admin")).json()
        twin = await register(client, "\u0430dmin")  # Cyrillic a
        assert twin.status_code == 200, twin.text
        assert twin.json()["id"] != first["id"]
        twin_record = (await me(client, twin.json()["api_key"])).json()
        assert twin_record["username"] == f"\u0430dmin#{twin.json()['id']}"
        assert (await me(client, first["api_key"])).json()["username"] == first["username"]
        fullwidth = await register(client, "\uff41dmin")  # fullwidth a: the same name
        assert (fullwidth.status_code, fullwidth.json()["rc"]) == (400, "NameAlreadyExists")
        assert len(set(await users(client))) == 2


async def test_hostile_invite_codes_are_refused_and_use_nothing(db_url: str) -> None:
    async with horde_in(db_url, "invite") as client:
        moderator = await client.user("mod", moderator=True)
        made = await invite(client, moderator)
        code = made["code"]
        look_alike = code[:-1] + ("\u0430" if code[-1] != "\u0430" else "b")
        for what, value, status in (
            ("NUL", code + "\u0000", 400),
            ("10,000 characters", code * 455, 400),
            ("101 characters", "a" * 101, 400),
            ("look-alike", look_alike, 404),
            ("padded", f" {code} ", 404),
            ("other case", code.swapcase(), 404),
            ("lone surrogate", "\ud800", None),  # refused when decoded, or as no code
            ("a number", 5, 400),
        ):
            answer = await register(client, f"n{len(what)}", value)
            assert answer.status_code == status or (status is None and answer.status_code in (400, 404)), (
                what,
                answer.text,
            )
            assert answer.json()["rc"], what
            assert answer.json()["message"], what
        assert (await listed(client, moderator))[made["id"]]["uses_left"] == 1
        assert await users(client) == ["mod"]


# --- the user's own key ------------------------------------------------------------------------------


async def test_a_user_rotates_its_own_key(client: HordeClient) -> None:
    old = await client.user("alice")
    before = (await me(client, old)).json()
    rotated = await client.http.post(ROTATE, headers={"apikey": old})
    assert rotated.status_code == 200, rotated.text
    body = rotated.json()
    assert (body["id"], body["username"]) == (before["id"], before["username"])
    new = body["api_key"]
    assert len(new) == 22
    assert new != old
    refused(await me(client, old), 401, "InvalidAPIKey")
    refused(await client.http.post(ROTATE, headers={"apikey": old}), 401, "InvalidAPIKey")
    assert (await me(client, new)).json()["username"] == before["username"]
    by_bearer = await client.http.post(ROTATE, headers={"Authorization": f"Bearer {new}"})
    assert by_bearer.status_code == 200, by_bearer.text


async def test_the_anonymous_user_and_shared_keys_cannot_rotate(client: HordeClient) -> None:
    owner = await client.user("owner")
    made = await client.http.post("/api/v2/sharedkeys", json={}, headers={"apikey": owner})
    shared = made.json()["id"]
    refused(await client.http.post(ROTATE), 403, "AnonForbidden")
    refused(await client.http.post(ROTATE, headers={"apikey": ANON}), 403, "AnonForbidden")
    refused(await client.http.post(ROTATE, headers={"apikey": "y" * 22}), 401, "InvalidAPIKey")
    refused(await client.http.post(ROTATE, headers={"apikey": shared}), 403, "WrongCredentials")
    assert (await me(client, owner)).status_code == 200  # nothing rotated
    assert (await me(client, shared)).status_code == 200


async def test_concurrent_rotations_of_one_key_give_one_new_key(client: HordeClient) -> None:
    old = await client.user("alice")
    answers = await asyncio.gather(
        *(asyncio.to_thread(_post_blocking, client, ROTATE, old, {}) for _ in range(5))
    )
    assert sorted(a.status_code for a in answers) == [200] + [401] * 4, [a.text for a in answers]
    new = next(a.json()["api_key"] for a in answers if a.status_code == 200)
    assert (await me(client, new)).status_code == 200


# --- the registration rate limit -----------------------------------------------------------------------


async def test_registrations_are_limited_per_address_whatever_the_key(db_url: str) -> None:
    async with horde_in(db_url, "open", ratelimit={"register_per_hour": 3}) as client:
        assert (await register(client, "one")).status_code == 200
        refused(await register(client, ""), 400, "BadRequest")  # a refused registration counts too
        page = await client.http.post("/register", data={"username": "two"})
        assert page.status_code == 200, page.text
        for headers in ({}, {"apikey": "made-up-key-1"}, {"apikey": "made-up-key-2"}):
            over = await client.http.post(REGISTER, json={"username": "three"}, headers=headers)
            refused(over, 429, "RateLimited")
            assert int(over.headers["Retry-After"]) > 0
        assert (await client.http.post("/register", data={"username": "four"})).status_code == 429
        assert await users(client) == ["one", "two"]
        # Other calls are not counted.
        assert (await client.http.get("/api/v2/status/heartbeat")).status_code == 200
