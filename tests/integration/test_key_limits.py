"""Scopes and limits of shared keys and users (docs/reference/keys.md): the model allow-list,
concurrency, requests per minute, output tokens per UTC day and the monthly refill, on both faces,
under concurrent use, across day and month boundaries, and with hostile values."""

from __future__ import annotations

import asyncio
import calendar
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from horde_sdk.ai_horde_api.apimodels import UserDetailsResponse
from litestar.testing import AsyncTestClient
from sqlalchemy import text

from horde_lite.clock import ManualClock
from tests.conftest import make_settings
from tests.support.apps import app_for
from tests.support.horde import ANON, HordeClient

# 2031-01-31 23:00:00 UTC: an hour before both a day and a month end.
START = float(calendar.timegm((2031, 1, 31, 23, 0, 0)))
SHORT = {"max_length": 64}  # free, and admitted with no worker online (under the allowance floor)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


async def _key(client: HordeClient, owner: str, **body: Any) -> str:
    made = await client.http.post("/api/v2/sharedkeys", json=body, headers={"apikey": owner})
    assert made.status_code == 200, made.text
    return str(made.json()["id"])


async def _rows(client: HordeClient, sql: str) -> list[Any]:
    async with client.horde.sessionmaker() as session:
        return list((await session.execute(text(sql))).all())


async def _state(client: HordeClient) -> tuple[Any, ...]:
    """What a refused request must leave as it was: requests, holds, balances, the queue."""
    requests = await _rows(client, "SELECT count(*) FROM text_requests")
    holds = await _rows(client, "SELECT count(*), coalesce(sum(remaining), 0) FROM kudos_holds")
    balances = await _rows(client, "SELECT id, kudos FROM users ORDER BY id")
    entries = await _rows(client, "SELECT count(*) FROM queue_entries")
    counted = await _rows(client, "SELECT count(*) FROM limit_admissions")
    return requests[0], holds[0], tuple(balances), entries[0], counted[0]


async def _moderator(client: HordeClient) -> str:
    return await client.user(f"mod-{uuid.uuid4().hex[:6]}", moderator=True)


async def _user_id(client: HordeClient, key: str) -> int:
    return int((await client.http.get("/api/v2/find_user", headers={"apikey": key})).json()["id"])


async def _put_user(client: HordeClient, mod: str, user_id: int, **body: Any) -> Any:
    return await client.http.put(f"/api/v2/users/{user_id}", json=body, headers={"apikey": mod})


