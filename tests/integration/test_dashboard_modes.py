"""The dashboard's modes panel (docs/reference/dashboard.md), on SQLite and PostgreSQL: the modes it
shows, its form switching them through the same rules as PUT /api/v2/status/modes, who may post it
(never open pages, never another origin), and, in headless Chromium, a moderator who signs in and
switches invite-only mode by clicking."""

from __future__ import annotations

from pathlib import Path

import httpx
from sqlalchemy import text

from tests.integration.test_dashboard import _make_moderator, browser  # noqa: F401 (a fixture)
from tests.support.cdp import browser_page
from tests.support.dashboard import BROWSER_SERVER, open_pages  # noqa: F401 (a fixture)
from tests.support.horde import ANON, HordeClient
from tests.support.server import served as running_server

MODES = "/api/v2/status/modes"


async def _switches(client: HordeClient) -> list[tuple[object, ...]]:
    async with client.horde.sessionmaker() as session:
        rows = await session.execute(
            text("SELECT mode, enabled, changed_by, source FROM horde_mode_changes ORDER BY id")
        )
        return [(m, bool(e), b, s) for m, e, b, s in rows]


async def test_the_panel_shows_and_switches_the_modes(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    http = client.http
    as_mod = {"apikey": mod}
    panel = await http.get("/dashboard/panels/modes", headers=as_mod)
    assert panel.status_code == 200, panel.text
    for mode in ("maintenance", "invite_only", "raid"):
        assert f'id="mode-{mode}-state">off<' in panel.text, mode
    assert "No switch recorded." in panel.text

    switched = await http.post(
        "/dashboard/modes",
        data={"mode": "invite_only", "enabled": "on"},
        headers=as_mod,
        follow_redirects=False,
    )
    assert switched.status_code == 303, switched.text
    assert switched.headers["location"] == "/dashboard#panel-modes"
    assert (await http.get(MODES)).json() == {"maintenance_mode": False, "invite_only_mode": True}
    panel = await http.get("/dashboard/panels/modes", headers=as_mod)
    assert 'id="mode-invite_only-state">on<' in panel.text
    assert 'id="mode-invite_only-go">Turn off<' in panel.text
    assert await _switches(client) == [("invite_only", True, "mod#1", "dashboard")]

    # Maintenance is for admins: a moderator who is not one is told so, and nothing changes.
    refused = await http.post(
        "/dashboard/modes", data={"mode": "maintenance", "enabled": "on"}, headers=as_mod
    )
    assert refused.status_code == 403
    assert "admins" in refused.text
    for bad in ({"mode": "nap", "enabled": "on"}, {"mode": "raid", "enabled": "yes"}, {"mode": "raid"}, {}):
        answer = await http.post("/dashboard/modes", data=bad, headers=as_mod)
        assert answer.status_code == 400, bad
    foreign = await http.post(
        "/dashboard/modes",
        data={"mode": "raid", "enabled": "on"},
        headers={**as_mod, "origin": "https://evil.example"},
    )
    assert foreign.status_code == 403
    for key in (ANON, await client.user("someone")):
        outsider = await http.post(
            "/dashboard/modes", data={"mode": "raid", "enabled": "on"}, headers={"apikey": key}
        )
        assert outsider.status_code in (401, 403)
    assert client.horde.modes.raid is False
    assert client.horde.modes.maintenance is False
    assert len(await _switches(client)) == 1


async def test_open_pages_show_the_modes_but_switch_none(
    open_pages: HordeClient,  # noqa: F811 (the fixture imported above)
) -> None:
    page = await open_pages.http.get("/dashboard")
    assert page.status_code == 200
    assert 'data-panel="modes"' in page.text
    answer = await open_pages.http.post("/dashboard/modes", data={"mode": "raid", "enabled": "on"})
    assert answer.status_code == 401
    assert open_pages.horde.modes.version == 0


async def test_a_moderator_switches_a_mode_in_a_browser(
    browser: str,  # noqa: F811 (the fixture imported above)
    db_url: str,
    tmp_path: Path,
) -> None:
    """Signed in through the form, the moderator clicks invite-only's button; the panel and the API
    both say it is on."""
    key = await _make_moderator(db_url)
    with running_server(db_url, BROWSER_SERVER, tmp_path) as server:
        async with browser_page(browser, tmp_path / "chromium-profile") as page:
            await page.sign_in(server.base, key)
            go = "#mode-invite_only-go"
            assert await page.until(f"!!document.querySelector({go!r})")
            await page.submit(go)
            state = "document.querySelector('#mode-invite_only-state')"
            assert await page.until(f"{state} && {state}.textContent === 'on'")
            async with httpx.AsyncClient(base_url=server.base, timeout=30) as http:
                shown = (await http.get(MODES)).json()
                assert shown == {"maintenance_mode": False, "invite_only_mode": True}
                as_mod = (await http.get(MODES, headers={"apikey": key})).json()
                assert as_mod["raid_mode"] is False
