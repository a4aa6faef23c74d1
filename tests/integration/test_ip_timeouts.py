"""Address timeouts and worker blocks, over HTTP on both databases: a timed-out address is refused
on both faces (and on the worker routes) until its timeout ends, a CIDR and an IPv6 /64 cover their
networks, a worker block shuts that worker's pops out, a lift or the clock ends them, and bad input
is a 400 that stores nothing.

Callers get their address as behind a reverse proxy: the app is wrapped in uvicorn's own
`ProxyHeadersMiddleware` trusting the test client, as `horde-lite run` trusts
`--forwarded-allow-ips`, so `X-Forwarded-For` names each call's client address."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, insert, select
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from horde_lite.clock import ManualClock
from horde_lite.db.models import IpTimeout, TextRequest, Worker
from horde_lite.operators.ip_timeouts import MOST_LIVE
from tests.conftest import make_settings
from tests.support.apps import app_for
from tests.support.horde import ANON, HordeClient
from tests.support.statements import statements_sent

TIMEOUTS = "/api/v2/operations/ipaddr"
BLOCK = "/api/v2/operations/block_worker_ipaddr"
CHAT = {"max_completion_tokens": 512, "max_context_tokens": 4096}
HI = [{"role": "user", "content": "Hello"}]


@asynccontextmanager
async def behind_a_proxy(app: Litestar) -> AsyncIterator[HordeClient]:
    async with AsyncTestClient(
        app=ProxyHeadersMiddleware(app, trusted_hosts="testclient"), timeout=30
    ) as http:  # type: ignore[arg-type]
        yield HordeClient(http, app.state.horde)


def make_app(db_url: str, clock: ManualClock | None = None, **tables: dict[str, object]) -> Litestar:
    return app_for(make_settings(db_url, **tables), clock or ManualClock())


@pytest.fixture
async def edge(db_url: str) -> AsyncIterator[HordeClient]:
    async with behind_a_proxy(make_app(db_url)) as client:
        yield client


def by(address: str, key: str = ANON) -> dict[str, str]:
    return {"X-Forwarded-For": address, "apikey": key}


async def create(client: HordeClient, address: str, key: str = ANON, **body: Any) -> httpx.Response:
    return await client.http.post(
        "/api/v2/generate/text/async", json={"prompt": "Hello there.", **body}, headers=by(address, key)
    )


async def pop(client: HordeClient, address: str, key: str, name: str, **body: Any) -> httpx.Response:
    return await client.http.post(
        "/api/v2/generate/text/pop", json={"name": name, **body}, headers=by(address, key)
    )


async def time_out(client: HordeClient, moderator: str, ipaddr: str, hours: int = 1) -> None:
    answer = await client.http.post(
        TIMEOUTS, json={"ipaddr": ipaddr, "hours": hours}, headers={"apikey": moderator}
    )
    assert (answer.status_code, answer.json()) == (200, {"message": "OK"}), answer.text


async def listed(client: HordeClient, moderator: str, path: str = TIMEOUTS) -> list[dict[str, Any]]:
    answer = await client.http.get(path, headers={"apikey": moderator})
    assert answer.status_code == 200, answer.text
    result: list[dict[str, Any]] = answer.json()
    return result


def refused(answer: httpx.Response, seconds: int | None = None) -> None:
    assert answer.status_code == 403, answer.text
    body = answer.json()
    assert body["rc"] == "TimeoutIP", body
    assert body["message"].startswith("Due to abuse prevention, your IP address has been put into timeout")
    if seconds is not None:
        assert f"for {seconds} more seconds" in body["message"], body


def refused_v1(answer: httpx.Response) -> None:
    assert answer.status_code == 403, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["code"]) == ("permission_error", "ip_timeout"), error
    assert "timeout" in error["message"]


async def stored(client: HordeClient) -> tuple[int, int]:
    """(requests, timeouts) in the database."""
    async with client.horde.sessionmaker() as session:
        requests = (await session.execute(select(func.count()).select_from(TextRequest))).scalar_one()
        timeouts = (await session.execute(select(func.count()).select_from(IpTimeout))).scalar_one()
    return requests, timeouts


async def test_a_timed_out_address_is_refused_on_both_faces_until_its_timeout_ends(edge: HordeClient) -> None:
    mod = await edge.user("mod", moderator=True)
    owner = await edge.user("owner")
    assert (await pop(edge, "192.0.2.50", owner, "chat", models=["m"], chat=CHAT)).status_code == 200
    await time_out(edge, mod, "203.0.113.7", hours=1)
    refused(await create(edge, "203.0.113.7"), seconds=3600)
    refused(await create(edge, "203.0.113.7", dry_run=True), seconds=3600)
    refused(await create(edge, "203.0.113.7", key="x" * 22))  # before the key is even read
    chat = {"model": "m", "messages": HI, "dry_run": True}
    refused_v1(await edge.http.post("/v1/chat/completions", json=chat, headers=by("203.0.113.7")))
    completion = {"model": "m", "prompt": "Hi"}
    refused_v1(await edge.http.post("/v1/completions", json=completion, headers=by("203.0.113.7")))
    assert await stored(edge) == (0, 1)
    # Its neighbours are served; so is everyone once the hour is over.
    assert (await create(edge, "203.0.113.8", dry_run=True)).status_code == 200
    assert (
        await edge.http.post("/v1/chat/completions", json=chat, headers=by("203.0.113.8"))
    ).status_code == 200
    edge.clock.advance(1800)
    refused(await create(edge, "203.0.113.7"), seconds=1800)
    assert await listed(edge, mod) == [{"ipaddr": "203.0.113.7", "seconds": 1800}]
    edge.clock.advance(1800)
    assert (await create(edge, "203.0.113.7")).status_code == 202
    assert (
        await edge.http.post("/v1/chat/completions", json=chat, headers=by("203.0.113.7"))
    ).status_code == 200
    assert await listed(edge, mod) == []


async def test_a_cidr_and_an_ipv6_address_time_out_their_networks_until_lifted(edge: HordeClient) -> None:
    mod = await edge.user("mod", moderator=True)
    await time_out(edge, mod, "198.51.100.77/24", hours=2)  # host bits cleared: the /24
    await time_out(edge, mod, "2001:db8:1:2::5")  # a single IPv6 address: its /64
    for inside in (
        "198.51.100.0",
        "198.51.100.255",
        "::ffff:198.51.100.3",
        "2001:db8:1:2:ffff:ffff:ffff:ffff",
    ):
        refused(await create(edge, inside, dry_run=True))
    for outside in ("198.51.101.0", "198.51.99.255", "2001:db8:1:3::", "2001:db8:1:1:ffff::1", "::1"):
        assert (await create(edge, outside, dry_run=True)).status_code == 200, outside
    assert await listed(edge, mod) == [
        {"ipaddr": "198.51.100.0/24", "seconds": 7200},
        {"ipaddr": "2001:db8:1:2::/64", "seconds": 3600},
    ]
    # What covers an address or overlaps a network, its slash sent as is or encoded.
    assert await listed(edge, mod, f"{TIMEOUTS}/198.51.100.9") == [
        {"ipaddr": "198.51.100.0/24", "seconds": 7200}
    ]
    assert await listed(edge, mod, f"{TIMEOUTS}/198.51.100.128/25") == [
        {"ipaddr": "198.51.100.0/24", "seconds": 7200}
    ]
    assert await listed(edge, mod, f"{TIMEOUTS}/198.51.0.0%2F16") == [
        {"ipaddr": "198.51.100.0/24", "seconds": 7200}
    ]
    assert await listed(edge, mod, f"{TIMEOUTS}/2001:db8:1:2::9") == [
        {"ipaddr": "2001:db8:1:2::/64", "seconds": 3600}
    ]
    assert await listed(edge, mod, f"{TIMEOUTS}/203.0.113.1") == []
    # Setting a network again replaces its timeout; lifting takes what the same text covers.
    await time_out(edge, mod, "198.51.100.0/24", hours=1)
    assert (await listed(edge, mod))[0] == {"ipaddr": "198.51.100.0/24", "seconds": 3600}
    for lifted in ("198.51.100.0/24", "2001:db8:1:2::77"):
        answer = await edge.http.request("DELETE", TIMEOUTS, json={"ipaddr": lifted}, headers={"apikey": mod})
        assert (answer.status_code, answer.json()) == (200, {"message": "OK"}), answer.text
    assert (await create(edge, "198.51.100.3", dry_run=True)).status_code == 200
    assert (await create(edge, "2001:db8:1:2::5", dry_run=True)).status_code == 200
    assert await stored(edge) == (0, 0)
    # Lifting what has no timeout is OK, as upstream.
    again = await edge.http.request(
        "DELETE", TIMEOUTS, json={"ipaddr": "198.51.100.0/24"}, headers={"apikey": mod}
    )
    assert (again.status_code, again.json()) == (200, {"message": "OK"})


async def test_a_worker_block_shuts_out_the_address_it_last_popped_from(edge: HordeClient) -> None:
    mod = await edge.user("mod", moderator=True)
    owner = await edge.user("owner")
    assert (await pop(edge, "192.0.2.10", owner, "w1")).status_code == 200
    worker_id = (await edge.http.get("/api/v2/workers/name/w1")).json()["id"]
    request_id = (await create(edge, "198.51.100.1")).json()["id"]
    job = (await pop(edge, "192.0.2.10", owner, "w1")).json()
    assert job["id"] is not None
    blocked = await edge.http.put(f"{BLOCK}/{worker_id}", json={"days": 2}, headers={"apikey": mod})
    assert (blocked.status_code, blocked.json()) == (200, {"message": "OK"}), blocked.text
    assert await listed(edge, mod) == [{"ipaddr": "192.0.2.10", "seconds": 2 * 86400}]
    # Its pops, submits and progress posts are refused; so is a request from there.
    refused(await pop(edge, "192.0.2.10", owner, "w1"))
    submit = {"id": job["id"], "generation": "done", "state": "ok"}
    refused(
        await edge.http.post("/api/v2/generate/text/submit", json=submit, headers=by("192.0.2.10", owner))
    )
    progress = {"id": job["id"], "seq": 1, "text": "d"}
    refused(
        await edge.http.post("/api/v2/generate/text/progress", json=progress, headers=by("192.0.2.10", owner))
    )
    refused(await create(edge, "192.0.2.10", dry_run=True))
    # From another address the worker works, and that address becomes its last.
    done = await edge.http.post("/api/v2/generate/text/submit", json=submit, headers=by("192.0.2.11", owner))
    assert done.status_code == 200, done.text
    assert (await edge.status(request_id)).json()["done"] is True
    assert (await pop(edge, "192.0.2.11", owner, "w1")).status_code == 200
    assert await worker_address(edge, "w1") == "192.0.2.11"
    # Lifting the block lifts the timeout it made, though the worker has moved since.
    lifted = await edge.http.delete(f"{BLOCK}/{worker_id}", headers={"apikey": mod})
    assert (lifted.status_code, lifted.json()) == (200, {"message": "OK"}), lifted.text
    assert await listed(edge, mod) == []
    assert (await pop(edge, "192.0.2.10", owner, "w1")).status_code == 200
    # A worker popping over IPv6 is blocked by its /64, for the days asked, then served again.
    assert (await pop(edge, "2001:db8:5:6::1", owner, "w1")).status_code == 200
    await edge.http.put(f"{BLOCK}/{worker_id}", json={"days": 1}, headers={"apikey": mod})
    assert await listed(edge, mod) == [{"ipaddr": "2001:db8:5:6::/64", "seconds": 86400}]
    refused(await pop(edge, "2001:db8:5:6:aaaa::2", owner, "w1"))
    edge.clock.advance(86400)
    assert (await pop(edge, "2001:db8:5:6:aaaa::2", owner, "w1")).status_code == 200


async def worker_address(client: HordeClient, name: str) -> str | None:
    async with client.horde.sessionmaker() as session:
        found: str | None = (
            await session.execute(select(Worker.ipaddr).where(Worker.name == name))
        ).scalar_one()
    return found


async def test_the_address_is_written_with_the_check_in_and_the_check_reads_nothing(db_url: str) -> None:
    """A pop from a new address writes it in the check-in's one UPDATE; an idle pop from the same
    address writes nothing; a check reads no database once the process holds its copy."""
    app = make_app(db_url, policies={"reload_seconds": 3600})
    async with behind_a_proxy(app) as client:
        owner = await client.user("owner")
        assert (await pop(client, "192.0.2.1", owner, "w1")).status_code == 200
        assert await worker_address(client, "w1") == "192.0.2.1"
        with statements_sent(client.horde.engine, timed=True) as sent:
            assert (await pop(client, "192.0.2.1", owner, "w1")).status_code == 200
            assert (await create(client, "192.0.2.1", dry_run=True)).status_code == 200
        assert not [s.statement for s in sent if s.statement.lstrip().upper().startswith("UPDATE")]
        assert not [s.statement for s in sent if "ip_timeouts" in s.statement]
        with statements_sent(client.horde.engine, timed=True) as sent:
            assert (await pop(client, "2001:db8::1", owner, "w1")).status_code == 200
        updates = [s.statement for s in sent if s.statement.lstrip().upper().startswith("UPDATE")]
        assert len(updates) == 1, updates
        assert "ipaddr" in updates[0], updates
        assert "last_check_in" in updates[0], updates
        assert await worker_address(client, "w1") == "2001:db8::1"
        # A pop with no IP address (a Unix socket, a proxy naming none) keeps the last one.
        assert (await client.pop(owner, "w1")).status_code == 200
        assert await worker_address(client, "w1") == "2001:db8::1"


async def test_a_process_reads_the_timeouts_before_its_first_check(db_url: str) -> None:
    """Two server processes on one database: a timeout set through one refuses the address in the
    other, which reads the live timeouts before it checks anyone."""
    clock = ManualClock()
    async with behind_a_proxy(make_app(db_url, clock)) as first:
        mod = await first.user("mod", moderator=True)
        await time_out(first, mod, "203.0.113.0/24", hours=3)
        async with behind_a_proxy(make_app(db_url, clock)) as second:
            refused(await create(second, "203.0.113.200"), seconds=3 * 3600)
            assert (await create(second, "203.0.114.1", dry_run=True)).status_code == 200


HOSTILE_ADDRESSES = [
    "",
    " ",
    "not-an-ip",
    "203.0.113.7 ",
    " 203.0.113.7",
    "203.0.113.256",
    "203.0.113",
    "010.0.0.1",
    "203.0.113.0/33",
    "203.0.113.0/-1",
    "203.0.113.0/",
    "203.0.113.0/+8",
    "203.0.113.0/08x",
    "/24",
    "0.0.0.0/0",
    "::/0",
    "10.0.0.0/7",
    "2001:db8::/31",
    "::ffff:0:0/95",
    "fe80::1%eth0",
    "\uff11.2.3.4",
    "1.2.3.4\x00",
    "1" * 49,
    "1.2.3.4/" + "9" * 4400,
    "2001:db8::1/129",
]


async def test_hostile_inputs_are_refused_and_store_nothing(edge: HordeClient) -> None:
    mod = await edge.user("mod", moderator=True)
    owner = await edge.user("owner")
    moderator = {"apikey": mod}
    for address in HOSTILE_ADDRESSES:
        for method in ("POST", "DELETE"):
            answer = await edge.http.request(
                method, TIMEOUTS, json={"ipaddr": address, "hours": 1}, headers=moderator
            )
            if method == "DELETE":  # DELETE takes `ipaddr` alone: `hours` is unknown there
                answer = await edge.http.request(
                    method, TIMEOUTS, json={"ipaddr": address}, headers=moderator
                )
            assert answer.status_code == 400, (method, address, answer.text)
            assert answer.json()["rc"] == "BadRequest", answer.json()
    for hours in (0, -1, 721, 2**31, 10**30, 1.5, "1", True, None):
        answer = await edge.http.post(
            TIMEOUTS, json={"ipaddr": "203.0.113.7", "hours": hours}, headers=moderator
        )
        assert (answer.status_code, answer.json()["rc"]) == (400, "BadRequest"), (hours, answer.text)
    for body in (
        {},
        {"ipaddr": "203.0.113.7"},
        {"hours": 1},
        {"ipaddr": "203.0.113.7", "hours": 1, "extra": 1},
        [],
    ):
        answer = await edge.http.post(TIMEOUTS, json=body, headers=moderator)
        assert (answer.status_code, answer.json()["rc"]) == (400, "BadRequest"), (body, answer.text)
    for path in ("not-an-ip", "1.2.3.4%2F33", "%00", "1.2.3.4/x"):
        answer = await edge.http.get(f"{TIMEOUTS}/{path}", headers=moderator)
        assert (answer.status_code, answer.json()["rc"]) == (400, "BadRequest"), (path, answer.text)
    # Worker blocks: days out of range, an unknown worker, a worker with no address recorded.
    assert (await edge.pop(owner, "unaddressed")).status_code == 200  # the test client's name is no IP
    worker_id = (await edge.http.get("/api/v2/workers/name/unaddressed")).json()["id"]
    for days in (0, -1, 31, 10**30, 1.5, None):
        answer = await edge.http.put(f"{BLOCK}/{worker_id}", json={"days": days}, headers=moderator)
        assert (answer.status_code, answer.json()["rc"]) == (400, "BadRequest"), (days, answer.text)
    no_address = await edge.http.put(f"{BLOCK}/{worker_id}", json={"days": 1}, headers=moderator)
    assert (no_address.status_code, no_address.json()["rc"]) == (400, "BadRequest"), no_address.text
    for missing in ("00000000-0000-4000-8000-000000000000", "x" * 5000):
        for method, body in (("PUT", {"days": 1}), ("DELETE", None)):
            answer = await edge.http.request(method, f"{BLOCK}/{missing}", json=body, headers=moderator)
            assert (answer.status_code, answer.json()["rc"]) == (404, "WorkerNotFound"), answer.text
    assert await stored(edge) == (0, 0)
    assert await listed(edge, mod) == []


@pytest.mark.slow
async def test_only_a_moderators_own_key_reaches_the_routes_even_on_open_pages(db_url: str) -> None:
    async with behind_a_proxy(make_app(db_url, http={"open_operator_pages": True})) as client:
        ordinary = await client.user("someone")
        await client.pop(ordinary, "w1")
        worker_id = (await client.http.get("/api/v2/workers/name/w1")).json()["id"]
        calls = [
            ("GET", TIMEOUTS, None),
            ("POST", TIMEOUTS, {"ipaddr": "203.0.113.7", "hours": 1}),
            ("DELETE", TIMEOUTS, {"ipaddr": "203.0.113.7"}),
            ("GET", f"{TIMEOUTS}/203.0.113.7", None),
            ("PUT", f"{BLOCK}/{worker_id}", {"days": 1}),
            ("DELETE", f"{BLOCK}/{worker_id}", None),
        ]
        for key in (None, ANON, ordinary):
            for method, path, body in calls:
                headers = {"apikey": key} if key else {}
                answer = await client.http.request(method, path, json=body, headers=headers)
                assert (answer.status_code, answer.json()["rc"]) == (403, "NotModerator"), (key, method, path)
        assert await stored(client) == (0, 0)


async def test_the_horde_holds_a_bounded_number_of_live_timeouts(edge: HordeClient) -> None:
    """Past `MOST_LIVE` live timeouts a new one is refused; replacing one still works, and expired
    ones make room (they are dropped by the change that finds them)."""
    mod = await edge.user("mod", moderator=True)
    now = edge.clock.now()
    rows = [
        {"network": f"10.{i // 256}.{i % 256}.0/24", "expires_at": now + 60 * (1 + i % 2), "created_at": now}
        for i in range(MOST_LIVE)
    ]
    async with edge.horde.transaction() as session:
        await session.execute(insert(IpTimeout), rows)
    full = await edge.http.post(TIMEOUTS, json={"ipaddr": "203.0.113.7", "hours": 1}, headers={"apikey": mod})
    assert (full.status_code, full.json()["rc"]) == (400, "BadRequest"), full.text
    assert f"{MOST_LIVE} live timeouts" in full.json()["message"]
    await time_out(edge, mod, "10.0.1.0/24", hours=2)  # a replacement
    assert await stored(edge) == (0, MOST_LIVE)
    edge.clock.advance(61)  # half of them end
    await time_out(edge, mod, "203.0.113.7")
    assert await stored(edge) == (0, MOST_LIVE // 2 + 1)


async def test_a_timed_out_address_registers_no_account(db_url: str) -> None:
    """Open registration: the timed-out address gets no account through the API or the page; its
    neighbour does."""
    async with behind_a_proxy(make_app(db_url, accounts={"registration": "open"})) as client:
        mod = await client.user("mod", moderator=True)
        await time_out(client, mod, "203.0.113.7")
        headers = {"X-Forwarded-For": "203.0.113.7"}
        refused(await client.http.post("/api/v2/register", json={"username": "abuser"}, headers=headers))
        page = await client.http.post("/register", data={"username": "abuser"}, headers=headers)
        assert page.status_code == 403, page.text
        assert "your IP address has been put into timeout" in page.text
        made = await client.http.post(
            "/api/v2/register", json={"username": "neighbour"}, headers={"X-Forwarded-For": "203.0.113.8"}
        )
        assert made.status_code == 200, made.text
        names = (await client.http.get("/api/v2/users", headers={"apikey": mod})).json()
        assert sorted(u["username"].split("#")[0] for u in names) == ["mod", "neighbour"]