def _refused(response: Any, status: int, rc: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["rc"] == rc, body
    assert set(body) <= {"message", "rc", "errors"}
    return body


# --- shared keys ---------------------------------------------------------------------------------


async def test_a_key_shows_its_limits_and_a_patch_changes_only_what_it_sends(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=100)
    made = await client.http.post("/api/v2/sharedkeys", json={}, headers={"apikey": owner})
    assert made.json() | {"id": "", "username": ""} == {
        "id": "", "username": "", "name": "", "kudos": 5000, "utilized": 0, "expiry": None,
        "max_text_tokens": -1, "allowed_models": [], "concurrency": -1, "requests_per_minute": -1,
        "tokens_per_day": -1, "monthly_kudos": -1,
    }  # fmt: skip
    key = made.json()["id"]
    patched = await client.http.patch(
        f"/api/v2/sharedkeys/{key}",
        json={"allowed_models": ["a", "b", "a"], "concurrency": 2, "requests_per_minute": 5},
        headers={"apikey": owner},
    )
    assert patched.status_code == 200, patched.text
    shown = (await client.http.get(f"/api/v2/sharedkeys/{key}")).json()
    assert shown == patched.json()
    assert shown["allowed_models"] == ["a", "b"]  # each name once, in order
    assert (shown["concurrency"], shown["requests_per_minute"], shown["tokens_per_day"]) == (2, 5, -1)
    # A key made with a monthly amount and no budget starts the month with that amount.
    monthly = await client.http.post(
        "/api/v2/sharedkeys", json={"monthly_kudos": 70}, headers={"apikey": owner}
    )
    assert (monthly.json()["kudos"], monthly.json()["monthly_kudos"]) == (70, 70)


async def test_a_keys_model_allow_list_on_both_faces(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=100)
    key = await _key(client, owner, allowed_models=["m-12B", "m-7B"])
    # A worker serves "other", so that the /v1 front's check that the model exists passes.
    assert (await client.pop(await client.user("worker-owner"), "w1", models=["other"])).json()["id"] is None
    before = await _state(client)
    refused = _refused(await client.create(key, models=["other"], params=SHORT), 403, "ModelNotAllowed")
    assert "m-12B" in refused["message"]
    assert "'other'" in refused["message"]
    _refused(await client.create(key, models=["m-12B", "other"], params=SHORT), 403, "ModelNotAllowed")
    answer = await client.http.post(
        "/v1/completions", json={"model": "other", "prompt": "hi"}, headers={"Authorization": f"Bearer {key}"}
    )
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["code"] == "model_not_allowed"
    assert await _state(client) == before

    named = await client.create(key, models=["m-12B"], params=SHORT)
    assert named.status_code == 202, named.text
    # A request naming no model asks for any model the key allows, and only those.
    anything = await client.create(key, params=SHORT)
    assert anything.status_code == 202, anything.text
    rows = await _rows(
        client, f"SELECT any_model, models FROM text_requests WHERE id = '{anything.json()['id']}'"
    )
    assert rows[0][0] in (False, 0)
    assert "m-12B" in str(rows[0][1])
    assert "m-7B" in str(rows[0][1])
    # The owner's own key is not scoped by its shared key's list.
    assert (await client.create(owner, models=["other"], params=SHORT)).status_code == 202


async def test_a_keys_concurrency(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=100)
    key = await _key(client, owner, concurrency=2)
    first = await client.create(key, params=SHORT)
    assert first.status_code == 202
    assert (await client.create(key, params=SHORT)).status_code == 202
    before = await _state(client)
    refused = await client.create(key, params=SHORT)
    body = _refused(refused, 429, "TooManyPrompts")
    assert "(3)" in body["message"]
    assert "(2)" in body["message"]
    assert refused.headers["Retry-After"]
    assert await _state(client) == before
    # The owner's own requests are not the key's.
    assert (await client.create(owner, params=SHORT)).status_code == 202
    # A request that ends frees its place.
    assert (await client.cancel(first.json()["id"])).status_code == 200
    assert (await client.create(key, params=SHORT)).status_code == 202


async def test_a_keys_requests_per_minute_and_retry_after(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=100)
    key = await _key(client, owner, requests_per_minute=3)
    assert (await client.pop(await client.user("worker-owner"), "w1", models=["m-12B"])).json()["id"] is None
    for _ in range(3):
        assert (await client.create(key, params=SHORT)).status_code == 202
        client.clock.advance(10)
    before = await _state(client)
    refused = await client.create(key, params=SHORT)
    body = _refused(refused, 429, "RateLimited")
    assert "3 requests per minute" in body["message"]
    # The first was admitted 30 s ago: it leaves the minute in 30 s.
    assert refused.headers["Retry-After"] == "30"
    assert refused.headers["x-should-retry"] == "true"
    v1 = await client.http.post(
        "/v1/completions", json={"model": "m-12B", "prompt": "hi"}, headers={"Authorization": f"Bearer {key}"}
    )
    assert v1.status_code == 429, v1.text
    assert v1.json()["error"]["code"] == "rate_limit_exceeded"
    assert v1.headers["Retry-After"] == "30"
    assert await _state(client) == before
    client.clock.advance(30)
    assert (await client.create(key, params=SHORT)).status_code == 202
    # A dry run is judged like the request and counts nothing.
    dry = await client.create(key, params=SHORT, dry_run=True)
    assert dry.status_code == 429


@pytest.mark.slow
async def test_a_keys_tokens_per_day_reserved_given_back_and_renewed_at_midnight(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=100)
    key = await _key(client, owner, tokens_per_day=200)
    first = await client.create(key, models=["m-12B"], params=SHORT)
    assert first.status_code == 202
    assert (await client.create(key, params=SHORT)).status_code == 202
    assert (await client.create(key, params=SHORT)).status_code == 202  # 192 of 200 reserved
    before = await _state(client)
    refused = await client.create(key, params={"max_length": 16})
    body = _refused(refused, 429, "DailyTokenLimit")
    assert "200" in body["message"]
    assert "8 left" in body["message"]
    assert refused.headers["Retry-After"] == "3600"  # the UTC day ends at 00:00
    assert await _state(client) == before
    # Served with a short output, the first request gives back what it did not generate.
    worker = await client.user("worker-owner")
    job = (await client.pop(worker, "w1", models=["m-12B"])).json()
    assert job["id"] is not None, job
    assert (await client.submit(worker, job["id"], "short")).status_code == 200
    used = await _rows(client, "SELECT sum(tokens) FROM limit_admissions")
    assert used[0][0] == 2 * 64 + 2  # "short" is ceil(5 / 4) tokens
    assert (await client.create(key, params={"max_length": 16})).status_code == 202
    # The next UTC day starts from nothing.
    client.clock.advance(3600)
    for _ in range(3):
        assert (await client.create(key, params=SHORT)).status_code == 202


async def test_a_request_larger_than_the_daily_limit_is_refused(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=100)
    key = await _key(client, owner, tokens_per_day=50)
    refused = _refused(await client.create(key, params=SHORT), 429, "DailyTokenLimit")
    assert "asks 64" in refused["message"]
    assert (await _state(client))[0] == (0,)


@pytest.mark.parametrize("limit", ["concurrency", "requests_per_minute", "tokens_per_day"])
async def test_concurrent_requests_through_a_limited_key_never_pass_its_limit(
    client: HordeClient, limit: str
) -> None:
    owner = await client.user("owner", kudos=1000)
    value = 3 * 64 if limit == "tokens_per_day" else 3
    key = await _key(client, owner, **{limit: value})
    answers = await asyncio.gather(*(client.create(key, params=SHORT) for _ in range(15)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [202] * 3 + [429] * 12, [a.text for a in answers if a.status_code not in (202, 429)]
    assert (await _rows(client, "SELECT count(*) FROM text_requests"))[0][0] == 3


# --- the monthly refill --------------------------------------------------------------------------


async def test_a_keys_budget_resets_at_the_month_boundary_once(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=1000)
    key = await _key(client, owner, kudos=0, monthly_kudos=100)
    _refused(await client.create(key, params=SHORT), 403, "SharedKeyEmpty")  # January's budget is 0
    client.clock.advance(3600)  # 2031-02-01 00:00 UTC
    answers = await asyncio.gather(*(client.create(key, models=["m-12B"], params=SHORT) for _ in range(5)))
    assert all(a.status_code == 202 for a in answers), [a.text for a in answers]
    worker = await client.user("worker-owner")
    job = (await client.pop(worker, "w1", models=["m-12B"])).json()
    assert (await client.submit(worker, job["id"], "x" * 40)).status_code == 200
    shown = (await client.http.get(f"/api/v2/sharedkeys/{key}")).json()
    assert shown["kudos"] == 100
    spent = shown["utilized"]
    assert spent > 0
    client.clock.advance(27 * 86400)  # still February: the spending stays
    assert (await client.create(key, params=SHORT)).status_code == 202
    assert (await client.http.get(f"/api/v2/sharedkeys/{key}")).json()["utilized"] == spent
    client.clock.advance(86400)  # March
    assert (await client.create(key, params=SHORT)).status_code == 202
    assert (await client.http.get(f"/api/v2/sharedkeys/{key}")).json()["utilized"] == 0


@pytest.mark.slow
async def test_a_users_monthly_kudos_upstreams_way_and_once_per_month(client: HordeClient) -> None:
    mod = await _moderator(client)
    user = await client.user("monthly", kudos=10)
    uid = await _user_id(client, user)
    put = await _put_user(client, mod, uid, monthly_kudos=100)
    assert put.status_code == 200, put.text
    assert put.json() == {"monthly_kudos": 100}
    assert await client.balance("monthly") == 110  # given at once, as upstream
    mine = (await client.http.get("/api/v2/find_user", headers={"apikey": user})).json()
    assert mine["monthly_kudos"] == {"amount": 100, "last_received": "2031-01-31T23:00:00Z"}
    sdk = UserDetailsResponse.model_validate(mine).monthly_kudos
    assert sdk is not None
    assert sdk.amount == 100
    assert (await client.create(user, params=SHORT)).status_code == 202
    assert await client.balance("monthly") == 110  # not twice in January
    client.clock.advance(3600)
    answers = await asyncio.gather(*(client.create(user, params=SHORT) for _ in range(6)))
    assert all(a.status_code == 202 for a in answers)
    assert await client.balance("monthly") == 210  # February's, once
    events = await _rows(
        client, f"SELECT count(*) FROM kudos_events WHERE user_id = {uid} AND kind = 'monthly'"
    )
    assert events[0][0] == 2
    # A negative change lowers the amount, never below 0, and gives nothing.
    lowered = await _put_user(client, mod, uid, monthly_kudos=-500)
    assert lowered.json() == {"monthly_kudos": 0}
    assert await client.balance("monthly") == 210


# --- users ---------------------------------------------------------------------------------------


async def test_a_moderator_sets_a_users_limits_and_they_hold(client: HordeClient) -> None:
    mod = await _moderator(client)
    user = await client.user("limited", kudos=100)
    uid = await _user_id(client, user)
    put = await _put_user(
        client, mod, uid, concurrency=5, allowed_models=["m-12B"], requests_per_minute=2, tokens_per_day=1000
    )
    assert put.status_code == 200, put.text
    assert put.json() == {
        "concurrency": 5, "allowed_models": ["m-12B"], "requests_per_minute": 2, "tokens_per_day": 1000
    }  # fmt: skip
    mine = (await client.http.get("/api/v2/find_user", headers={"apikey": user})).json()
    shown = (mine["concurrency"], mine["allowed_models"], mine["requests_per_minute"], mine["tokens_per_day"])
    assert shown == (
        5, ["m-12B"], 2, 1000
    )  # fmt: skip
    parsed = UserDetailsResponse.model_validate(mine)  # the horde-sdk's own model
    assert parsed.concurrency == 5
    public = (await client.http.get(f"/api/v2/users/{uid}")).json()
    assert "concurrency" not in public
    assert "requests_per_minute" not in public
    _refused(await client.create(user, models=["other"], params=SHORT), 403, "ModelNotAllowed")
    assert (await client.create(user, params=SHORT)).status_code == 202
    # The user's limits hold for its shared keys' requests too.
    key = await _key(client, user)
    assert (await client.create(key, params=SHORT)).status_code == 202
    _refused(await client.create(key, params=SHORT), 429, "RateLimited")
    # concurrency 0 (upstream's lowest) refuses every request.
    assert (await _put_user(client, mod, uid, concurrency=0, requests_per_minute=-1)).status_code == 200
    _refused(await client.create(user, params=SHORT), 429, "TooManyPrompts")


async def test_only_a_moderator_sets_limits(client: HordeClient) -> None:
    user = await client.user("someone")
    uid = await _user_id(client, user)
    _refused(await _put_user(client, user, uid, requests_per_minute=1000), 403, "NotModerator")
    mod = await _moderator(client)
    _refused(await _put_user(client, mod, 0, monthly_kudos=100), 400, "BadRequest")  # the anonymous user


@pytest.fixture
async def defaults(db_url: str, clock: ManualClock) -> AsyncIterator[HordeClient]:
    settings = make_settings(db_url, limits={"requests_per_minute": 1, "allowed_models": ["m-12B"]})
    app = app_for(settings, clock)
    async with AsyncTestClient(app=app, timeout=30) as http:
        yield HordeClient(http, app.state.horde)


async def test_the_horde_defaults_apply_to_registered_users_not_set_by_a_moderator(
    defaults: HordeClient,
) -> None:
    client = defaults
    user = await client.user("plain")
    _refused(await client.create(user, models=["other"], params=SHORT), 403, "ModelNotAllowed")
    assert (await client.create(user, params=SHORT)).status_code == 202
    _refused(await client.create(user, params=SHORT), 429, "RateLimited")
    # The anonymous user is everyone without a key: only its own limits apply.
    for _ in range(2):
        assert (await client.create(ANON, models=["other"], params=SHORT)).status_code == 202
    mod = await _moderator(client)
    uid = await _user_id(client, user)
    assert (
        await _put_user(client, mod, uid, requests_per_minute=-1, allowed_models=["x"])
    ).status_code == 200
    assert (await client.create(user, models=["x"], params=SHORT)).status_code == 202


# --- hostile values ------------------------------------------------------------------------------

HOSTILE: list[dict[str, Any]] = [
    {"requests_per_minute": -2},
    {"requests_per_minute": 2**63},
    {"tokens_per_day": 2**31},
    {"concurrency": 501},
    {"concurrency": 1.5},
    {"monthly_kudos": -2},
    {"monthly_kudos": 1e13},
    {"allowed_models": ["m"] * 51},
    {"allowed_models": [f"m{i}" for i in range(10_000)]},
    {"allowed_models": ["bad\u0000name"]},
    {"allowed_models": [""]},
    {"allowed_models": [" padded"]},
    {"allowed_models": ["x" * 256]},
    {"allowed_models": "m-12B"},
    {"allowed_models": [None]},
]


async def test_hostile_key_limits_are_refused_and_change_nothing(client: HordeClient) -> None:
    owner = await client.user("owner")
    key = await _key(client, owner)
    before = await _rows(client, "SELECT * FROM shared_keys")
    for body in HOSTILE:
        made = await client.http.post("/api/v2/sharedkeys", json=body, headers={"apikey": owner})
        _refused(made, 400, "BadRequest")
        patched = await client.http.patch(f"/api/v2/sharedkeys/{key}", json=body, headers={"apikey": owner})
        _refused(patched, 400, "BadRequest")
    for raw in (
        b'{"requests_per_minute": NaN}',
        b'{"monthly_kudos": Infinity}',
        b'{"tokens_per_day": 1e400}',
    ):
        made = await client.http.post(
            "/api/v2/sharedkeys", content=raw, headers={"apikey": owner, "Content-Type": "application/json"}
        )
        _refused(made, 400, "BadRequest")
    assert await _rows(client, "SELECT * FROM shared_keys") == before


async def test_hostile_user_limits_are_refused_and_change_nothing(client: HordeClient) -> None:
    mod = await _moderator(client)
    user = await client.user("target", kudos=5)
    uid = await _user_id(client, user)
    before = await _rows(client, f"SELECT * FROM users WHERE id = {uid}")
    hostile = [b for b in HOSTILE if b != {"monthly_kudos": -2}]  # a user's is a change: -2 is one
    for body in [*hostile, {"concurrency": -1}, {"monthly_kudos": 10**10}, {"monthly_kudos": 0.5}]:
        _refused(await _put_user(client, mod, uid, **body), 400, "BadRequest")
    assert await _rows(client, f"SELECT * FROM users WHERE id = {uid}") == before
