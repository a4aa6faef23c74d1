"""Hostile input on every route of both faces, on SQLite and PostgreSQL: deep nesting, NUL anywhere
(strings, object keys, path parameters), invalid UTF-8, integers beyond their columns in every
integer field, non-ASCII digits in seeds and user names. Every answer is a 4xx in the face's shape
with a message, never a 5xx, and a refused call stores nothing (no request, no hold, no ledger
event, no balance change, no worker).

The routes are read from the app, so a new route is walked without editing this file; a route's
integer fields are read from its typed `data` struct (plus a few known bodies below)."""

from __future__ import annotations

import json
import re
import types
import typing
from typing import Any

import msgspec
import pytest
from litestar.routes import HTTPRoute
from sqlalchemy import text

from tests.support.horde import ANON, HordeClient

DEEP_OBJECT = b'{"a": ' + b"[" * 1000 + b"]" * 1000 + b"}"
DEEP_WITH_NUL = b'{"a": ' + b"[" * 700 + b'"\\u0000"' + b"]" * 700 + b"}"
BAD_UTF8 = b'{"prompt": "caf\xc3\x28 \xff", "name": "w\xfe"}'
NUL_KEY = b'{"\\u0000": 1, "prompt": "x", "name": "w"}'
NUL_VALUE = b'{"prompt": "a\\u0000b", "name": "w\\u0000", "id": "x", "seq": 1}'
HOSTILE_BODIES = {
    "deep object": DEEP_OBJECT,
    "deep with NUL": DEEP_WITH_NUL,
    "invalid UTF-8": BAD_UTF8,
    "NUL key": NUL_KEY,
    "NUL value": NUL_VALUE,
}
BEYOND_EVERY_COLUMN = {"2^63": 2**63, "400 digits": int("9" * 400), "-2^63-1": -(2**63) - 1}
BEYOND_INT32 = {"2^31": 2**31}
BAD_PATH_VALUES = ("%00", "a%00b", "%ff", "%c3%28")

# Bodies whose integer fields are walked for routes without a typed `data` struct (and in addition
# to the struct's fields for those with one): dotted paths into a valid body.
KNOWN_INT_FIELDS: dict[str, tuple[dict[str, Any], list[str]]] = {
    "/api/v2/generate/text/async": (
        {"prompt": "hi", "params": {"n": 1, "max_length": 32, "max_context_length": 1024}},
        ["params.n", "params.max_length", "params.max_context_length"],
    ),
    "/v1/chat/completions": (
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "seed": 1},
        ["max_tokens", "seed", "n"],
    ),
    "/api/v2/generate/text/pop": (
        {"name": "hostile", "chat": {"max_completion_tokens": 64, "max_context_tokens": 128}},
        [
            "max_length",
            "max_context_length",
            "threads",
            "amount",
            "chat.max_completion_tokens",
            "chat.max_context_tokens",
        ],
    ),
    "/api/v2/generate/text/submit": (
        {"id": "00000000-0000-4000-8000-000000000000", "chat": {"message": {}, "usage": {}}},
        ["seed", "chat.usage.completion_tokens", "chat.usage.prompt_tokens"],
    ),
    "/api/v2/generate/text/progress": (
        {"id": "00000000-0000-4000-8000-000000000000", "seq": 1},
        ["seq", "completion_tokens"],
    ),
    "/api/v2/sharedkeys": ({"kudos": 10}, ["expiry", "max_text_tokens", "kudos"]),
    "/api/v2/sharedkeys/{key:str}": ({"kudos": 10}, ["expiry", "max_text_tokens", "kudos"]),
}


def routes(client: HordeClient) -> list[tuple[str, str, Any]]:
    """(method, path template, handler) for every HTTP route the app serves."""
    found = []
    for route in client.http.app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        for handler in route.route_handlers:
            for method in sorted(handler.http_methods):
                if method not in ("HEAD", "OPTIONS"):
                    found.append((method, route.path, handler))
    assert len(found) >= 15, found
    return found


def fill(template: str, value: str) -> str:
    return re.sub(r"\{[^}]+\}", value, template)


