"""The dashboard's address timeouts panel, on SQLite and PostgreSQL: it lists the live timeouts, its
forms time an address out and lift it through the rules the API's routes use, its actions are a
moderator's only (never open pages, never another origin), and, in headless Chromium against a
real `horde-lite run`, a moderator times a network out by typing and clicking, which the server
then refuses to a client behind its trusted proxy, until the moderator lifts it."""

from __future__ import annotations

from pathlib import Path

import httpx
from sqlalchemy import func, select

from horde_lite.db.models import IpTimeout
from tests.integration.test_dashboard import _make_moderator, browser  # noqa: F401 (a fixture)
from tests.integration.test_ip_timeouts import behind_a_proxy, by, make_app
from tests.support.cdp import browser_page
from tests.support.dashboard import BROWSER_SERVER, open_pages  # noqa: F401 (a fixture)
from tests.support.horde import ANON, HordeClient
from tests.support.server import served as running_server

PANEL = "/dashboard/panels/timeouts"
ADD = "/dashboard/ip_timeouts"
LIFT = "/dashboard/ip_timeouts/lift"


async def _count(client: HordeClient) -> int:
    async with client.horde.sessionmaker() as session:
        found: int = (await session.execute(select(func.count()).select_from(IpTimeout))).scalar_one()
    return found


