"""/status/performance, /status/modes, /status/news, /status/models/{name} and /stats/text/*
(docs/reference/horde_api.md), with horde-sdk's own models parsing the answers."""

from __future__ import annotations

from horde_sdk.ai_horde_api.apimodels import (
    HordePerformanceResponse,
    HordeStatusModelsSingleResponse,
    NewsResponse,
    TextStatsModelResponse,
    TextStatsModelsTotalResponse,
)

from tests.support.horde import ANON, HordeClient

MODEL = "koboldcpp/Some-Model-12B"


async def _finish_one(client: HordeClient, worker_key: str, requester: str, text: str) -> None:
    await client.create(requester, models=[MODEL], params={"max_length": 64})
    job = (await client.pop(worker_key, "w1", models=[MODEL], max_length=512)).json()
    assert job["id"] is not None
    assert (await client.submit(worker_key, job["id"], text)).status_code == 200


async def test_performance(client: HordeClient) -> None:
    empty = await client.http.get("/api/v2/status/performance")
    assert empty.status_code == 200
    parsed = HordePerformanceResponse.model_validate(empty.json())
    assert parsed.queued_text_requests == 0
    assert parsed.text_worker_count == 0
    # Upstream's image fields are there, as zeros.
    assert (parsed.worker_count, parsed.queued_requests, parsed.queued_megapixelsteps) == (0, 0, 0)

    worker = await client.user("owner")
    requester = await client.user("requester", kudos=1000)
    await client.pop(worker, "w1", models=[MODEL], threads=3)
    await _finish_one(client, worker, requester, "word " * 10)
    await client.create(requester, models=[MODEL], params={"max_length": 100, "n": 2})
    await client.pop(worker, "w1", models=[MODEL])  # one of its two jobs runs
    body = (await client.http.get("/api/v2/status/performance")).json()
    assert body["queued_text_requests"] == 1
    assert body["queued_tokens"] == 200  # one job waiting, one running, 100 tokens each
    assert (body["text_worker_count"], body["text_thread_count"]) == (1, 1)  # the last pop: 1 thread
    assert body["past_minute_tokens"] > 0
    client.clock.advance(61)
    assert (await client.http.get("/api/v2/status/performance")).json()["past_minute_tokens"] == 0


async def test_modes_and_news(client: HordeClient) -> None:
    modes = await client.http.get("/api/v2/status/modes")
    assert modes.status_code == 200
    assert modes.json() == {"maintenance_mode": False, "invite_only_mode": False}
    moderator = await client.user("mod", moderator=True)
    as_mod = (await client.http.get("/api/v2/status/modes", headers={"apikey": moderator})).json()
    assert as_mod == {"maintenance_mode": False, "invite_only_mode": False, "raid_mode": False}
    user = await client.user("plain")
    for key, status in ((user, 403), (ANON, 403), ("x" * 22, 401)):
        assert (await client.http.get("/api/v2/status/modes", headers={"apikey": key})).status_code == status
    news = await client.http.get("/api/v2/status/news")
    assert news.status_code == 200
    assert news.json() == []
    NewsResponse.model_validate(news.json())


async def test_single_model_status(client: HordeClient) -> None:
    key = await client.user("owner")
    await client.pop(key, "w1", models=[MODEL, "other"])
    one = await client.http.get(f"/api/v2/status/models/{MODEL}")
    assert one.status_code == 200, one.text
    parsed = HordeStatusModelsSingleResponse.model_validate(one.json())
    assert [(m.name, m.count) for m in parsed] == [(MODEL, 1)]
    assert one.json()[0]["type"] == "text"
    assert (await client.http.get("/api/v2/status/models/unknown")).json() == []
    assert (await client.http.get("/api/v2/status/models/%00")).status_code == 400  # NUL: refused
    assert len((await client.http.get("/api/v2/status/models")).json()) == 2


async def test_text_stats(client: HordeClient) -> None:
    totals = await client.http.get("/api/v2/stats/text/totals")
    assert totals.status_code == 200
    zero = {"requests": 0, "tokens": 0}
    assert totals.json() == {p: zero for p in ("minute", "hour", "day", "month", "total")}
    TextStatsModelsTotalResponse.model_validate(totals.json())
    models = await client.http.get("/api/v2/stats/text/models")
    assert models.json() == {"day": {}, "month": {}, "total": {}}

    worker = await client.user("owner")
    requester = await client.user("requester", kudos=1000)
    await _finish_one(client, worker, requester, "one two three")
    client.clock.advance(7200)
    await _finish_one(client, worker, requester, "four five six seven")
    body = (await client.http.get("/api/v2/stats/text/totals")).json()
    TextStatsModelsTotalResponse.model_validate(body)
    assert body["minute"]["requests"] == 1
    assert body["hour"]["requests"] == 1
    assert body["day"]["requests"] == 2
    assert body["total"]["requests"] == 2
    assert body["day"]["tokens"] == body["total"]["tokens"] > body["hour"]["tokens"] > 0
    per_model = (await client.http.get("/api/v2/stats/text/models")).json()
    TextStatsModelResponse.model_validate(per_model)
    assert per_model == {"day": {MODEL: 2}, "month": {MODEL: 2}, "total": {MODEL: 2}}
    # Requests and their jobs are removed at expiry; the all-time total stays (workers' counters).
    client.clock.advance(30 * 86400)
    await client.sweep()
    later = (await client.http.get("/api/v2/stats/text/totals")).json()
    assert later["month"] == zero
    assert later["total"]["requests"] == 2
