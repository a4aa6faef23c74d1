"""One guard (`moderator_guard`) for every route for moderators and operators: which routes carry
it, and each route's answers to whom it turns away, word for word."""

from __future__ import annotations

from litestar.routes import HTTPRoute
from litestar.testing import AsyncTestClient

from horde_lite.api.guards import moderator_guard
from horde_lite.clock import ManualClock
from tests.conftest import make_settings
from tests.support.apps import app_for
from tests.support.horde import ANON, HordeClient

# The dashboard's sign-in and sign-out and its static files are open: they are how one gets in.
OPEN = {"/dashboard/login", "/dashboard/logout"}


def test_every_operator_route_carries_the_guard(db_url: str) -> None:
    app = app_for(make_settings(db_url), ManualClock())
    guarded: set[str] = set()
    for route in app.routes:
        operator_paths = (
            "/operator", "/dashboard", "/api/v2/invites", "/api/v2/operations", "/api/v2/filters"
        )  # fmt: skip
        if not isinstance(route, HTTPRoute) or not route.path.startswith(operator_paths):
            continue
        if route.path in OPEN or route.path.startswith("/dashboard/static"):
            continue
        for handler in route.route_handlers:
            if "OPTIONS" in handler.http_methods:
                continue
            assert moderator_guard in handler.resolve_guards(), route.path
            guarded.add(route.path)
    assert guarded == {
        "/operator/policies", "/operator/decisions", "/dashboard", "/dashboard/panels/{name:str}",
        "/dashboard/invites",
        "/dashboard/invites/{invite:str}/revoke", "/api/v2/invites", "/api/v2/invites/{code:str}",
        "/dashboard/users/create",
        "/dashboard/users/{user_id:str}/kudos", "/dashboard/users/{user_id:str}/flags",
        "/dashboard/users/{user_id:str}/delete", "/dashboard/modes",
        "/api/v2/operations/ipaddr", "/api/v2/operations/ipaddr/{ipaddr:path}",
        "/api/v2/operations/block_worker_ipaddr/{worker_id:str}", "/dashboard/ip_timeouts",
        "/dashboard/ip_timeouts/lift", "/dashboard/ip_timeouts/block_worker",
        "/dashboard/filters", "/dashboard/filters/{filter_id:str}/delete", "/api/v2/filters",
        "/api/v2/filters/regex", "/api/v2/filters/{filter_id:str}",
        "/dashboard/messages", "/dashboard/messages/{message_id:str}/delete",
    }  # fmt: skip


async def test_each_route_answers_the_turned_away_as_before(client: HordeClient) -> None:
    ordinary = await client.user("someone")
    moderator = await client.user("mod", moderator=True)
    shared = (
        await client.http.post("/api/v2/sharedkeys", json={"kudos": 10}, headers={"apikey": moderator})
    ).json()["id"]
    http = client.http
    only_operators = "Only a moderator may read the operator pages."
    expected = {
        None: (403, "NotModerator", "Operator pages need a moderator's API key (apikey header)."),
        ANON: (403, "NotModerator", only_operators),
        "x" * 22: (401, "InvalidAPIKey", "No user matched the provided API key."),
        ordinary: (403, "NotModerator", only_operators),
        shared: (403, "NotModerator", only_operators),
    }
    for key, (status, rc, message) in expected.items():
        for path in ("/operator/policies", "/operator/decisions"):
            answer = await http.get(path, headers={"apikey": key} if key else {})
            assert (answer.status_code, answer.json()) == (status, {"message": message, "rc": rc}), key
    only_dashboard = "Only a moderator's own key opens the dashboard."
    expected_dashboard = {
        None: (401, "Sign in with a moderator's API key."),
        ANON: (401, "A moderator's API key is required."),
        "x" * 22: (401, "No user matched the provided API key."),
        ordinary: (403, only_dashboard),
        shared: (403, only_dashboard),
    }
    for key, (status, message) in expected_dashboard.items():
        headers = {"apikey": key} if key else {}
        page = await http.get("/dashboard", headers=headers)
        assert page.status_code == status, key
        assert page.headers["content-type"].startswith("text/html")
        assert message.replace("'", "&#39;") in page.text
        assert 'name="apikey"' in page.text  # the sign-in form
        fragment = await http.get("/dashboard/panels/fleet", headers=headers)
        assert (fragment.status_code, fragment.text) == (status, message), key
        assert fragment.headers["content-type"].startswith("text/plain")
        assert fragment.headers["x-frame-options"] == "DENY"
        signed_in = await http.post("/dashboard/login", data={"apikey": key or ""})
        assert signed_in.status_code == (401 if key is None else status), key
    assert (await http.get("/dashboard", headers={"apikey": moderator})).status_code == 200


async def test_open_operator_pages_open_every_guarded_route(db_url: str) -> None:
    opened = app_for(make_settings(db_url, http={"open_operator_pages": True}), ManualClock())
    async with AsyncTestClient(app=opened, timeout=30) as http:
        for path in ("/operator/policies", "/dashboard", "/dashboard/panels/fleet"):
            assert (await http.get(path)).status_code == 200, path
        # Routes that change things stay shut: invite codes, the dashboard's actions.
        assert (await http.get("/api/v2/invites")).status_code == 403
        assert (await http.post("/api/v2/invites", json={})).status_code == 403
        assert (await http.post("/dashboard/invites", data={"uses": "1", "days": "1"})).status_code == 401