def int_fields(handler: Any) -> list[str]:
    """Dotted paths of the integer fields of the handler's typed `data` struct."""
    signature = handler.parsed_fn_signature
    data = signature.parameters.get("data")
    if data is None:
        return []
    paths: list[str] = []

    def walk(t: Any, prefix: str, depth: int) -> None:
        if depth > 4:
            return
        origin = typing.get_origin(t)
        if origin is typing.Annotated:
            walk(typing.get_args(t)[0], prefix, depth)
        elif origin in (typing.Union, types.UnionType):
            for arg in typing.get_args(t):
                walk(arg, prefix, depth)
        elif t is int and prefix:
            paths.append(prefix)
        elif isinstance(t, type) and issubclass(t, msgspec.Struct):
            hints = typing.get_type_hints(t, include_extras=True)
            for name in t.__struct_fields__:
                walk(hints[name], f"{prefix}.{name}" if prefix else name, depth + 1)

    walk(data.annotation, "", 0)
    return paths


def with_value(body: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(body))
    *parents, last = dotted.split(".")
    node = body
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            return body
    node[last] = value
    return body


def assert_refused(response: Any, path: str, what: str) -> None:
    assert 400 <= response.status_code < 500, (
        f"{what} on {path}: {response.status_code} {response.text[:300]}"
    )
    body = response.json()
    if path.startswith("/v1"):
        assert body["error"]["message"], body
    else:
        assert body["message"], body
        assert body["rc"], body


async def stored(client: HordeClient) -> tuple[Any, ...]:
    """Everything a refused call must leave as it was."""
    async with client.horde.sessionmaker() as session:
        row = (
            await session.execute(
                text(
                    "SELECT (SELECT count(*) FROM text_requests), (SELECT count(*) FROM kudos_holds), "
                    "(SELECT count(*) FROM kudos_events), (SELECT coalesce(sum(kudos), 0) FROM users), "
                    "(SELECT count(*) FROM workers), (SELECT count(*) FROM generations), "
                    "(SELECT count(*) FROM shared_keys)"
                )
            )
        ).one()
    return tuple(row)


async def send(client: HordeClient, method: str, path: str, key: str, content: bytes) -> Any:
    headers = {"apikey": key, "authorization": f"Bearer {key}", "content-type": "application/json"}
    return await client.http.request(method, path, content=content, headers=headers)


async def test_hostile_bodies_on_every_route(client: HordeClient) -> None:
    key = await client.user("owner", kudos=1000)
    before = await stored(client)
    for method, template, _handler in routes(client):
        if method == "GET":
            continue
        path = fill(template, "00000000-0000-4000-8000-000000000000")
        for what, body in HOSTILE_BODIES.items():
            response = await send(client, method, path, key, body)
            assert_refused(response, path, what)
    assert await stored(client) == before


async def test_nul_and_bad_utf8_in_every_path_parameter_and_query(client: HordeClient) -> None:
    key = await client.user("owner", kudos=1000)
    before = await stored(client)
    for method, template, _handler in routes(client):
        if "{" in template:
            for value in BAD_PATH_VALUES:
                path = fill(template, value)
                response = await send(client, method, path, key, b"{}")
                assert_refused(response, path, f"path value {value}")
        response = await send(client, method, template.split("{")[0] + "?type=%00", key, b"{}")
        assert response.status_code < 500, (template, response.text)
    assert await stored(client) == before


async def test_integers_beyond_the_columns_in_every_integer_field(client: HordeClient) -> None:
    key = await client.user("owner", kudos=1000)
    await client.pop(key, "hostile")
    walked = 0
    for method, template, handler in routes(client):
        if method == "GET":
            continue
        base, known = KNOWN_INT_FIELDS.get(template, ({}, []))
        fields = sorted(set(known) | set(int_fields(handler)))
        path = fill(template, "00000000-0000-4000-8000-000000000000")
        for field in fields:
            walked += 1
            before = await stored(client)  # a valid 2^31 of the previous field may have stored a row
            for what, value in BEYOND_EVERY_COLUMN.items():
                response = await send(
                    client, method, path, key, json.dumps(with_value(base, field, value)).encode()
                )
                assert_refused(response, path, f"{field} = {what}")
            assert await stored(client) == before, (path, field)
            for what, value in BEYOND_INT32.items():
                response = await send(
                    client, method, path, key, json.dumps(with_value(base, field, value)).encode()
                )
                assert response.status_code < 500, (path, field, what, response.text)
    assert walked >= 15


