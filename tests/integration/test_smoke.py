"""The legacy path end to end through HTTP: create, pop, submit, status, on both databases."""

from __future__ import annotations

from tests.support.horde import HordeClient


async def test_legacy_request_round_trip(client: HordeClient) -> None:
    key = await client.user("owner", kudos=1000)
    created = await client.create(
        key, models=["m-12B"], params={"max_length": 64, "max_context_length": 1024}
    )
    assert created.status_code == 202, created.text
    request_id = created.json()["id"]
    popped = await client.pop(key, "w1", models=["m-12B"])
    job = popped.json()
    assert job["payload"]["prompt"] == "Hello there."
    assert job["ttl"] == 150
    assert (await client.submit(key, job["id"], "x" * 40)).json()["reward"] > 0
    status = (await client.status(request_id)).json()
    assert status["done"] is True
    assert [g["text"] for g in status["generations"]] == ["x" * 40]
