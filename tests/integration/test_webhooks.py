"""A request's webhook (on SQLite and PostgreSQL, through HTTP, to a real receiver on 127.0.0.1):
upstream's body POSTed once per finished generation, retried after a failure, given up after its
attempts, refused at admission for a URL that is not https or names a private address, refused at
delivery for a name that resolves to one, and never waited for by the worker's submit."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select

from horde_lite.clock import ManualClock
from horde_lite.db.models import TextRequest
from tests.conftest import make_settings
from tests.support.apps import app_for
from tests.support.hook_receiver import hook_receiver
from tests.support.horde import ANON, HordeClient
from tests.support.prom import value

# A receiver on 127.0.0.1 over plain http: both allowed here; the defaults refuse both.
LOCAL = {"allow_http": True, "allow_private": True, "retry_seconds": 0.05}

Horde = Callable[..., AbstractAsyncContextManager[HordeClient]]


@pytest.fixture
def horde_with(db_url: str, clock: ManualClock) -> Horde:
    """A horde with these [webhooks] settings."""

    @asynccontextmanager
    async def started(**webhooks: Any) -> AsyncIterator[HordeClient]:
        app = app_for(make_settings(db_url, webhooks=webhooks), clock)
        async with AsyncTestClient(app=app, timeout=30) as http:
            yield HordeClient(http, app.state.horde)

    return started


async def outcomes(client: HordeClient) -> dict[str, float]:
    text = await client.metrics()
    return {
        o: value(text, "horde_webhook_outcomes_total", outcome=o)
        for o in ("ok", "giveup", "dropped", "refused")
    }


async def pop(client: HordeClient, owner: str, amount: int = 1) -> list[str]:
    """The generation ids one pop of worker w1 takes."""
    job = (await client.pop(owner, "w1", models=["m"], amount=amount)).json()
    assert len(job["ids"]) == amount, job
    return list(job["ids"])


async def submit(client: HordeClient, owner: str, generation_id: str, number: int = 0) -> float:
    """Submit job `number`'s text, seed and metadata; its reward."""
    meta = [{"type": "info", "value": f"job {number}"}]
    answer = await client.submit(owner, generation_id, f"text {number}", seed=number + 7, gen_metadata=meta)
    assert answer.status_code == 200, answer.text
    return float(answer.json()["reward"])


async def serve(client: HordeClient, owner: str, amount: int = 1) -> list[tuple[str, float]]:
    """Pop the waiting request's jobs with one worker and submit each: (generation id, reward)."""
    return [(g, await submit(client, owner, g, n)) for n, g in enumerate(await pop(client, owner, amount))]


async def test_each_finished_generation_is_posted_with_upstreams_body(horde_with: Horde) -> None:
    async with horde_with(**LOCAL) as client, asyncio.timeout(20):
        owner = await client.user("owner")
        with hook_receiver() as receiver:
            # By name: delivered to the address it resolves to, still addressed to the name.
            hook = receiver.url("/h?x=1", host="localhost")
            created = await client.create(ANON, models=["m"], params={"n": 2}, webhook=hook)
            assert created.status_code == 202, created.text
            request_id = created.json()["id"]
            done = await serve(client, owner, amount=2)
            await client.horde.webhooks.idle()
        status = (await client.status(request_id)).json()
        worker_id = status["generations"][0]["worker_id"]
        assert {r.path for r in receiver.received} == {"/h?x=1"}
        for received in receiver.received:
            assert received.headers["Content-Type"] == "application/json"
            assert received.headers["Host"] == f"localhost:{receiver.port}"
        bodies = sorted((json.loads(r.body) for r in receiver.received), key=lambda b: b["seed"])
        assert bodies == [
            {"text": f"text {n}", "seed": n + 7, "worker_id": worker_id, "worker_name": "w1", "model": "m",
             "id": generation_id, "state": "ok", "gen_metadata": [{"type": "info", "value": f"job {n}"}],
             "request": request_id, "kudos": reward}
            for n, (generation_id, reward) in enumerate(done)
        ]  # fmt: skip
        assert await outcomes(client) == {"ok": 2, "giveup": 0, "dropped": 0, "refused": 0}


async def test_a_failed_attempt_is_retried_and_a_receiver_that_keeps_failing_is_given_up(
    horde_with: Horde,
) -> None:
    async with horde_with(**LOCAL, attempts=3) as client, asyncio.timeout(20):
        owner = await client.user("owner")
        with hook_receiver(statuses=[500]) as flaky, hook_receiver(statuses=[503, 500, 404]) as broken:
            for receiver in (flaky, broken):
                await client.create(ANON, models=["m"], webhook=receiver.url())
                await serve(client, owner)
            await client.horde.webhooks.idle()
        assert len(flaky.received) == 2  # the failure, then the retry that delivered it
        assert flaky.received[0].body == flaky.received[1].body
        assert len(broken.received) == 3  # every attempt, then given up
        assert await outcomes(client) == {"ok": 1, "giveup": 1, "dropped": 0, "refused": 0}