async def test_non_ascii_digits_in_seeds_and_user_names(client: HordeClient) -> None:
    owner = await client.user("owner")
    await client.user("bob")
    popped = await client.pop(owner, "w1", priority_usernames=["bob#²", "bob#--5", "bob#" + "9" * 40])
    assert popped.status_code == 200, popped.text
    created = (await client.create(ANON, params={"n": 2})).json()["id"]
    job = (await client.pop(owner, "w1", amount=2)).json()
    refused = await client.submit(owner, job["ids"][0], "x", seed="²")
    assert refused.status_code == 400, refused.text
    kept = await client.submit(owner, job["ids"][0], "x", seed="--5")
    assert kept.status_code == 200, kept.text
    assert (await client.submit(owner, job["ids"][1], "y", seed=-(2**63))).status_code == 200
    status = await client.status(created)
    assert status.status_code == 200, status.text
    assert sorted(map(str, (g["seed"] for g in status.json()["generations"]))) == sorted(
        ["--5", str(-(2**63))]
    )


async def test_integers_beyond_the_digit_limit_in_every_body(client: HordeClient) -> None:
    """int() refuses more than 4300 digits: a JSON number or a form field that long is refused on
    every route (a 4xx, never the ValueError's 500) and stores nothing."""
    key = await client.user("owner", kudos=100)
    before = await stored(client)
    for method, template, _handler in routes(client):
        if method == "GET":
            continue
        path = fill(template, "00000000-0000-4000-8000-000000000000")
        for digits in (b"9" * 5000, b"-" + b"9" * 5000, b"-" + b"0" * 4400 + b"9" * 20):
            for content, kind in ((b'{"n": ' + digits + b"}", "application/json"),
                                  (b"n=" + digits, "application/x-www-form-urlencoded")):  # fmt: skip
                headers = {"apikey": key, "content-type": kind}
                response = await client.http.request(method, path, content=content, headers=headers)
                assert_not_500(response, path, f"{kind} body of {len(digits)} digits")
    assert await stored(client) == before


async def test_a_shared_key_expiry_of_400_digits_is_a_400(client: HordeClient) -> None:
    key = await client.user("owner", kudos=100)
    before = await stored(client)
    response = await client.http.post(
        "/api/v2/sharedkeys", content=b'{"kudos": 5, "expiry": ' + b"9" * 400 + b"}",
        headers={"apikey": key, "content-type": "application/json"},
    )  # fmt: skip
    assert_refused(response, "/api/v2/sharedkeys", "expiry")
    assert await stored(client) == before


# --- every path, query, header and cookie shape: never a 500 ----------------------------------------

BEYOND_THE_DIGIT_LIMIT = {  # int() refuses decimal strings of more than 4300 digits
    "4301 nines": "9" * 4301,
    "minus 5000 nines": "-" + "9" * 5000,
    "zeros then a 1": "0" * 4400 + "1",
}
PATH_SHAPES = {
    "encoded slash": "%2F",
    "encoded slash inside": "a%2Fb",
    "encoded dots": "%2e%2e",
    "encoded dot segments": "..%2F..%2F..%2Fetc",
    "NUL": "%00",
    "overlong segment": "x" * 5000,
    "non-ASCII digit": "%EF%BC%91",
    "backslash": "a%5Cb",
}
SESSION = "horde_lite_dashboard"
COOKIE_SHAPES: dict[str, bytes] = {
    "empty": f"{SESSION}=".encode(),
    "huge": f"{SESSION}=".encode() + b"x" * 16000,
    "huge digits": f"{SESSION}=1.".encode() + b"9" * 5000 + b"." + b"0" * 64,
    "non-ASCII (UTF-8)": f"{SESSION}=é.\u0661\u0662\u0663.x".encode(),
    "non-ASCII (Latin-1)": f"{SESSION}=\xe9".encode("latin-1"),
    # Header bytes are read as Latin-1: b"\xb2" is "²", which isdigit() takes and int() refuses.
    "superscript digits": f"{SESSION}=1.\u00b2\u00b3.{'0' * 64}".encode("latin-1"),
    "Arabic-Indic digits": f"{SESSION}=\u0661.{chr(0x0669) * 10}.{'0' * 64}".encode(),
    "bad signature": f"{SESSION}=1.9999999999.{'0' * 64}".encode(),
    "bad format": f"{SESSION}=x.y.z".encode(),
    "negative": f"{SESSION}=-1.-1.{'0' * 64}".encode(),
    "quoted": f'{SESSION}="1.2.3"'.encode(),
    "unbalanced quote": f'{SESSION}="'.encode(),
    "repeated": f"{SESSION}=a; {SESSION}=1.2.3; {SESSION}=".encode(),
    "no name": b"=1.2.3",
    "separators only": b";;==;,,",
    "percent-encoded": f"{SESSION}=%00%ff".encode(),
}
HEADER_SHAPES: dict[str, list[tuple[bytes, bytes]]] = {
    "apikey of 5000 digits": [(b"apikey", b"9" * 5000)],
    "apikey non-ASCII": [(b"apikey", "ключ".encode())],
    "apikey Latin-1": [(b"apikey", b"\xe9\xff")],
    "empty apikey": [(b"apikey", b"")],
    "two apikeys": [(b"apikey", b"a"), (b"apikey", b"b")],
    "bearer of 5000 digits": [(b"authorization", b"Bearer " + b"9" * 5000)],
    "bare bearer": [(b"authorization", b"Bearer")],
    "client-agent huge": [(b"client-agent", b"a:" * 8000)],
    "origin null": [(b"origin", b"null")],
    "origin non-ASCII": [(b"origin", "http://ü.example".encode())],
    "content-type odd": [(b"content-type", b"application/json; charset=\xff")],
    "accept odd": [(b"accept", b"*/*;q=" + b"9" * 5000)],
}


