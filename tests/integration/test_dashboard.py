"""The operators' dashboard (/dashboard), on SQLite and PostgreSQL.

- The guard and every panel's fragment, through the app in process: no key -> the sign-in page
  (401), an ordinary key -> 403, a moderator's key (header, or once through the sign-in form that
  sets a signed session cookie) -> the page.
- The page in a real browser: a real `horde-lite run` server with `[http] open_operator_pages`,
  traffic through the API, then Debian's headless Chromium (`apt-get install chromium`) loads the
  page, runs its refresh script and dumps the DOM and a screenshot. Without Chromium the test
  skips, or fails when HORDE_LITE_REQUIRE_BROWSER=1 (CI).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from horde_lite.accounts.users import set_flags
from horde_lite.dashboard.render import PANELS
from horde_lite.db.engine import make_engine, make_sessionmaker
from horde_lite.db.models import User
from horde_lite.demo.server import make_users
from horde_lite.settings import Settings
from tests.conftest import make_settings
from tests.support.cdp import browser_page
from tests.support.horde import ANON, HordeClient
from tests.support.server import served as running_server

REPO = Path(__file__).resolve().parents[2]
MODEL = "test/dash-7B"
COOKIE = "horde_lite_dashboard"


# --- the guard and the fragments, in process ---------------------------------------------------------

CANDIDATES = {"candidate_speed_gate": "enforce_all", "candidate_allowance_curve": "jobs_per_thread"}


@pytest.fixture
def settings(db_url: str) -> Settings:
    """The in-process app with candidates configured, so the comparison panel has reports."""
    return make_settings(db_url, policies=CANDIDATES)


async def _traffic_in_process(client: HordeClient, key: str) -> None:
    """A worker, a finished job over its capacity (1200 at the assumed speed), a waiting request,
    a refusal, an invite code, an address timeout, a prompt filter and a worker message, so every
    panel has rows."""
    pop = await client.pop(key, "w-guard", models=[MODEL], max_length=4096, max_context_length=8192)
    assert pop.status_code == 200, pop.text
    created = await client.create(
        key, models=[MODEL], params={"max_length": 2000, "max_context_length": 4096}
    )
    assert created.status_code == 202, created.text
    job = await client.pop(key, "w-guard", models=[MODEL], max_length=4096, max_context_length=8192)
    assert job.json()["id"], job.text
    assert (await client.submit(key, job.json()["id"], "done " * 10)).status_code == 200
    refused = await client.create(ANON, models=[MODEL], params={"max_length": 100}, slow_workers=False)
    assert refused.status_code == 403, refused.text
    invite = await client.http.post("/api/v2/invites", json={}, headers={"apikey": key})
    assert invite.status_code == 200, invite.text
    timeout = await client.http.post(
        "/api/v2/operations/ipaddr", json={"ipaddr": "203.0.113.0/24", "hours": 1}, headers={"apikey": key}
    )
    assert timeout.status_code == 200, timeout.text
    made = await client.http.put(
        "/api/v2/filters", json={"regex": "gr[ae]y", "filter_type": 20}, headers={"apikey": key}
    )
    assert made.status_code == 200, made.text
    hello = {"message": "Hi"}
    message = await client.http.post("/api/v2/workers/messages", json=hello, headers={"apikey": key})
    assert message.status_code == 200, message.text


async def test_the_dashboard_is_for_moderators_and_every_panel_renders(client: HordeClient) -> None:
    moderator = await client.user("mod", 100, moderator=True, trusted=True)
    ordinary = await client.user("someone", 100)
    await _traffic_in_process(client, moderator)
    http = client.http

    # No key: the sign-in form, 401; a fragment: a plain 401.
    page = await http.get("/dashboard")
    assert page.status_code == 401
    assert 'action="/dashboard/login"' in page.text
    assert 'name="apikey"' in page.text
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    # A browser sends its real Origin with the form's POST under this policy (not under no-referrer).
    assert page.headers["referrer-policy"] == "same-origin"
    assert (await http.get("/dashboard/panels/fleet")).status_code == 401
    # An ordinary user's key, a wrong key, the anonymous key.
    assert (await http.get("/dashboard", headers={"apikey": ordinary})).status_code == 403
    assert (await http.get("/dashboard/panels/queue", headers={"apikey": ordinary})).status_code == 403
    assert (await http.get("/dashboard", headers={"apikey": "not-a-key-at-all-xx"})).status_code == 401
    assert (await http.get("/dashboard", headers={"apikey": ANON})).status_code == 401

    # A moderator's key in the header: the page with every panel, and each panel's fragment.
    page = await http.get("/dashboard", headers={"apikey": moderator})
    assert page.status_code == 200, page.text
    for name in PANELS:
        assert f'data-panel="{name}"' in page.text
        fragment = await http.get(f"/dashboard/panels/{name}", headers={"apikey": moderator})
        assert fragment.status_code == 200, (name, fragment.text)
        assert "<html" not in fragment.text
        assert 'class="data' in fragment.text or 'class="mark' in fragment.text, (name, fragment.text)
    assert (await http.get("/dashboard/panels/nope", headers={"apikey": moderator})).status_code == 404
    assert "w-guard" in (await http.get("/dashboard/panels/fleet", headers={"apikey": moderator})).text
    assert (await http.get("/dashboard/static/dashboard.js")).status_code == 200
    assert (await http.get("/dashboard/static/dashboard.css")).status_code == 200

    # The sign-in form: an ordinary key is refused and sets nothing.
    refused = await http.post("/dashboard/login", data={"apikey": ordinary})
    assert refused.status_code == 403
    assert COOKIE not in refused.headers.get("set-cookie", "")
    # A post from another site is refused outright.
    foreign = await http.post(
        "/dashboard/login", data={"apikey": moderator}, headers={"origin": "https://evil.example"}
    )
    assert foreign.status_code == 403
    assert COOKIE not in foreign.headers.get("set-cookie", "")
    # `Origin: null` proves nothing (a sandboxed frame sends it): refused too.
    nulled = await http.post("/dashboard/login", data={"apikey": moderator}, headers={"origin": "null"})
    assert nulled.status_code == 403
    assert COOKIE not in nulled.headers.get("set-cookie", "")
    # A moderator's key: a redirect with an HttpOnly, SameSite=Strict session cookie, never the key.
    signed = await http.post("/dashboard/login", data={"apikey": moderator}, follow_redirects=False)
    assert signed.status_code == 303
    assert signed.headers["location"] == "/dashboard"
    set_cookie = signed.headers["set-cookie"]
    assert set_cookie.startswith(f"{COOKIE}=")
    assert "HttpOnly" in set_cookie
    assert "samesite=strict" in set_cookie.lower()
    assert "Path=/dashboard" in set_cookie
    token = set_cookie.split(";")[0].split("=", 1)[1].strip('"')
    assert moderator not in token
    http.cookies.clear()
    with_session = await http.get("/dashboard", headers={"cookie": f"{COOKIE}={token}"})
    assert with_session.status_code == 200
    assert "Sign out" in with_session.text
    assert (
        await http.get("/dashboard/panels/shadow", headers={"cookie": f"{COOKIE}={token}"})
    ).status_code == 200
    # A tampered or truncated session is no session.
    user_id, expires, signature = token.split(".")
    for bad in (
        f"{user_id}.{int(expires) + 999}.{signature}",
        f"{user_id}.{expires}.{'0' * 64}",
        "x.y.z",
        "",
    ):
        assert (await http.get("/dashboard", headers={"cookie": f"{COOKIE}={bad}"})).status_code == 401, bad
    # Losing the moderator flag ends the session at once.
    async with client.horde.transaction() as session:
        user = (await session.execute(select(User).where(User.username == "mod"))).scalar_one()
        await set_flags(session, user, trusted=None, moderator=False)
    assert (await http.get("/dashboard", headers={"cookie": f"{COOKIE}={token}"})).status_code == 401


# --- the page in a real browser -------------------------------------------------------------------------


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def browser() -> str:
    found = chromium()
    if found is None:
        reason = "Chromium is not installed (Debian: apt-get install -y chromium)"
        if os.environ.get("HORDE_LITE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{reason}; HORDE_LITE_REQUIRE_BROWSER=1 requires it")
        pytest.skip(reason)
    return found


@pytest.fixture
def served(db_url: str, tmp_path: Path) -> Iterator[str]:
    """A real `horde-lite run` on a free loopback port, dashboard open, candidates configured."""
    overrides: dict[str, dict[str, object]] = {
        "http": {"open_operator_pages": True},
        "lease": {"sweep_seconds": 0},
        "database": {"null_pool": True},
        "policies": CANDIDATES,
    }
    with running_server(db_url, overrides, tmp_path) as server:
        yield server.base


async def _traffic(base: str, db_url: str) -> None:
    """Through the API: two workers pop, requests are admitted (one over the workers' capacity, one
    refused), jobs complete and one faults, one request stays waiting; an invite code, an address
    timeout and a prompt filter are made and a worker message sent."""
    keys = await make_users(db_url, {"volunteer": 0, "client": 1000})
    worker_key, client_key = keys["volunteer"], keys["client"]
    pop_body = {"models": [MODEL], "max_length": 4096, "max_context_length": 8192}
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:

        async def pop(name: str) -> str | None:
            r = await http.post(
                "/api/v2/generate/text/pop", json={"name": name, **pop_body}, headers={"apikey": worker_key}
            )
            assert r.status_code == 200, r.text
            return r.json()["id"]

        async def create(key: str, max_length: int, **extra: object) -> httpx.Response:
            body = {
                "prompt": "Hi",
                "models": [MODEL],
                "params": {"max_length": max_length, "max_context_length": 4096},
            }
            return await http.post(
                "/api/v2/generate/text/async", json={**body, **extra}, headers={"apikey": key}
            )

        async def submit(job: str, state: str = "ok") -> None:
            r = await http.post(
                "/api/v2/generate/text/submit", json={"id": job, "generation": "word " * 40, "state": state},
                headers={"apikey": worker_key},
            )  # fmt: skip
            assert r.status_code == 200, r.text

        assert await pop("dash-alpha") is None
        assert await pop("dash-beta") is None  # check in
        for length in (2000, 300, 200, 600):  # 2000: over the assumed capacity of 1200
            assert (await create(client_key, length)).status_code == 202
        refused = await create(ANON, 100, slow_workers=False)
        assert refused.status_code == 403, refused.text
        first = await pop("dash-alpha")
        second = await pop("dash-beta")
        third = await pop("dash-alpha")
        assert first
        assert second
        assert third
        await submit(first)
        await submit(second, "faulted")
        await submit(third)
        # Open pages show things; making a code still takes a moderator's key.
        assert (await http.post("/api/v2/invites", json={"uses": 2})).status_code == 403
        moderator = await _make_moderator(db_url)
        made = await http.post("/api/v2/invites", json={"uses": 2}, headers={"apikey": moderator})
        assert made.status_code == 200, made.text
        timeout = {"ipaddr": "203.0.113.0/24", "hours": 1}
        timed = await http.post("/api/v2/operations/ipaddr", json=timeout, headers={"apikey": moderator})
        assert timed.status_code == 200, timed.text
        made = await http.put(
            "/api/v2/filters", json={"regex": "gr[ae]y", "filter_type": 20}, headers={"apikey": moderator}
        )
        assert made.status_code == 200, made.text
        hello = {"message": "Hi"}
        sent = await http.post("/api/v2/workers/messages", json=hello, headers={"apikey": moderator})
        assert sent.status_code == 200, sent.text


def _panels(dom: str) -> dict[str, str]:
    found = re.findall(
        r'<section class="panel[^"]*"[^>]*data-panel="([a-z]+)"([^>]*)>(.*?)</section>', dom, re.S
    )
    return {name: attrs + body for name, attrs, body in found}


async def test_the_page_shows_every_panel_in_a_browser(
    browser: str, served: str, db_url: str, tmp_path: Path
) -> None:
    await _traffic(served, db_url)
    profile = tmp_path / "chromium-profile"
    common = [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={profile}",
        "--virtual-time-budget=4000",
    ]  # fmt: skip
    url = f"{served}/dashboard"
    dumped = await asyncio.to_thread(
        subprocess.run, [*common, "--dump-dom", url], capture_output=True, text=True, timeout=60
    )
    dom = dumped.stdout
    assert dumped.returncode == 0, dumped.stderr[-3000:]
    assert "<main" in dom, dumped.stderr[-3000:]
    panels = _panels(dom)
    assert set(panels) == set(PANELS), sorted(panels)
    assert re.search(r'data-rounds="[1-9]', dom), "the refresh script did not complete a round"
    for name, html in panels.items():
        assert "data-updated=" in html, f"{name}: not refreshed"
        assert '<tr class="data' in html or re.search(r'<svg[^>]*>.*class="mark', html, re.S), name
    for name in ("queue", "shadow", "allowance", "candidates", "usage"):
        assert re.search(r'<svg[^>]*>.*class="mark', panels[name], re.S), f"{name}: no chart with data"
    assert "Output tokens per day" in panels["usage"]
    assert re.search(r'<tr class="data"><td>client#\d+</td>', panels["usage"]), "usage: no top user"
    assert "dash-alpha" in panels["fleet"]
    assert "dash-beta" in panels["fleet"]
    assert "refused" in panels["allowance"]
    assert "enforce_all" in panels["candidates"]

    shot = tmp_path / "dashboard.png"
    taken = await asyncio.to_thread(
        subprocess.run, [*common, f"--screenshot={shot}", "--window-size=1400,2400", url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert taken.returncode == 0, taken.stderr[-3000:]
    assert shot.exists(), taken.stderr[-3000:]
    assert shot.stat().st_size > 10_000, taken.stderr[-3000:]
    results = REPO / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    kind = "postgresql" if db_url.startswith("postgresql") else "sqlite"
    copy = results / ("dashboard.png" if kind == "sqlite" else f"dashboard-{kind}.png")
    shutil.copy(shot, copy)
    print(f"dashboard screenshot ({kind}): {shot} (copied to {copy})")


async def _make_moderator(db_url: str) -> str:
    """A moderator's key, created before the server starts (the server migrates nothing then)."""
    key = (await make_users(db_url, {"mod": 100}))["mod"]
    engine = make_engine(db_url, null_pool=True)
    try:
        async with make_sessionmaker(engine)() as session, session.begin():
            user = (await session.execute(select(User).where(User.username == "mod"))).scalar_one()
            await set_flags(session, user, trusted=None, moderator=True)
    finally:
        await engine.dispose()
    return key


