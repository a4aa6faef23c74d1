"""The prompt filters' routes (docs/reference/moderation.md), on SQLite and PostgreSQL: upstream's
shapes and codes for a moderator's create, list, show, change, delete and check; who may call them;
and hostile filters (a huge, invalid, catastrophic or bloating pattern, an unknown type, a huge
prompt to check) refused with a 400 that stores nothing."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from tests.conftest import make_settings
from tests.support.apps import app_for
from tests.support.horde import ANON, HordeClient

BAD_WORD = r"\bforbidden\s+word\b"


async def _put(client: HordeClient, key: str, **body: Any) -> Any:
    return await client.http.put("/api/v2/filters", json=body, headers={"apikey": key})


async def _count(client: HordeClient) -> int:
    async with client.horde.sessionmaker() as session:
        return int((await session.execute(text("SELECT count(*) FROM filters"))).scalar_one())


async def test_a_moderator_creates_lists_changes_and_deletes_filters(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    other = await client.user("other", moderator=True)
    h = {"apikey": mod}
    made = await _put(client, mod, regex=BAD_WORD, filter_type=10, description="No forbidden words.")
    assert made.status_code == 200, made.text
    first = made.json()
    assert first == {
        "id": first["id"], "regex": BAD_WORD, "filter_type": 10, "description": "No forbidden words.",
        "replacement": "", "user": "mod#1", "action": "block",
    }  # fmt: skip
    assert first["id"].isdigit()
    # The same regex and type again: the filter that is there, unchanged (upstream's PUT).
    again = await _put(client, mod, regex=BAD_WORD, filter_type=10, description="other words")
    assert (again.status_code, again.json()) == (200, first)
    swap = (await _put(client, other, regex="darn", filter_type=20, replacement="d*rn")).json()
    assert (swap["action"], swap["description"], swap["user"]) == ("replace", None, "other#2")

    listed = (await client.http.get("/api/v2/filters", headers=h)).json()
    assert [f["id"] for f in listed] == [first["id"], swap["id"]]
    by_type = await client.http.get("/api/v2/filters", params={"filter_type": 20}, headers=h)
    assert [f["id"] for f in by_type.json()] == [swap["id"]]
    by_words = await client.http.get("/api/v2/filters", params={"contains": "forbidden"}, headers=h)
    assert [f["id"] for f in by_words.json()] == [first["id"]]  # in the regex and the description
    assert (
        await client.http.get("/api/v2/filters", params={"contains": "FORBIDDEN"}, headers=h)
    ).json() == []
    assert (await client.http.get(f"/api/v2/filters/{first['id']}", headers=h)).json() == first
    combined = (await client.http.get("/api/v2/filters/regex", headers=h)).json()
    assert combined == [{"filter_type": 10, "regex": BAD_WORD}, {"filter_type": 20, "regex": "darn"}]
    only = await client.http.get("/api/v2/filters/regex", params={"filter_type": 20}, headers=h)
    assert only.json() == [{"filter_type": 20, "regex": "darn"}]

    # Only what is sent changes; the moderator who changed it becomes its user.
    changed = await client.http.patch(
        f"/api/v2/filters/{first['id']}", json={"description": "Be kind."}, headers={"apikey": other}
    )
    assert changed.status_code == 200, changed.text
    assert changed.json() == {**first, "description": "Be kind.", "user": "other#2"}
    retyped = await client.http.patch(f"/api/v2/filters/{swap['id']}", json={"filter_type": 11}, headers=h)
    assert (retyped.json()["filter_type"], retyped.json()["action"], retyped.json()["replacement"]) == (
        11, "block", "d*rn",
    )  # fmt: skip
    nothing = await client.http.patch(f"/api/v2/filters/{first['id']}", json={}, headers=h)
    assert (nothing.status_code, nothing.json()["rc"]) == (400, "NoFilterModSelected")
    nulls = await client.http.patch(f"/api/v2/filters/{first['id']}", json={"regex": None}, headers=h)
    assert (nulls.status_code, nulls.json()["rc"]) == (400, "NoFilterModSelected")
    # Onto another filter's regex and type: refused, both unchanged.
    clash = await client.http.patch(
        f"/api/v2/filters/{swap['id']}", json={"regex": BAD_WORD, "filter_type": 10}, headers=h
    )
    assert (clash.status_code, clash.json()["rc"]) == (400, "BadRequest")
    assert f"Filter {first['id']}" in clash.json()["message"]

    deleted = await client.http.delete(f"/api/v2/filters/{first['id']}", headers=h)
    assert (deleted.status_code, deleted.json()) == (200, {"message": "OK"})
    for method in ("GET", "DELETE"):
        gone = await client.http.request(method, f"/api/v2/filters/{first['id']}", headers=h)
        assert (gone.status_code, gone.json()["rc"]) == (404, "FilterNotFound")
    missing = await client.http.patch("/api/v2/filters/999", json={"description": "x"}, headers=h)
    assert (missing.status_code, missing.json()["rc"]) == (404, "FilterNotFound")
    for odd in ("abc", "1.5", "-1", "%EF%BC%91", "9" * 400):  # upstream: not digits, no filter
        found = await client.http.get(f"/api/v2/filters/{odd}", headers=h)
        assert (found.status_code, found.json()["rc"]) == (404, "FilterNotFound"), odd
    assert await _count(client) == 1


async def test_only_a_moderators_own_key_opens_the_routes(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    user = await client.user("someone", trusted=True)
    made = (await _put(client, mod, regex="x+y", filter_type=10)).json()
    calls = [
        ("GET", "/api/v2/filters", None),
        ("PUT", "/api/v2/filters", {"regex": "zz", "filter_type": 10}),
        ("POST", "/api/v2/filters", {"prompt": "xxy"}),
        ("GET", "/api/v2/filters/regex", None),
        ("GET", f"/api/v2/filters/{made['id']}", None),
        ("PATCH", f"/api/v2/filters/{made['id']}", {"description": "mine now"}),
        ("DELETE", f"/api/v2/filters/{made['id']}", None),
    ]
    for method, path, body in calls:
        for headers, status, rc in (
            ({}, 403, "NotModerator"),
            ({"apikey": ANON}, 403, "NotModerator"),
            ({"apikey": user}, 403, "NotModerator"),
            ({"apikey": "not-a-key-of-anyone-22"}, 401, "InvalidAPIKey"),
        ):
            answer = await client.http.request(method, path, json=body, headers=headers)
            assert (answer.status_code, answer.json()["rc"]) == (status, rc), (method, path, headers)
    assert (await client.http.get(f"/api/v2/filters/{made['id']}", headers={"apikey": mod})).json() == made


async def test_a_moderators_check_of_a_prompt(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    h = {"apikey": mod}
    block = (await _put(client, mod, regex=BAD_WORD, filter_type=10)).json()
    swap = (await _put(client, mod, regex="darn", filter_type=20, replacement="d*rn")).json()

    async def check(prompt: str, **extra: Any) -> Any:
        answer = await client.http.post("/api/v2/filters", json={"prompt": prompt, **extra}, headers=h)
        assert answer.status_code == 200, answer.text
        return answer.json()

    both = await check("Darn, a Forbidden  Word.")
    assert (both["suspicion"], both["matches"]) == ("2", ["Forbidden  Word", "Darn"])
    assert both["filters"] == [
        {
            "id": block["id"],
            "filter_type": 10,
            "action": "block",
            "match": "Forbidden  Word",
            "timed_out": False,
        },
        {"id": swap["id"], "filter_type": 20, "action": "replace", "match": "Darn", "timed_out": False},
    ]
    assert (await check("darn it"))["suspicion"] == "1"
    assert await check("all fine") == {"suspicion": "0", "matches": [], "filters": []}
    assert (await check("forbidden word, darn", filter_type=20))["matches"] == ["darn"]
    assert await check("") == {"suspicion": "0", "matches": [], "filters": []}


HOSTILE: list[tuple[str, dict[str, Any], str]] = [
    ("huge regex", {"regex": "a" * 2001, "filter_type": 10}, "regex"),
    ("invalid regex", {"regex": "(unclosed", "filter_type": 10}, "not a valid pattern"),
    ("a repeat beyond the bound", {"regex": "a{4294967294}", "filter_type": 10}, "above 1000"),
    ("nested repeats", {"regex": "((a{100}){100}){100}", "filter_type": 10}, "memory"),
    ("catastrophic", {"regex": "(a+)+$", "filter_type": 10}, "catastrophic"),
    ("matches everything", {"regex": "x*", "filter_type": 20, "replacement": "!"}, "empty text"),
    ("empty regex", {"regex": "", "filter_type": 10}, "regex"),
    ("type below", {"regex": "a", "filter_type": 9}, "filter_type"),
    ("type above", {"regex": "a", "filter_type": 30}, "filter_type"),
    ("type as text", {"regex": "a", "filter_type": "10"}, "filter_type"),
    ("no type", {"regex": "a"}, "filter_type"),
    ("long replacement", {"regex": "a", "filter_type": 20, "replacement": "r" * 256}, "replacement"),
    ("long description", {"regex": "a", "filter_type": 10, "description": "d" * 1001}, "description"),
    ("unknown field", {"regex": "a", "filter_type": 10, "flags": "i"}, "flags"),
]


@pytest.mark.parametrize(("what", "body", "named"), HOSTILE, ids=[h[0] for h in HOSTILE])
async def test_hostile_filters_are_refused_and_nothing_is_stored(
    client: HordeClient, what: str, body: dict[str, Any], named: str
) -> None:
    mod = await client.user("mod", moderator=True)
    refused = await _put(client, mod, **body)
    assert (refused.status_code, refused.json()["rc"]) == (400, "BadRequest"), refused.text
    assert named in refused.text, refused.text
    assert await _count(client) == 0
    if body.get("regex") not in (None, "a"):  # the same pattern refused as a change
        made = (await _put(client, mod, regex="fine", filter_type=10)).json()
        patched = await client.http.patch(
            f"/api/v2/filters/{made['id']}", json={"regex": body["regex"]}, headers={"apikey": mod}
        )
        assert (patched.status_code, patched.json()["rc"]) == (400, "BadRequest")
        assert (
            await client.http.get(f"/api/v2/filters/{made['id']}", headers={"apikey": mod})
        ).json() == made


async def test_a_huge_prompt_to_check_is_refused(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    await _put(client, mod, regex="a", filter_type=10)
    h = {"apikey": mod}
    huge = await client.http.post("/api/v2/filters", json={"prompt": "a" * 100_001}, headers=h)
    assert (huge.status_code, huge.json()["rc"]) == (400, "BadRequest")
    assert "prompt" in huge.json()["errors"]
    typed = await client.http.post("/api/v2/filters", json={"prompt": "a", "filter_type": 5}, headers=h)
    assert (typed.status_code, typed.json()["rc"]) == (400, "BadRequest")


async def test_hostile_queries_are_refused(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    for path in ("/api/v2/filters", "/api/v2/filters/regex"):
        for value in ("abc", str(2**64), "1.5", ""):
            answer = await client.http.get(path, params={"filter_type": value}, headers={"apikey": mod})
            assert answer.status_code in (200, 400), (path, value, answer.text)
            if value:
                assert (answer.status_code, answer.json()["rc"]) == (400, "BadRequest"), (path, value)
    long = await client.http.get("/api/v2/filters", params={"contains": "c" * 1001}, headers={"apikey": mod})
    assert (long.status_code, long.json()["rc"]) == (400, "BadRequest")
    assert (
        await client.http.get("/api/v2/filters", params={"filter_type": 2**62}, headers={"apikey": mod})
    ).json() == []


async def test_the_horde_holds_at_most_max_filters(db_url: str, clock: Any) -> None:
    from litestar.testing import AsyncTestClient

    app = app_for(make_settings(db_url, filters={"max_filters": 2}), clock)
    async with AsyncTestClient(app=app, timeout=30) as http:
        client = HordeClient(http, app.state.horde)
        mod = await client.user("mod", moderator=True)
        for word in ("one", "two"):
            assert (await _put(client, mod, regex=word, filter_type=10)).status_code == 200
        third = await _put(client, mod, regex="three", filter_type=10)
        assert (third.status_code, third.json()["rc"]) == (403, "TooManyFilters")
        # One already there is still answered: nothing new is made.
        assert (await _put(client, mod, regex="two", filter_type=10)).status_code == 200
        assert await _count(client) == 2