def query_parameters(client: HordeClient) -> dict[str, set[str]]:
    """Each documented path (its template as Litestar writes it) -> the names of its query parameters."""
    found: dict[str, set[str]] = {}
    for path, item in (client.http.app.openapi_schema.paths or {}).items():
        for method in ("get", "put", "post", "patch", "delete"):
            operation = getattr(item, method, None)
            for parameter in (operation.parameters or []) if operation else []:
                if str(getattr(parameter, "param_in", "")) in ("query", "ParamType.QUERY"):
                    found.setdefault(path, set()).add(parameter.name)
    assert any("page" in names for names in found.values()), found  # /users?page= is an integer
    return found


def assert_not_500(response: Any, path: str, what: str) -> None:
    """Any status but a 5xx; an error under /api or /v1 in that face's shape."""
    shown = path if len(path) < 160 else f"{path[:120]}...({len(path)} characters)"
    assert response.status_code < 500, f"{what} on {shown}: {response.status_code} {response.text[:300]}"
    if response.status_code >= 400 and path.startswith(("/api/", "/v1/")):
        body = response.json()
        if path.startswith("/v1/"):
            assert body["error"]["message"], (what, shown, body)
        else:
            assert body["message"], (what, shown, body)
            assert body["rc"], (what, shown, body)


@pytest.mark.slow
async def test_integers_beyond_the_digit_limit_in_every_path_and_query_parameter(client: HordeClient) -> None:
    # A moderator: DELETE /users/{id} of its own padded id is then refused (CannotDeleteMod), so the
    # walk changes nothing that `stored` compares.
    key = await client.user("owner", kudos=1000, moderator=True)
    await client.user("bob")
    queries = query_parameters(client)
    before = await stored(client)
    walked = 0
    for method, template, _handler in routes(client):
        for what, digits in BEYOND_THE_DIGIT_LIMIT.items():
            if "{" in template:
                path = fill(template, digits)
                assert_not_500(await send(client, method, path, key, b"{}"), path, f"path {what}")
                walked += 1
            names = queries.get(re.sub(r":[a-z]+\}", "}", template), set())
            for name in names:
                path = fill(template, "1") + f"?{name}={digits}"
                assert_not_500(await send(client, method, path, key, b"{}"), path, f"{name} = {what}")
                walked += 1
    assert walked >= 60, walked
    # An id of 4301 digits is no user (not a 500); leading zeros are still the number they pad.
    for what, digits in BEYOND_THE_DIGIT_LIMIT.items():
        found = await client.http.get(f"/api/v2/users/{digits}")
        if what == "zeros then a 1":
            assert found.json()["username"] == "owner#1", found.text
        else:
            assert found.status_code == 404, (what, found.text)
    assert await stored(client) == before


