"""/api/v2/status/models and /api/v2/status/heartbeat (docs/reference/horde_api.md): the fields the
horde-sdk requires."""

from __future__ import annotations

import horde_lite
from tests.support.horde import ANON, HordeClient


async def _models(client: HordeClient, query: str = "?type=text") -> list[dict[str, object]]:
    response = await client.http.get(f"/api/v2/status/models{query}")
    assert response.status_code == 200
    return response.json()


async def test_heartbeat(client: HordeClient) -> None:
    response = await client.http.get("/api/v2/status/heartbeat")
    assert response.status_code == 200
    assert response.json() == {"message": "OK", "version": horde_lite.__version__}


async def test_no_workers_no_models(client: HordeClient) -> None:
    assert await _models(client) == []


async def test_models_fields(client: HordeClient) -> None:
    alice = await client.user("alice")
    bob = await client.user("bob")
    await client.pop(alice, "wa", models=["m-12B", "solo-7B"])
    await client.pop(bob, "wb", models=["m-12B"])
    await client.set_worker_speed("wb", 30.0)  # wa stays unmeasured: the assumed 10 tokens/s
    await client.create(ANON, models=["m-12B"], params={"max_length": 100, "n": 2})
    await client.create(ANON, models=["m-12B", "solo-7B"], params={"max_length": 50})
    await client.create(ANON, params={"max_length": 64})  # any model: not attributed to one

    models = {m["name"]: m for m in await _models(client)}
    assert set(models) == {"m-12B", "solo-7B"}
    for model in models.values():
        assert set(model) == {"name", "count", "performance", "queued", "jobs", "eta", "type"}
        assert model["type"] == "text"
    big = models["m-12B"]
    assert big["count"] == 2
    assert big["performance"] == 20.0  # mean lease speed of its workers
    assert big["queued"] == 100 * 2 + 50  # queued output tokens
    assert big["jobs"] == 3
    assert big["eta"] == int(250 / 40)  # queued tokens / combined speed
    solo = models["solo-7B"]
    assert (solo["count"], solo["performance"], solo["queued"], solo["jobs"], solo["eta"]) == (
        1,
        10.0,
        50,
        1,
        5,
    )


async def test_models_follow_the_queue_and_the_fleet(client: HordeClient) -> None:
    key = await client.user("owner")
    await client.pop(key, "w1", models=["m"])
    await client.create(ANON, models=["m"], params={"max_length": 80})
    assert (await _models(client))[0]["jobs"] == 1
    job = (await client.pop(key, "w1", models=["m"])).json()
    assert (await _models(client))[0]["jobs"] == 0  # handed out: no longer queued
    await client.submit(key, job["id"], "done")
    # The default type is text; other types list nothing (horde_lite serves text only).
    assert [m["name"] for m in await _models(client, "")] == ["m"]
    assert [m["name"] for m in await _models(client, "?type=all")] == ["m"]
    assert await _models(client, "?type=image") == []
    # An offline worker's models are not listed.
    client.clock.advance(301)
    assert await _models(client) == []
