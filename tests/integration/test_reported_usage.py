"""The usage a client sees is the one the worker reported (its model's counts), within bounds: a
prompt count the worker's declared context cannot hold is not believed and moves nothing, and
`total_tokens` is the sum of what is kept. On SQLite and PostgreSQL, over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from horde_lite.clock import ManualClock
from horde_lite.settings import Settings
from tests.support.chat import CHAT_BLOCK, MODEL, Chat, ChatWorker, along, open_chat
from tests.support.invariants import check

HI = [{"role": "user", "content": "What is the capital of France?"}]
REPLY = "Paris is the capital."


@pytest.fixture
async def chat(settings: Settings, clock: ManualClock) -> AsyncIterator[Chat]:
    async with open_chat(settings, clock) as opened:
        yield opened


async def _served(chat: Chat, payer: str, worker: ChatWorker, usage: dict[str, int]) -> tuple[Any, float]:
    """One non-streaming chat request answered by `worker` with `usage`: the answer and the reward."""
    assert not (await worker.pop()).get("id")  # registered first: a model nobody serves is a 404

    async def serve() -> float:
        job = await worker.pop_job()
        submitted = await worker.submit(job["id"], REPLY, usage=usage)
        assert submitted.status_code == 200, submitted.text
        return float(submitted.json()["reward"])

    return await along(
        chat.openai(payer).chat.completions.create(model=MODEL, messages=HI, max_tokens=64), serve()
    )


async def test_the_models_prompt_count_is_shown_and_an_absurd_one_moves_nothing(chat: Chat) -> None:
    payer = await chat.hc.user("payer", kudos=10_000)
    owner = await chat.hc.user("volunteer", trusted=True)
    honest = chat.worker(owner, "honest")
    hostile = chat.worker(owner, "hostile")
    context = CHAT_BLOCK["max_context_tokens"]

    answer, reward = await _served(
        chat, payer, honest, {"prompt_tokens": 34, "completion_tokens": 6, "total_tokens": 40}
    )
    assert answer.usage is not None
    shown = answer.usage
    assert (shown.prompt_tokens, shown.completion_tokens, shown.total_tokens) == (34, 6, 40)

    absurd = {"prompt_tokens": context + 1, "completion_tokens": 6, "total_tokens": 2_000_000_000}
    evil_answer, evil_reward = await _served(chat, payer, hostile, absurd)
    request = await chat.request(evil_answer.id.removeprefix("chatcmpl-"))
    assert evil_answer.usage is not None
    # Not believed: the client sees the horde's own estimate, and a total that adds up.
    assert evil_answer.usage.prompt_tokens == request.prompt_tokens
    assert evil_answer.usage.total_tokens == request.prompt_tokens + 6
    [generation] = (await chat.hc.status(request.id)).json()["generations"]
    assert generation["chat"]["usage"] == {"completion_tokens": 6, "total_tokens": 6}
    # Nothing moved: the same reward and the same charge as the honest job's.
    assert evil_reward == reward > 0
    assert (evil_answer.model_extra or {})["kudos"] == (answer.model_extra or {})["kudos"]
    report = await check(chat.horde.engine)
    assert report.ok, report.violations


async def test_the_largest_count_a_worker_may_send_breaks_nothing(chat: Chat) -> None:
    payer = await chat.hc.user("payer", kudos=10_000)
    owner = await chat.hc.user("volunteer", trusted=True)
    most = 2**31 - 1
    answer, reward = await _served(
        chat,
        payer,
        chat.worker(owner, "hostile"),
        {"prompt_tokens": most, "completion_tokens": most, "total_tokens": most},
    )
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 64  # capped at the applied max_tokens, and paid as such
    request = await chat.request(answer.id.removeprefix("chatcmpl-"))
    assert answer.usage.prompt_tokens == request.prompt_tokens
    assert 0 < reward <= request.job_price
    report = await check(chat.horde.engine)
    assert report.ok, report.violations