@pytest.mark.slow
async def test_every_path_shape_on_every_route(client: HordeClient) -> None:
    key = ANON  # a doubled or trailing slash still reaches its route: nothing may be created
    before = await stored(client)
    for method, template, _handler in routes(client):
        for what, value in PATH_SHAPES.items():
            path = fill(template, value) if "{" in template else template.rstrip("/") + "/" + value
            assert_not_500(await send(client, method, path, key, b"{}"), path, what)
        doubled = fill(template, "00000000-0000-4000-8000-000000000000").replace("/", "//")
        assert_not_500(await send(client, method, doubled, key, b"{}"), doubled, "doubled slashes")
        trailing = fill(template, "00000000-0000-4000-8000-000000000000") + "/"
        assert_not_500(await send(client, method, trailing, key, b"{}"), trailing, "trailing slash")
    assert await stored(client) == before


@pytest.mark.slow
async def test_every_cookie_and_header_shape_on_every_route(client: HordeClient) -> None:
    """The dashboard's session cookie is the only cookie the app reads (when no key is sent); every
    route is walked with it anyway, since a cookie reaches every route."""
    moderator = await client.user("mod", moderator=True)
    before = await stored(client)
    for method, template, _handler in routes(client):
        path = fill(template, "00000000-0000-4000-8000-000000000000")
        for what, cookie in COOKIE_SHAPES.items():
            headers = [(b"content-type", b"application/json"), (b"cookie", cookie)]
            response = await client.http.request(method, path, content=b"{}", headers=headers)
            assert_not_500(response, path, f"cookie {what}")
        for what, extra in HEADER_SHAPES.items():
            headers = [(b"content-type", b"application/json"), *extra]
            response = await client.http.request(method, path, content=b"{}", headers=headers)
            assert_not_500(response, path, f"header {what}")
    # No shape of the session cookie signs anyone in, a moderator's key aside.
    for what, cookie in COOKIE_SHAPES.items():
        for page in ("/dashboard", "/dashboard/panels/fleet"):
            refused = await client.http.get(page, headers=[(b"cookie", cookie)])
            assert refused.status_code == 401, (what, page, refused.status_code)
        both = await client.http.get(
            "/dashboard", headers=[(b"cookie", cookie), (b"apikey", moderator.encode())]
        )
        assert both.status_code == 200, (what, both.status_code)
    assert await stored(client) == before


# "name#" followed by a digit of another script: int() reads it (fullwidth 2, Arabic-Indic 2, ...),
# and the lookups used to fall back to the bare name.
NOT_ASCII_IDS = ("\uff12", "\u0662", "\u06f2", "\u0968", "2\u0662", "", "2a", " 2")


async def test_a_name_with_a_non_ascii_id_names_nobody(client: HordeClient) -> None:
    giver = await client.user("giver", kudos=1000)
    await client.user("bob")
    bob = await client.balance("bob")
    for uid in NOT_ASCII_IDS:
        sent = await client.http.post(
            "/api/v2/kudos/transfer", json={"username": f"bob#{uid}", "amount": 5}, headers={"apikey": giver}
        )
        assert sent.status_code == 400, (uid, sent.text)
        assert sent.json()["rc"] == "InvalidTargetUsername", (uid, sent.text)
    assert await client.balance("bob") == bob
    ok = await client.http.post(
        "/api/v2/kudos/transfer", json={"username": "bob#2", "amount": 5}, headers={"apikey": giver}
    )
    assert ok.status_code == 200, ok.text

    # A worker's priority list: "bob#<non-ASCII 2>" does not put bob's request first.
    rich = await client.user("rich", kudos=10_000)
    bobs_key = await client.user("bob2")
    richs = (await client.create(rich)).json()["id"]
    await client.create(bobs_key)
    owner = await client.user("owner")
    listed = [f"bob2#{uid}" for uid in NOT_ASCII_IDS]
    job = (await client.pop(owner, "w1", priority_usernames=listed)).json()
    async with client.horde.sessionmaker() as session:
        popped = (
            await session.execute(text("SELECT request_id FROM generations WHERE id = :g"), {"g": job["id"]})
        ).scalar_one()
    assert popped == richs  # the queue's own order: the richer request first
