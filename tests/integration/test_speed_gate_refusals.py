"""A request the speed gate alone keeps from every online worker is refused in words that name the
gate and its numbers (the best capacity against the size asked), on /v1 after the grace and on the
horde API at admission (docs/reference/chat_requests.md). Both databases."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from horde_lite.clock import ManualClock
from tests.conftest import make_settings
from tests.integration.test_chat import HI, TOOLS, error_of, raised
from tests.support.chat import CHAT_BLOCK, MODEL, Chat, in_background, open_chat
from tests.support.horde import ANON

# An unmeasured worker's capacity: the assumed 10 tokens/s over the 120 s generation window.
UNMEASURED_CAPACITY = 1200


@pytest.fixture(params=["enforce_all", "enforce_chat"])
async def gated(request: pytest.FixtureRequest, db_url: str, clock: ManualClock) -> AsyncIterator[Chat]:
    settings = make_settings(db_url, policies={"speed_gate": request.param})
    async with open_chat(settings, clock) as opened:
        yield opened


async def test_v1_chat_refusal_names_the_gate_and_the_numbers(gated: Chat) -> None:
    gate = gated.horde.policies.names["speed_gate"]
    key = await gated.hc.user("owner", kudos=10_000)
    worker = gated.worker(key, "small")  # declares 2048 completion tokens; capacity 1200
    await worker.pop()
    asking = await in_background(
        gated.openai(key).chat.completions.create(model=MODEL, messages=HI, max_tokens=2000)  # type: ignore[arg-type]
    )
    await gated.until_request()
    assert (await worker.pop())["id"] is None  # the gate keeps it from the only worker
    gated.clock.advance(gated.horde.settings.chat.grace_seconds + 1)
    failure = await raised(asking)
    assert failure.status_code == 503
    error = error_of(failure)
    assert error["code"] == "no_eligible_worker"
    message = error["message"]
    assert f"the speed gate {gate} turns away the one online worker" in message, message
    assert f"the largest capacity is {UNMEASURED_CAPACITY} tokens, below the 2000 max_tokens asked" in message
    # Within its capacity the same worker is not turned away: no gate in the answer.
    await worker.pop()
    quote = await gated.http.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": HI, "max_tokens": 1000, "dry_run": True},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert quote.status_code == 200, quote.text
    assert quote.json()["eligible_workers"] == 1


async def test_horde_api_refusal_names_the_gate(gated: Chat) -> None:
    gate = gated.horde.policies.names["speed_gate"]
    key = await gated.hc.user("owner")
    for name in ("small-a", "small-b"):
        await gated.worker(key, name, max_length=4096).pop()
    # Anonymous, over the floor, and no worker may take it: kudos would not help, so 503.
    chat = {"messages": HI, "max_tokens": 2000}
    created = await gated.hc.create(ANON, models=[MODEL], chat=chat)
    assert created.status_code == 503, created.text
    body = created.json()
    assert set(body) == {"message", "rc"}
    assert body["rc"] == "NoEligibleWorker"
    assert f"the speed gate {gate} turns away the 2 online workers" in body["message"], body
    assert f"{UNMEASURED_CAPACITY} tokens, below the 2000 max_tokens asked" in body["message"]
    # A legacy request: only enforce_all gates it; the field is named as the horde API names it.
    created = await gated.hc.create(ANON, models=[MODEL], params={"max_length": 2000})
    if gate == "enforce_all":
        assert created.status_code == 503, created.text
        assert created.json()["rc"] == "NoEligibleWorker"
        assert "below the 2000 max_length asked" in created.json()["message"]
    else:
        assert created.status_code == 202, created.text  # legacy requests pass enforce_chat


async def test_a_declaration_gap_is_named_before_the_gate(gated: Chat) -> None:
    key = await gated.hc.user("owner")
    await gated.worker(key, "plain", chat={**CHAT_BLOCK, "features": []}).pop()
    chat = {"messages": HI, "max_tokens": 2000, "tools": TOOLS}
    created = await gated.hc.create(ANON, models=[MODEL], chat=chat)
    assert created.status_code == 503, created.text
    message = created.json()["message"]
    assert f"no online worker for {MODEL} declares tools" in message
    assert "speed gate" not in message
