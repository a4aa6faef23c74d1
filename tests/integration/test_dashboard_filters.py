"""The dashboard's filters panel (docs/reference/dashboard.md), on SQLite and PostgreSQL: it lists the
filters, adds one and deletes one through the rules the horde API's /filters routes follow, only for
a moderator's session from this site's own page (never on open pages); and, in headless Chromium, a
moderator who signs in, adds a filter by typing and clicking, and sees a request refused by it."""

from __future__ import annotations

from pathlib import Path

import httpx
from sqlalchemy import text

from tests.integration.test_dashboard import _make_moderator, browser  # noqa: F401 (a fixture)
from tests.support.cdp import browser_page
from tests.support.dashboard import BROWSER_SERVER, open_pages  # noqa: F401 (a fixture)
from tests.support.horde import ANON, HordeClient
from tests.support.server import served as running_server


async def _filters(client: HordeClient) -> list[tuple[object, ...]]:
    async with client.horde.sessionmaker() as session:
        rows = await session.execute(
            text("SELECT id, regex, filter_type, description FROM filters ORDER BY id")
        )
        return [tuple(r) for r in rows]


async def test_the_panel_lists_adds_and_deletes_filters(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    http, as_mod = client.http, {"apikey": mod}
    empty = await http.get("/dashboard/panels/filters", headers=as_mod)
    assert empty.status_code == 200
    assert "No filter yet" in empty.text

    added = await http.post(
        "/dashboard/filters",
        data={"regex": " <b>dragons?</b> ", "filter_type": "10", "description": "No <dragons>."},
        headers=as_mod,
    )
    assert added.status_code == 200, added.text
    assert "Filter 1 (block, type 10) is in force." in added.text
    assert await _filters(client) == [(1, " <b>dragons?</b> ", 10, "No <dragons>.")]  # as typed, spaces kept
    panel = (await http.get("/dashboard/panels/filters", headers=as_mod)).text
    assert 'data-filter="1"' in panel
    assert "&lt;b&gt;dragons?&lt;/b&gt;" in panel  # escaped
    assert "<b>dragons" not in panel
    refused = await client.create(ANON, prompt="Tell me of <b>DRAGONS</b> .")
    assert (refused.status_code, refused.json()["message"]) == (
        400,
        "This prompt was refused by a filter: No <dragons>.",
    )

    for form, status, said in (
        ({"regex": "(open", "filter_type": "10"}, 400, "not a valid pattern"),
        ({"regex": "(a+)+$", "filter_type": "10"}, 400, "catastrophic"),
        ({"regex": "fine", "filter_type": "abc"}, 400, "filter_type"),
        ({"regex": "fine", "filter_type": "30"}, 400, "filter_type"),
        ({"regex": "fine"}, 400, "filter_type"),
        ({"filter_type": "10"}, 400, "regex"),
        ({"regex": "r" * 2001, "filter_type": "10"}, 400, "regex"),
    ):
        answer = await http.post("/dashboard/filters", data=form, headers=as_mod)
        assert answer.status_code == status, (form, answer.text)
        assert said in answer.text, (form, answer.text)
    assert len(await _filters(client)) == 1

    for odd in ("abc", "999"):
        missing = await http.post(f"/dashboard/filters/{odd}/delete", headers=as_mod)
        assert missing.status_code == 404
        assert "not found" in missing.text
    deleted = await http.post("/dashboard/filters/1/delete", headers=as_mod)
    assert deleted.status_code == 200
    assert "Filter 1 is deleted." in deleted.text
    assert await _filters(client) == []
    assert (await client.create(ANON, prompt="Tell me of <b>DRAGONS</b> .")).status_code == 202


async def test_who_may_post_the_panels_actions(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    someone = await client.user("someone")
    form = {"regex": "x", "filter_type": "10"}
    for headers, status in (({}, 401), ({"apikey": someone}, 403), ({"apikey": ANON}, 401)):
        answer = await client.http.post("/dashboard/filters", data=form, headers=headers)
        assert answer.status_code == status, answer.text
        assert 'action="/dashboard/login"' in answer.text
    for origin in ("https://evil.example", "null"):
        forged = await client.http.post(
            "/dashboard/filters", data=form, headers={"apikey": mod, "origin": origin}
        )
        assert forged.status_code == 403
    assert await _filters(client) == []


async def test_open_pages_open_no_filter_action_and_no_route(
    open_pages: HordeClient,  # noqa: F811 (the fixture imported above)
) -> None:
    client = open_pages
    assert (await client.http.get("/dashboard/panels/filters")).status_code == 200  # the panel reads
    made = await client.http.post("/dashboard/filters", data={"regex": "x", "filter_type": "10"})
    assert made.status_code == 401
    listed = await client.http.get("/api/v2/filters")
    assert (listed.status_code, listed.json()["rc"]) == (403, "NotModerator")
    assert await _filters(client) == []


async def test_a_moderator_adds_a_filter_in_a_browser_and_it_refuses_a_request(
    browser: str,  # noqa: F811 (the fixture imported above)
    db_url: str,
    tmp_path: Path,
) -> None:
    key = await _make_moderator(db_url)
    with running_server(db_url, BROWSER_SERVER, tmp_path) as server:
        async with browser_page(browser, tmp_path / "chromium-profile") as page:
            await page.sign_in(server.base, key)
            assert await page.until("!!document.querySelector('#filter-regex')")

            await page.click_in_view("#filter-regex")
            await page.type(r"\bpurple\s+cow\b")
            await page.click_in_view("#filter-description")
            await page.type("Cows are never purple here.")
            await page.submit("#add-filter-go")
            message = await page.evaluate("document.querySelector('#action-message').textContent")
            assert "is in force" in message, message
            await page.submit("#back")
            assert await page.until("document.querySelectorAll('tr[data-filter]').length === 1")

            async with httpx.AsyncClient(base_url=server.base, timeout=30) as http:
                refused = await http.post("/api/v2/generate/text/async", json={"prompt": "A Purple  cow!"})
                assert refused.status_code == 400, refused.text
                assert refused.json() == {
                    "message": "This prompt was refused by a filter: Cows are never purple here.",
                    "rc": "CorruptPrompt",
                }
                admitted = await http.post("/api/v2/generate/text/async", json={"prompt": "A brown cow."})
                assert admitted.status_code == 202, admitted.text