async def test_a_moderator_signs_in_through_the_form_in_a_browser(
    browser: str, db_url: str, tmp_path: Path
) -> None:
    """The sign-in form as a person uses it: Chromium loads the page, the key is typed into the
    field and the button clicked; the browser sends what its Referrer-Policy lets it send (under
    `no-referrer`, `Origin: null`, which the origin check refuses) and keeps the session cookie it
    is given; then the panels show and refresh. Nothing is set that the browser would not send."""
    key = await _make_moderator(db_url)
    overrides: dict[str, dict[str, object]] = {
        "http": {"open_operator_pages": False},
        "lease": {"sweep_seconds": 0},
        "database": {"null_pool": True},
    }
    with running_server(db_url, overrides, tmp_path) as server:
        async with browser_page(browser, tmp_path / "chromium-profile") as page:
            await page.navigate(f"{server.base}/dashboard")
            assert await page.evaluate("!!document.querySelector('form[action=\"/dashboard/login\"]')")
            assert not await page.evaluate("!!document.querySelector('section.panel')")

            # A wrong key first: the form again, with its message.
            await page.click("#apikey")
            await page.type("not-a-key-at-all-xx")
            await page.click("button[type=submit]")
            await page.event("Page.loadEventFired")
            assert await page.until(
                "document.querySelector('.error') && document.querySelector('.error').textContent"
            )
            assert await page.evaluate("!!document.querySelector('#apikey')")

            await page.click("#apikey")
            await page.type(key)
            await page.click("button[type=submit]")
            await page.event("Page.loadEventFired")
            error = await page.evaluate(
                "document.querySelector('.error') && document.querySelector('.error').textContent"
            )
            assert not error, f"the sign-in was refused: {error}"
            names = await page.until(
                "(() => { const s = [...document.querySelectorAll('section.panel[data-panel]')];"
                " return s.length && s.map(e => e.dataset.panel); })()"
            )
            assert set(names) == set(PANELS), names
            assert "Sign out" in await page.evaluate("document.body.innerText")
            rounds = "document.querySelector('[data-rounds]')"
            assert await page.until(f"{rounds} && Number({rounds}.dataset.rounds) >= 1")
            assert await page.evaluate("document.cookie") == ""  # HttpOnly: no script reads the session
            assert key not in await page.evaluate("document.documentElement.outerHTML")
