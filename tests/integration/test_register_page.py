"""The /register page and the dashboard's invites panel, on SQLite and PostgreSQL: the forms in
process (each mode, the origin check, the headers, a hostile name shown escaped, key rotation, a
moderator's invite codes), then the page in headless Chromium: a person types a name, clicks, reads
the key shown and uses it on /api/v2/find_user."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from horde_lite.dashboard.routes import HEADERS
from tests.integration.test_dashboard import browser  # noqa: F401 (the fixture)
from tests.integration.test_registration import horde_in, listed, me, users
from tests.support.cdp import browser_page
from tests.support.horde import HordeClient
from tests.support.server import served as running_server

KEY = re.compile(r'<code class="key" id="new-key">([^<]+)</code>')
CODE = re.compile(r'<code class="key" id="invite-code">([^<]+)</code>')
OTHER_SITE = {"Origin": "https://evil.example"}


def shown_key(page: httpx.Response) -> str:
    found = KEY.search(page.text)
    assert found, page.text
    return found.group(1)


async def test_the_page_in_each_mode(db_url: str) -> None:
    for mode, form, code in (("closed", False, False), ("invite", True, True), ("open", True, False)):
        async with horde_in(db_url, mode) as client:
            page = await client.http.get("/register")
            assert page.status_code == 200
            assert page.headers["content-type"].startswith("text/html")
            for name, value in HEADERS.items():
                assert page.headers[name] == value, name
            assert ('id="username"' in page.text) is form, mode
            assert ('id="invite"' in page.text) is code, mode
            assert ("Registration is closed" in page.text) is (not form), mode
            assert 'action="/register/rotate"' in page.text  # rotation whatever the mode
            assert "<script" not in page.text


async def test_registering_through_the_form_shows_the_key_once(db_url: str) -> None:
    async with horde_in(db_url, "open") as client:
        made = await client.http.post("/register", data={"username": "<script>alert(1)</script>"})
        assert made.status_code == 200, made.text
        assert made.headers["cache-control"] == "no-store"
        assert "<script>alert" not in made.text  # the name is shown escaped
        assert "&lt;script&gt;" in made.text
        key = shown_key(made)
        assert (await me(client, key)).json()["username"].startswith("<script>alert(1)</script>#")
        again = await client.http.get("/register")
        assert key not in again.text


async def test_a_refused_form_says_why_and_keeps_the_name(db_url: str) -> None:
    async with horde_in(db_url, "invite") as client:
        for data, status, words in (
            ({"username": "bob"}, 403, "needs an invite code"),
            ({"username": "bob", "invite": "nope"}, 404, "No invite has that code"),
            ({"username": "a" * 101, "invite": "x"}, 400, "at most 100 characters"),
            ({"username": "a\u0000b", "invite": "x"}, 400, "control or invisible"),
        ):
            page = await client.http.post("/register", data=data)
            assert page.status_code == status, (data, page.text)
            assert words in page.text, (data, page.text)
            assert not KEY.search(page.text)
        page = await client.http.post("/register", data={"username": "bob", "invite": "nope"})
        assert 'value="bob"' in page.text
        assert await users(client) == []


async def test_a_form_from_another_origin_is_refused(db_url: str) -> None:
    async with horde_in(db_url, "open") as client:
        old = await client.user("alice")
        for origin in (OTHER_SITE, {"Origin": "null"}):
            page = await client.http.post("/register", data={"username": "forged"}, headers=origin)
            assert page.status_code == 403, page.text
            page = await client.http.post("/register/rotate", data={"apikey": old}, headers=origin)
            assert page.status_code == 403, page.text
        assert await users(client) == ["alice"]
        assert (await me(client, old)).status_code == 200
        same = {"Origin": str(client.http.base_url).rstrip("/")}
        page = await client.http.post("/register", data={"username": "real"}, headers=same)
        assert page.status_code == 200, page.text
        assert await users(client) == ["alice", "real"]


async def test_rotating_through_the_form(client: HordeClient) -> None:
    old = await client.user("alice")
    page = await client.http.post("/register/rotate", data={"apikey": f"  {old}  "})
    assert page.status_code == 200, page.text
    new = shown_key(page)
    assert new != old
    assert "old key no longer works" in page.text
    assert (await me(client, old)).status_code == 401
    assert (await me(client, new)).json()["username"].startswith("alice#")
    for data, status in (
        ({"apikey": old}, 401),
        ({"apikey": ""}, 403),
        ({"apikey": "0000000000"}, 403),
        ({}, 403),
    ):
        refused = await client.http.post("/register/rotate", data=data)
        assert refused.status_code == status, (data, refused.text)
        assert not KEY.search(refused.text)
    assert (await me(client, new)).status_code == 200


# --- the dashboard's invites panel ---------------------------------------------------------------------


async def test_a_moderator_makes_and_revokes_codes_on_the_dashboard(db_url: str) -> None:
    async with horde_in(db_url, "invite") as client:
        moderator = await client.user("mod", moderator=True)
        plain = await client.user("plain")
        mod = {"apikey": moderator}
        panel = await client.http.get("/dashboard/panels/invites", headers=mod)
        assert panel.status_code == 200
        assert 'action="/dashboard/invites"' in panel.text
        assert "No invite code yet" in panel.text

        # Only a moderator, only from the dashboard's own form.
        for headers, status in (({}, 401), ({"apikey": plain}, 403), ({**mod, **OTHER_SITE}, 403)):
            made = await client.http.post("/dashboard/invites", data={"uses": "2"}, headers=headers)
            assert made.status_code == status, (headers, made.text)
            assert not CODE.search(made.text)
        for data in ({"uses": "x", "days": "1"}, {"uses": "0", "days": "1"}, {"uses": "1", "days": "-1"},
                     {"uses": "9" * 5000, "days": "1"}, {}):  # fmt: skip
            made = await client.http.post("/dashboard/invites", data=data, headers=mod)
            assert made.status_code == 400, (data, made.text)
        assert await listed(client, moderator) == {}

        made = await client.http.post("/dashboard/invites", data={"uses": "2", "days": "0"}, headers=mod)
        assert made.status_code == 200, made.text
        assert made.headers["cache-control"] == "no-store"
        code = CODE.search(made.text)
        assert code, made.text
        [shown] = (await listed(client, moderator)).values()
        creator = (await me(client, moderator)).json()["username"]
        assert (shown["uses"], shown["expires_at"], shown["created_by"]) == (2, None, creator)
        panel = await client.http.get("/dashboard/panels/invites", headers=mod)
        assert code.group(1)[:4] in panel.text
        assert code.group(1) not in panel.text  # shown once
        body = {"username": "new", "invite": code.group(1)}
        registered = await client.http.post("/api/v2/register", json=body)
        assert registered.status_code == 200, registered.text

        revoke = f"/dashboard/invites/{shown['id']}/revoke"
        assert (await client.http.post(revoke, headers={**mod, **OTHER_SITE})).status_code == 403
        assert (await client.http.post(revoke, headers={"apikey": plain})).status_code == 403
        gone = await client.http.post(revoke, headers=mod, follow_redirects=False)
        assert gone.status_code == 303, gone.text
        assert gone.headers["location"].startswith("/dashboard")
        assert (await listed(client, moderator))[shown["id"]]["state"] == "revoked"
        assert (await client.http.post("/dashboard/invites/999/revoke", headers=mod)).status_code == 404
        late = await client.http.post("/api/v2/register", json={**body, "username": "late"})
        assert late.json()["rc"] == "InviteRevoked"


# --- in a real browser ---------------------------------------------------------------------------------


async def test_a_person_registers_in_a_browser_and_uses_the_key(
    browser: str,  # noqa: F811
    db_url: str,
    tmp_path: Path,
) -> None:
    """Chromium loads /register from a real `horde-lite run`, the name is typed into the field and
    the button clicked; the browser posts the form as it does (its own Origin), the key shown is
    read from the page and used on the API."""
    overrides: dict[str, dict[str, object]] = {
        "accounts": {"registration": "open"},
        "lease": {"sweep_seconds": 0},
        "database": {"null_pool": True},
    }
    with running_server(db_url, overrides, tmp_path) as server:
        async with browser_page(browser, tmp_path / "chromium-profile") as page:
            await page.navigate(f"{server.base}/register")
            await page.click("#username")
            await page.type("browser-person")
            await page.click("#register-button")
            await page.event("Page.loadEventFired")
            error = await page.evaluate(
                "document.querySelector('.error') && document.querySelector('.error').textContent"
            )
            assert not error, f"the registration was refused: {error}"
            key = await page.until(
                "document.querySelector('#new-key') && document.querySelector('#new-key').textContent"
            )
            assert "shown only once" in await page.evaluate("document.body.innerText")
        async with httpx.AsyncClient(base_url=server.base, timeout=10) as http:
            found = await http.get("/api/v2/find_user", headers={"apikey": key})
    assert found.status_code == 200, found.text
    assert found.json()["username"] == f"browser-person#{found.json()['id']}"