async def test_a_name_that_resolves_to_a_private_address_is_refused_at_delivery(horde_with: Horde) -> None:
    async with horde_with(allow_http=True, retry_seconds=0.05) as client, asyncio.timeout(20):
        owner = await client.user("owner")
        with hook_receiver() as receiver:
            # Admission cannot judge a name; "localhost" resolves to loopback addresses.
            created = await client.create(ANON, models=["m"], webhook=receiver.url(host="localhost"))
            assert created.status_code == 202, created.text
            await serve(client, owner)
            await client.horde.webhooks.idle()
            for literal in ("127.0.0.1", "[::1]"):  # a literal address is refused at once
                refused = await client.create(ANON, webhook=receiver.url(host=literal))
                assert refused.status_code == 400
                assert "loopback address" in refused.json()["errors"]["webhook"]
        assert receiver.received == []  # not one attempt reached it
        assert await outcomes(client) == {"ok": 0, "giveup": 0, "dropped": 0, "refused": 1}


async def test_the_submit_never_waits_and_a_full_queue_drops_and_counts(horde_with: Horde) -> None:
    async with (
        horde_with(**LOCAL, queue_size=1, senders=1, timeout_seconds=20) as client,
        asyncio.timeout(30),
    ):
        owner = await client.user("owner")
        with hook_receiver(holding=True) as slow:
            request_id = (
                await client.create(ANON, models=["m"], params={"n": 3}, webhook=slow.url())
            ).json()["id"]
            first, second, third = await pop(client, owner, amount=3)
            await submit(client, owner, first)
            # The submit has been answered; the receiver got its POST and has not answered it, and
            # the delivery has not ended: the submit did not wait for it.
            assert await asyncio.to_thread(slow.arrived.wait, 10)
            assert not slow.answered.is_set()
            assert await outcomes(client) == {"ok": 0, "giveup": 0, "dropped": 0, "refused": 0}
            await submit(client, owner, second)  # the one sender holds the first: this one waits
            await submit(client, owner, third)  # in a full queue: dropped
            assert (await outcomes(client))["dropped"] == 1
            assert (await client.status(request_id)).json()["done"] is True
            slow.hold.set()
            await client.horde.webhooks.idle()
        assert len(slow.received) == 2
        assert await outcomes(client) == {"ok": 2, "giveup": 0, "dropped": 1, "refused": 0}


# --- admission --------------------------------------------------------------------------------------

REFUSED_URLS = {
    "http://example.com/hook": "https endpoint",
    "ftp://example.com/hook": "https endpoint",
    "example.com/hook": "https endpoint",
    "https:///hook": "names no host",
    "https://exa mple.com/": "spaces",
    "https://example.com:99999/": "port 99999",
    "https://a%2Fb/": "neither a host name",
    "https://xn--/": "not a URL",  # an IDNA label that does not decode
    "https://127.0.0.1/": "loopback",
    "https://127.1/": "loopback",
    "https://2130706433/": "loopback",
    "https://[::1]:8443/": "loopback",
    "https://0.0.0.0/": "unspecified",
    "https://10.1.2.3/": "private",
    "https://192.168.0.1/": "private",
    "https://169.254.169.254/latest/meta-data": "link-local",
    "https://[fe80::1]/": "link-local",
    "https://224.0.0.1/": "multicast",
    "https://240.0.0.1/": "reserved",
    "https://100.64.0.1/": "not public",
    "https://[fd00::1]/": "private",
    "https://[::ffff:127.0.0.1]/": "carries the loopback address 127.0.0.1",
    "https://[2002:a00:1::]/": "carries the private address 10.0.0.1",
    "https://[64:ff9b::a9fe:a9fe]/": "carries the link-local address 169.254.169.254",
    "https://example.com/" + "a" * 1005: "longer than 1024",
}


async def test_a_webhook_is_checked_at_admission_and_a_refusal_keeps_nothing(client: HordeClient) -> None:
    key = await client.user("alice", kudos=100)
    for url, reason in REFUSED_URLS.items():
        for dry_run in (False, True):
            refused = await client.create(key, webhook=url, dry_run=dry_run)
            assert refused.status_code == 400, (url, refused.text)
            body = refused.json()
            assert body["rc"] == "BadRequest"
            assert reason in body["errors"]["webhook"], (url, body)
            assert body["message"].startswith("webhook: ")
    async with client.horde.sessionmaker() as session:
        assert (await session.execute(select(func.count(TextRequest.id)))).scalar_one() == 0
    longest = "https://example.com/" + "a" * 1004
    for url in (
        "https://example.com/hook?token=x#y",
        "https://8.8.8.8/",
        "https://[2001:4860:4860::8888]/",
        longest,
    ):
        accepted = await client.create(key, webhook=url)
        assert accepted.status_code == 202, (url, accepted.text)
    async with client.horde.sessionmaker() as session:
        kept = set((await session.execute(select(TextRequest.webhook))).scalars())
    assert longest in kept
    assert "https://8.8.8.8/" in kept
