"""The operational metrics on GET /metrics (docs/reference/metrics.md, "Operations"), over HTTP on
both databases: present on a fresh server, exact after traffic, each job's end counted once, the
gauges read at scrape time with the eligibility check's own "online", and bounded labels (route
templates, never paths; at most MODEL_SERIES_CAP named models)."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from horde_lite.metrics import ANY_MODEL, JOB_EVENTS, MODEL_SERIES_CAP, OTHER_MODELS, UNMATCHED_ROUTE
from tests.support.horde import ANON, HordeClient
from tests.support.prom import OPERATIONAL_FAMILIES, samples, value

A, B = "acme/a-12B", "acme/b-8B"
JOBS = "horde_text_jobs_total"
WAITING = "horde_text_waiting_requests"
TOKENS = "horde_text_queued_tokens"
ONLINE = "horde_workers_online"
HTTP = "http_server_request_duration_seconds_count"
STATUS_ROUTE = "/api/v2/generate/text/status/{request_id}"
LEGACY = {"max_length": 1024, "max_context_length": 4096}
CHAT = {"max_completion_tokens": 1024, "max_context_tokens": 4096}


def _series(text: str, name: str, *keys: str) -> dict[tuple[str, ...], float]:
    """The samples called `name`, keyed by the values of `keys`."""
    return {tuple(labels[k] for k in keys): v for n, labels, v in samples(text) if n == name}


def _jobs(text: str) -> dict[tuple[str, str], float]:
    return {key: v for key, v in _series(text, JOBS, "horde_event", "horde_chat").items() if v}


async def _create(client: HordeClient, key: str, **body: Any) -> str:
    response = await client.create(key, **body)
    assert response.status_code == 202, response.text
    return response.json()["id"]


async def _pop(client: HordeClient, key: str, name: str, **body: Any) -> dict[str, Any]:
    response = await client.pop(key, name, **body)
    assert response.status_code == 200, response.text
    return response.json()


async def test_a_fresh_server_shows_every_operational_family(client: HordeClient) -> None:
    first = await client.metrics()  # the server's very first request
    families = {f.name: f for f in text_string_to_metric_families(first)}
    for name, kind in OPERATIONAL_FAMILIES.items():
        assert name in families, f"{name} missing from a fresh server's /metrics"
        assert families[name].type == kind
    # Counters at 0 for each fixed label set; gauges with their "(other)" zero series only.
    assert _series(first, JOBS, "horde_event", "horde_chat") == {
        (event, chat): 0.0 for event in JOB_EVENTS for chat in ("false", "true")
    }
    assert _series(first, WAITING, "horde_model", "horde_chat") == {
        (OTHER_MODELS, "false"): 0.0,
        (OTHER_MODELS, "true"): 0.0,
    }
    assert _series(first, TOKENS, "horde_model", "horde_chat") == _series(
        first, WAITING, "horde_model", "horde_chat"
    )
    assert _series(first, ONLINE, "horde_model", "horde_worker_kind") == {
        (OTHER_MODELS, "chat"): 0.0,
        (OTHER_MODELS, "legacy"): 0.0,
    }
    # No request answered yet: the histogram is there with no sample.
    assert families["http_server_request_duration_seconds"].samples == []
    # The next scrape sees the first one, under its route.
    second = await client.metrics()
    assert value(second, HTTP) == 1
    assert (
        value(second, HTTP, http_route="/metrics", http_request_method="GET", http_response_status_code=200)
        == 1
    )


async def test_the_operational_numbers_after_traffic_are_exact(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=10_000, trusted=True)
    requester = await client.user("requester", kudos=10_000)
    calls: Counter[tuple[str, str, int]] = Counter()  # (route template, method, status) -> requests

    async def pop(name: str, **body: Any) -> dict[str, Any]:
        calls["/api/v2/generate/text/pop", "POST", 200] += 1
        return await _pop(client, owner, name, **body)

    async def create(key: str, **body: Any) -> str:
        calls["/api/v2/generate/text/async", "POST", 202] += 1
        return await _create(client, key, **body)

    async def submit(job: str, **body: Any) -> None:
        calls["/api/v2/generate/text/submit", "POST", 200] += 1
        assert (await client.submit(owner, job, **body)).status_code == 200

    async def scrape() -> str:
        text = await client.metrics()
        calls["/metrics", "GET", 200] += 1
        return text

    # Two workers check in (no job yet): a legacy one serving A, a chat one serving A and B.
    assert (await pop("legacy-w", models=[A], **LEGACY))["id"] is None
    assert (await pop("chat-w", models=[A, B], **LEGACY, chat=CHAT))["id"] is None

    r1 = await create(ANON, models=[A], params={"max_length": 100})
    r2 = await create(requester, models=[A], params={"max_length": 200, "n": 2})
    r3 = await create(requester, params={"max_length": 50})  # names no model
    r4 = await create(
        requester, models=[B], chat={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 300}
    )
    r5 = await create(requester, models=[A], params={"max_length": 80})
    assert (await client.cancel(r5)).status_code == 200  # cancelled before any job: not waiting
    calls[STATUS_ROUTE, "DELETE", 200] += 1

    before = await scrape()
    assert _series(before, WAITING, "horde_model", "horde_chat") == {
        (A, "false"): 2,  # r1, r2
        (ANY_MODEL, "false"): 1,  # r3
        (B, "true"): 1,  # r4
        (OTHER_MODELS, "false"): 0,
        (OTHER_MODELS, "true"): 0,
    }
    assert _series(before, TOKENS, "horde_model", "horde_chat") == {
        (A, "false"): 100 + 200 * 2,
        (ANY_MODEL, "false"): 50,
        (B, "true"): 300,
        (OTHER_MODELS, "false"): 0,
        (OTHER_MODELS, "true"): 0,
    }
    assert _series(before, ONLINE, "horde_model", "horde_worker_kind") == {
        (A, "legacy"): 1,
        (A, "chat"): 1,
        (B, "chat"): 1,
        (OTHER_MODELS, "chat"): 0,
        (OTHER_MODELS, "legacy"): 0,
    }
    assert _jobs(before) == {}

    # The legacy worker takes the four legacy jobs one pop each, the chat worker the chat job.
    by_length: dict[int, list[str]] = {}
    for _ in range(4):
        job = await pop("legacy-w", models=[A], **LEGACY)
        by_length.setdefault(job["payload"]["max_length"], []).append(job["id"])
    assert sorted((k, len(v)) for k, v in by_length.items()) == [(50, 1), (100, 1), (200, 2)]
    chat_job = await pop("chat-w", models=[A, B], **LEGACY, chat=CHAT)
    assert chat_job["kind"] == "chat"
    assert (await pop("legacy-w", models=[A], **LEGACY))["id"] is None  # nothing left for it
    assert value(await scrape(), WAITING) == 0  # every job handed out: nothing waiting

    await submit(by_length[100][0], text="hello")  # r1 done
    await submit(chat_job["id"], text="hi there")  # r4 done
    await submit(by_length[50][0], state="faulted")  # r3 waits again (for another worker)
    client.clock.advance(151)
    assert await client.sweep() == (2, 0)  # r2's two jobs lapse: r2 waits again, for both

    # Bad input and unknown paths: a template's 4xx, and one label for every unmatched path.
    missing = await client.status(str(uuid.uuid4()))
    assert missing.status_code == 404
    calls[STATUS_ROUTE, "GET", 404] += 1
    bad = await client.http.post("/api/v2/generate/text/submit", json={"id": 5}, headers={"apikey": owner})
    assert bad.status_code == 400
    calls["/api/v2/generate/text/submit", "POST", 400] += 1
    for path in (f"/api/v2/no/such/{r1}", "/nowhere"):
        assert (await client.http.get(path)).status_code == 404
        calls[UNMATCHED_ROUTE, "GET", 404] += 1
    assert (await client.http.request("BREW", "/metrics")).status_code == 405  # a method no route takes
    calls[UNMATCHED_ROUTE, "_OTHER", 405] += 1

    after = await client.metrics()
    assert _jobs(after) == {
        ("popped", "false"): 4,
        ("popped", "true"): 1,
        ("submitted", "false"): 1,
        ("submitted", "true"): 1,
        ("faulted", "false"): 1,
        ("aborted", "false"): 2,
    }
    assert _series(after, WAITING, "horde_model", "horde_chat") == {
        (A, "false"): 1,  # r2, both jobs given back
        (ANY_MODEL, "false"): 1,  # r3
        (OTHER_MODELS, "false"): 0,
        (OTHER_MODELS, "true"): 0,
    }
    assert value(after, TOKENS, horde_model=A) == 200 * 2
    assert value(after, TOKENS, horde_model=ANY_MODEL) == 50
    assert value(after, ONLINE) == 3  # still online 151 s later

    recorded = {
        (labels["http_route"], labels["http_request_method"], labels["http_response_status_code"]): v
        for name, labels, v in samples(after)
        if name == HTTP
    }
    assert recorded == {(route, method, str(status)): n for (route, method, status), n in calls.items()}
    for request_id in (r1, r2, r3, r4, r5):
        assert request_id not in after


async def test_each_job_end_is_counted_once(client: HordeClient) -> None:
    """A cancel does not end a running job (it still submits and is paid); a duplicate submit and
    a submit after the lease lapsed are refused and count nothing; a lapse is counted once whether
    a read or the sweep finds it."""
    owner = await client.user("owner", trusted=True)
    requester = await client.user("requester", kudos=1000)
    await _pop(client, owner, "w", models=[A], **LEGACY)
    cancelled = await _create(client, requester, models=[A], params={"max_length": 64})
    job = (await _pop(client, owner, "w", models=[A], **LEGACY))["id"]
    assert (await client.cancel(cancelled)).status_code == 200
    assert _jobs(await client.metrics()) == {("popped", "false"): 1}
    assert (await client.submit(owner, job, "still paid")).status_code == 200
    duplicate = await client.submit(owner, job, "again")
    assert duplicate.status_code == 400, duplicate.text
    assert _jobs(await client.metrics()) == {("popped", "false"): 1, ("submitted", "false"): 1}

    lapsing = await _create(client, requester, models=[A], params={"max_length": 32})
    job = (await _pop(client, owner, "w", models=[A], **LEGACY))["id"]
    client.clock.advance(151)
    assert (await client.status(lapsing)).status_code == 200  # the read honours the lapse
    assert await client.sweep() == (0, 0)  # nothing left for the sweep
    late = await client.submit(owner, job, "too late")
    assert late.status_code == 400, late.text
    assert late.json()["rc"] == "AbortedGen"
    assert _jobs(await client.metrics()) == {
        ("popped", "false"): 2,
        ("submitted", "false"): 1,
        ("aborted", "false"): 1,
    }


async def test_online_workers_follow_the_eligibility_rule(client: HordeClient) -> None:
    """A paused worker is online (its fake jobs count nothing), a deleted one never is, and one
    silent longer than `worker.online_seconds` drops out at the next scrape."""
    owner = await client.user("owner", trusted=True)
    moderator = await client.user("mod", moderator=True)
    requester = await client.user("requester", kudos=1000)
    for name in ("paused-w", "deleted-w", "quiet-w"):
        await _pop(client, owner, name, models=[A], **LEGACY)
    ids = {w["name"]: w["id"] for w in (await client.http.get("/api/v2/workers")).json()}
    paused = await client.http.put(
        f"/api/v2/workers/{ids['paused-w']}", json={"paused": True}, headers={"apikey": moderator}
    )
    assert paused.status_code == 200, paused.text
    deleted = await client.http.delete(f"/api/v2/workers/{ids['deleted-w']}", headers={"apikey": owner})
    assert deleted.status_code == 200, deleted.text
    assert value(await client.metrics(), ONLINE, horde_model=A, horde_worker_kind="legacy") == 2

    await _create(client, requester, models=[A], params={"max_length": 64})
    client.clock.advance(200)
    fake = await _pop(client, owner, "paused-w", models=[A], **LEGACY)
    assert fake["id"] is not None  # a fake job: nothing is claimed or counted
    client.clock.advance(200)  # quiet-w last checked in 400 s ago, paused-w 200 s ago
    text = await client.metrics()
    assert value(text, ONLINE, horde_model=A, horde_worker_kind="legacy") == 1
    assert value(text, WAITING, horde_model=A) == 1
    assert _jobs(text) == {}


async def test_model_labels_are_capped_and_the_rest_folded(client: HordeClient) -> None:
    owner = await client.user("owner", trusted=True)
    requester = await client.user("requester", kudos=1000)
    models = [f"m-{i:03d}" for i in range(MODEL_SERIES_CAP + 10)]
    await _pop(client, owner, "many", models=models, **LEGACY)
    # The busiest models keep their names: one with waiting requests comes before the others.
    last = models[-1]
    for _ in range(2):
        await _create(client, requester, models=[last], params={"max_length": 64})
    text = await client.metrics()
    online = _series(text, ONLINE, "horde_model", "horde_worker_kind")
    named = {model for model, _ in online} - {ANY_MODEL, OTHER_MODELS}
    assert len(named) == MODEL_SERIES_CAP
    assert named == {last, *models[: MODEL_SERIES_CAP - 1]}  # then by name
    assert online[OTHER_MODELS, "legacy"] == 10
    assert value(text, ONLINE) == len(models)  # folded, not lost
    assert _series(text, WAITING, "horde_model", "horde_chat")[last, "false"] == 2
