"""The dashboard's users panel (docs/reference/dashboard.md), on SQLite and PostgreSQL: its search,
its actions (create, kudos, flags, delete with a confirmation) through the same rules as the horde
API's user routes, who may post them (never open pages, never another origin), and, in headless
Chromium, a moderator who signs in and uses the panel by typing and clicking."""

from __future__ import annotations

from pathlib import Path

import httpx
from sqlalchemy import text

from tests.integration.test_dashboard import COOKIE, _make_moderator, browser  # noqa: F401 (a fixture)
from tests.support.cdp import browser_page
from tests.support.dashboard import BROWSER_SERVER, open_pages  # noqa: F401 (a fixture)
from tests.support.horde import ANON, HordeClient
from tests.support.server import served as running_server


async def _user_id(client: HordeClient, key: str) -> int:
    return int((await client.http.get("/api/v2/find_user", headers={"apikey": key})).json()["id"])


async def _users(client: HordeClient) -> list[tuple[object, ...]]:
    async with client.horde.sessionmaker() as session:
        rows = await session.execute(
            text("SELECT id, username, kudos, trusted, moderator FROM users ORDER BY id")
        )
        return [tuple(r) for r in rows]


async def test_the_panel_lists_and_searches_users(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    await client.user("alice", kudos=12.5)
    await client.user("bob")
    await client.user("50%_off")
    http = client.http
    page = await http.get("/dashboard", headers={"apikey": mod}, params={"q": "ALI"})
    assert page.status_code == 200, page.text
    panel = page.text[page.text.index('data-panel="users"') :]
    assert 'data-user="alice#' in panel
    assert 'data-user="bob#' not in panel
    assert 'value="ALI"' in panel  # the search box keeps the search
    fragment = await http.get("/dashboard/panels/users", headers={"apikey": mod})
    for name in ("mod#", "alice#", "bob#", "50%_off#"):
        assert f'data-user="{name}' in fragment.text, name
    assert "12.50" in fragment.text
    # LIKE's wildcards are searched for as themselves.
    literal = await http.get("/dashboard/panels/users", headers={"apikey": mod}, params={"q": "%_"})
    assert 'data-user="50%_off#' in literal.text
    assert 'data-user="alice#' not in literal.text
    for hostile in ("x" * 10_000, "<script>", "\u0430lice"):
        answer = await http.get("/dashboard/panels/users", headers={"apikey": mod}, params={"q": hostile})
        assert answer.status_code == 200
        assert "<script>" not in answer.text
    assert (await http.get("/dashboard/panels/users", headers={"apikey": ANON})).status_code == 401


async def test_the_panels_actions_as_a_moderator(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    http = client.http
    as_mod = {"apikey": mod}

    made = await http.post(
        "/dashboard/users/create", data={"username": "carol", "kudos": "30"}, headers=as_mod
    )
    assert made.status_code == 200, made.text
    assert "frame-ancestors 'none'" in made.headers["content-security-policy"]
    key = made.text.split('<code id="new-key">')[1].split("</code>")[0]
    me = (await http.get("/api/v2/find_user", headers={"apikey": key})).json()
    assert (me["username"].split("#")[0], me["kudos"], me["trusted"]) == ("carol", 30, False)
    carol = me["id"]

    given = await http.post(f"/dashboard/users/{carol}/kudos", data={"amount": "12.5"}, headers=as_mod)
    assert given.status_code == 200, given.text
    assert "42.5" in given.text
    taken = await http.post(f"/dashboard/users/{carol}/kudos", data={"amount": "-40"}, headers=as_mod)
    assert "2.5" in taken.text
    assert await client.balance("carol") == 2.5
    trusted = await http.post(f"/dashboard/users/{carol}/flags", data={"trusted": "true"}, headers=as_mod)
    assert trusted.status_code == 200
    assert "trusted on" in trusted.text
    moderator = await http.post(f"/dashboard/users/{carol}/flags", data={"moderator": "true"}, headers=as_mod)
    assert "moderator on" in moderator.text
    await http.post(f"/dashboard/users/{carol}/flags", data={"moderator": "false"}, headers=as_mod)
    me = (await http.get("/api/v2/find_user", headers={"apikey": key})).json()
    assert (me["trusted"], me["moderator"]) == (True, False)

    # Refusals: the rule's own messages, nothing changed.
    before = await _users(client)
    for path, form, status, said in (
        ("/dashboard/users/create", {"username": "carol"}, 400, "already exists"),
        ("/dashboard/users/create", {"username": "x\u200by"}, 400, "format"),
        ("/dashboard/users/create", {"username": "y" * 10_000}, 400, "username"),
        ("/dashboard/users/create", {}, 400, "username"),
        ("/dashboard/users/create", {"username": "z", "kudos": "-5"}, 400, "kudos"),
        (f"/dashboard/users/{carol}/kudos", {"amount": "abc"}, 400, "kudos"),
        (f"/dashboard/users/{carol}/kudos", {"amount": "1e308"}, 400, "kudos"),
        (f"/dashboard/users/{carol}/kudos", {"amount": "nan"}, 400, "kudos"),
        (f"/dashboard/users/{carol}/kudos", {}, 400, "No user modification"),
        (f"/dashboard/users/{carol}/flags", {"trusted": "maybe"}, 400, "trusted"),
        ("/dashboard/users/abc/kudos", {"amount": "1"}, 404, "numeric part"),
        ("/dashboard/users/-1/flags", {"trusted": "true"}, 404, "numeric part"),
        ("/dashboard/users/424242/kudos", {"amount": "1"}, 404, "424242"),
        ("/dashboard/users/0/flags", {"trusted": "true"}, 400, "anonymous"),
    ):
        answer = await http.post(path, data=form, headers=as_mod)
        assert answer.status_code == status, (path, form, answer.text)
        assert said in answer.text, (path, form, answer.text)
    assert await _users(client) == before

    # Delete: a confirmation first (nothing deleted), then the deletion.
    asked = await http.post(f"/dashboard/users/{carol}/delete", data={"name": "carol"}, headers=as_mod)
    assert asked.status_code == 200
    assert 'id="confirm-delete"' in asked.text
    assert (await http.get("/api/v2/find_user", headers={"apikey": key})).status_code == 200
    gone = await http.post(f"/dashboard/users/{carol}/delete", data={"confirm": "yes"}, headers=as_mod)
    assert gone.status_code == 200, gone.text
    assert "Deleted carol#" in gone.text
    assert (await http.get("/api/v2/find_user", headers={"apikey": key})).status_code == 401
    mod_id = await _user_id(client, mod)
    refused = await http.post(f"/dashboard/users/{mod_id}/delete", data={"confirm": "yes"}, headers=as_mod)
    assert refused.status_code == 403
    assert "moderator cannot be deleted" in refused.text


async def test_who_may_post_the_panels_actions(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    someone = await client.user("someone")
    someone_id = await _user_id(client, someone)
    http = client.http
    before = await _users(client)
    for headers, status in (({}, 401), ({"apikey": someone}, 403), ({"apikey": ANON}, 401)):
        answer = await http.post(
            f"/dashboard/users/{someone_id}/kudos", data={"amount": "5"}, headers=headers
        )
        assert answer.status_code == status, answer.text
        assert 'action="/dashboard/login"' in answer.text  # the sign-in form
    for origin in ("https://evil.example", "null"):
        forged = await http.post(
            "/dashboard/users/create", data={"username": "forged"}, headers={"apikey": mod, "origin": origin}
        )
        assert forged.status_code == 403
    assert await _users(client) == before

    # Through the sign-in's session cookie, from this site's own page.
    signed = await http.post("/dashboard/login", data={"apikey": mod}, follow_redirects=False)
    token = signed.headers["set-cookie"].split(";")[0].split("=", 1)[1].strip('"')
    http.cookies.clear()
    session = {"cookie": f"{COOKIE}={token}", "origin": "http://testserver.local", "host": "testserver.local"}
    done = await http.post(f"/dashboard/users/{someone_id}/kudos", data={"amount": "5"}, headers=session)
    assert done.status_code == 200, done.text
    assert await client.balance("someone") == 5
    # The session ends with the moderator flag: its next action is refused.
    async with client.horde.transaction() as s:
        await s.execute(text("UPDATE users SET moderator = false WHERE username = 'mod'"))
    after = await http.post(f"/dashboard/users/{someone_id}/kudos", data={"amount": "5"}, headers=session)
    assert after.status_code == 401
    assert await client.balance("someone") == 5


async def test_open_pages_open_no_action(
    open_pages: HordeClient,  # noqa: F811 (the fixture imported above)
) -> None:
    client = open_pages
    await client.user("someone")
    page = await client.http.get("/dashboard")
    assert page.status_code == 200  # the panels are open to read
    assert 'data-user="someone#' in page.text
    before = await _users(client)
    made = await client.http.post("/dashboard/users/create", data={"username": "drive-by"})
    assert made.status_code == 401
    assert 'action="/dashboard/login"' in made.text
    assert await _users(client) == before


async def test_a_moderator_uses_the_users_panel_in_a_browser(
    browser: str,  # noqa: F811 (the fixture imported above)
    db_url: str,
    tmp_path: Path,
) -> None:
    """Signed in through the form, the moderator types a new user's name and clicks Create, reads the
    key shown once (and it works), gives it kudos by typing an amount, flags it, then deletes it
    through the confirmation page."""
    key = await _make_moderator(db_url)
    with running_server(db_url, BROWSER_SERVER, tmp_path) as server:
        async with browser_page(browser, tmp_path / "chromium-profile") as page:
            await page.sign_in(server.base, key)
            assert await page.until("!!document.querySelector('#new-username')")

            await page.click_in_view("#new-username")
            await page.type("browser-made")
            await page.click_in_view("#new-kudos")
            await page.type("7")
            await page.submit("#create-user-go")
            message = await page.evaluate("document.querySelector('#action-message').textContent")
            assert "Created browser-made#" in message, message
            new_key = await page.evaluate("document.querySelector('#new-key').textContent")
            assert len(new_key) == 22
            await page.submit("#back")

            async with httpx.AsyncClient(base_url=server.base, timeout=30) as http:
                me = (await http.get("/api/v2/find_user", headers={"apikey": new_key})).json()
                assert (me["username"].startswith("browser-made#"), me["kudos"]) == (True, 7)

            selector = "tr[data-user^='browser-made#']"
            assert await page.until(f"!!document.querySelector({selector!r})")
            await page.click_in_view(f"{selector} input[name=amount]")
            await page.type("35.5")
            await page.submit(f"{selector} form.kudos button")
            message = await page.evaluate("document.querySelector('#action-message').textContent")
            assert "42.5" in message, message
            await page.submit("#back")
            cell = f"document.querySelector({selector!r})"
            kudos = await page.until(f"{cell} && {cell}.children[1].textContent")
            assert kudos == "42.50"

            await page.submit(f"{selector} button.flagged")
            message = await page.evaluate("document.querySelector('#action-message').textContent")
            assert "flagged on" in message, message
            await page.submit("#back")
            button = f"{cell} && {cell}.querySelector('button.flagged').textContent"
            assert await page.until(f"{button} == 'Unflag'")

            await page.submit(f"{selector} button.delete")
            assert await page.evaluate("!!document.querySelector('#confirm-delete')")
            async with httpx.AsyncClient(base_url=server.base, timeout=30) as http:  # not yet deleted
                assert (await http.get("/api/v2/find_user", headers={"apikey": new_key})).status_code == 200
            await page.submit("#confirm-delete")
            message = await page.evaluate("document.querySelector('#action-message').textContent")
            assert "Deleted browser-made#" in message, message
            await page.submit("#back")
            assert await page.until("!!document.querySelector('#new-username')")
            assert not await page.evaluate(f"!!document.querySelector({selector!r})")
            async with httpx.AsyncClient(base_url=server.base, timeout=30) as http:
                assert (await http.get("/api/v2/find_user", headers={"apikey": new_key})).status_code == 401