async def test_the_panel_times_out_lists_and_lifts(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    as_mod = {"apikey": mod}
    http = client.http
    empty = await http.get(PANEL, headers=as_mod)
    assert empty.status_code == 200, empty.text
    assert "No address is in timeout." in empty.text
    added = await http.post(ADD, data={"ipaddr": "2001:db8:7::1", "hours": "5"}, headers=as_mod)
    assert added.status_code == 200, added.text
    assert "frame-ancestors 'none'" in added.headers["content-security-policy"]
    assert "2001:db8:7::/64 is in timeout for 5 hour(s)." in added.text
    panel = (await http.get(PANEL, headers=as_mod)).text
    assert 'data-ipaddr="2001:db8:7::/64"' in panel
    assert "5.0 h" in panel
    assert "mod#" in panel
    assert (await http.get("/dashboard", headers=as_mod)).text.count('data-ipaddr="2001:db8:7::/64"') == 1
    # Refusals: the rule's messages, a page with the status, nothing stored.
    for form, status, said in (
        ({"ipaddr": "0.0.0.0/0", "hours": "1"}, 400, "wider than an IPv4 /8"),
        ({"ipaddr": "not-an-ip", "hours": "1"}, 400, "Invalid IP Address"),
        ({"ipaddr": "<script>", "hours": "1"}, 400, "Invalid IP Address"),
        ({"ipaddr": "203.0.113.7", "hours": "721"}, 400, "1 to 720 hours"),
        ({"ipaddr": "203.0.113.7", "hours": "0"}, 400, "1 to 720 hours"),
        ({"ipaddr": "203.0.113.7", "hours": "1.5"}, 400, "whole number"),
        ({"ipaddr": "203.0.113.7", "hours": "99999"}, 400, "whole number"),
        ({"ipaddr": "203.0.113.7"}, 400, "whole number"),
        ({"hours": "1"}, 400, "Invalid IP Address"),
    ):
        answer = await http.post(ADD, data=form, headers=as_mod)
        assert answer.status_code == status, (form, answer.text)
        assert said in answer.text, (form, answer.text)
        assert "<script>" not in answer.text
    assert await _count(client) == 1
    lifted = await http.post(LIFT, data={"ipaddr": "2001:db8:7::/64"}, headers=as_mod)
    assert lifted.status_code == 200, lifted.text
    assert "The timeout of 2001:db8:7::/64 is lifted." in lifted.text
    again = await http.post(LIFT, data={"ipaddr": "2001:db8:7::/64"}, headers=as_mod)
    assert "2001:db8:7::/64 had no timeout." in again.text
    assert await _count(client) == 0


async def test_who_may_post_the_panels_actions(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    someone = await client.user("someone")
    http = client.http
    for headers, status in (({}, 401), ({"apikey": someone}, 403), ({"apikey": ANON}, 401)):
        answer = await http.post(ADD, data={"ipaddr": "203.0.113.7", "hours": "1"}, headers=headers)
        assert answer.status_code == status, answer.text
        assert 'action="/dashboard/login"' in answer.text  # the sign-in form
    for origin in ("https://evil.example", "null"):
        for path in (ADD, LIFT):
            forged = await http.post(
                path, data={"ipaddr": "203.0.113.7", "hours": "1"}, headers={"apikey": mod, "origin": origin}
            )
            assert forged.status_code == 403, forged.text
    assert await _count(client) == 0


async def test_open_pages_open_no_action(
    open_pages: HordeClient,  # noqa: F811 (the fixture imported above)
) -> None:
    client = open_pages
    assert (await client.http.get(PANEL)).status_code == 200  # the panel is open to read
    for path in (ADD, LIFT):
        answer = await client.http.post(path, data={"ipaddr": "203.0.113.7", "hours": "1"})
        assert answer.status_code == 401, answer.text
    assert await _count(client) == 0


async def test_a_moderator_times_out_a_network_in_a_browser(
    browser: str,  # noqa: F811 (the fixture imported above)
    db_url: str,
    tmp_path: Path,
) -> None:
    """Signed in through the form, the moderator types a network and its hours and clicks Time out;
    the served app then refuses a client the trusted proxy (uvicorn's, trusting 127.0.0.1) says is
    in it, serves the others, and serves it again once the moderator clicks Lift."""
    key = await _make_moderator(db_url)
    quote = {"prompt": "Hi", "dry_run": True}

    async def quoted(http: httpx.AsyncClient, address: str | None) -> httpx.Response:
        headers = {"X-Forwarded-For": address} if address else {}
        return await http.post("/api/v2/generate/text/async", json=quote, headers=headers)

    with running_server(db_url, BROWSER_SERVER, tmp_path) as server:
        async with (
            browser_page(browser, tmp_path / "chromium-profile") as page,
            httpx.AsyncClient(base_url=server.base, timeout=30) as http,
        ):
            await page.sign_in(server.base, key)
            assert await page.until("!!document.querySelector('#ip-timeout-address')")

            await page.click_in_view("#ip-timeout-address")
            await page.type("203.0.113.0/24")
            await page.click_in_view("#ip-timeout-hours")
            await page.evaluate("document.querySelector('#ip-timeout-hours').select()")
            await page.type("3")
            await page.submit("#add-ip-timeout-go")
            message = await page.evaluate("document.querySelector('#action-message').textContent")
            assert message == "203.0.113.0/24 is in timeout for 3 hour(s).", message

            refused = await quoted(http, "203.0.113.9")
            assert (refused.status_code, refused.json()["rc"]) == (403, "TimeoutIP"), refused.text
            assert (await quoted(http, "203.0.114.9")).status_code == 200
            assert (await quoted(http, None)).status_code == 200  # no header: the proxy itself

            await page.submit("#back")
            row = "tr[data-ipaddr='203.0.113.0/24']"
            assert await page.until(f"!!document.querySelector({row!r})")
            await page.submit(f"{row} button")
            message = await page.evaluate("document.querySelector('#action-message').textContent")
            assert message == "The timeout of 203.0.113.0/24 is lifted.", message
            assert (await quoted(http, "203.0.113.9")).status_code == 200


async def test_the_panel_blocks_a_workers_address(db_url: str) -> None:
    """The block form times out the address the worker last popped from, as the API's worker block
    does; an unknown worker or bad days store nothing."""
    async with behind_a_proxy(make_app(db_url)) as client:
        mod = await client.user("mod", moderator=True)
        owner = await client.user("owner")
        worker = {"name": "w1", "models": ["m"]}
        popped = await client.http.post(
            "/api/v2/generate/text/pop", json=worker, headers=by("198.51.100.9", owner)
        )
        assert popped.status_code == 200, popped.text
        worker_id = (await client.http.get("/api/v2/workers")).json()[0]["id"]
        as_mod = {"apikey": mod}
        for form, status, said in (
            ({"worker_id": worker_id, "days": "31"}, 400, "1 to 30 days"),
            ({"worker_id": worker_id, "days": "x"}, 400, "whole number"),
            ({"worker_id": "no-such-worker", "days": "1"}, 404, "No worker with id"),
            ({"worker_id": "<script>" * 50, "days": "1"}, 404, "No worker with id"),
        ):
            answer = await client.http.post(f"{ADD}/block_worker", data=form, headers=as_mod)
            assert answer.status_code == status, (form, answer.text)
            assert said in answer.text, (form, answer.text)
            assert "<script>" not in answer.text
        assert await _count(client) == 0
        blocked = await client.http.post(
            f"{ADD}/block_worker", data={"worker_id": worker_id, "days": "2"}, headers=as_mod
        )
        assert blocked.status_code == 200, blocked.text
        assert "198.51.100.9, is in timeout for 2 day(s)" in blocked.text
        again = await client.http.post(
            "/api/v2/generate/text/pop", json=worker, headers=by("198.51.100.9", owner)
        )
        assert (again.status_code, again.json()["rc"]) == (403, "TimeoutIP")
