"""The usage a client sees is the one the worker reported (its model's counts), within bounds: a
prompt count the worker's declared context cannot hold is not believed and moves nothing, and
`total_tokens` is the sum of what is kept. A chat job's usage travels in `chat.usage`, a legacy
job's in the submit's `usage`; its `completion_tokens` is paid, capped at the job's max_length. On
SQLite and PostgreSQL, over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from horde_lite.clock import ManualClock
from horde_lite.fronts.text_front import prompt_tokens
from horde_lite.requests import prices
from horde_lite.settings import Settings
from tests.support.chat import CHAT_BLOCK, MODEL, Chat, ChatWorker, along, open_chat
from tests.support.invariants import check

HI = [{"role": "user", "content": "What is the capital of France?"}]
REPLY = "Paris is the capital."
PROMPT = "The capital of France is"
INT32_MAX = 2**31 - 1


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


# --- legacy jobs -------------------------------------------------------------------------------


def _legacy(chat: Chat, key: str, name: str) -> ChatWorker:
    """A worker without a chat block: it takes legacy text jobs only."""
    return chat.worker(key, name, chat=None)


async def _legacy_served(
    chat: Chat, payer: str, worker: ChatWorker, usage: dict[str, Any], *, stream: bool = False
) -> tuple[Any, str, float]:
    """One /v1/completions call (64 tokens asked) answered by `worker` with `usage` in its submit:
    the usage the client was shown, the request's id and the reward."""
    assert not (await worker.pop()).get("id")

    async def serve() -> float:
        job = await worker.pop_job()
        assert job["kind"] == "text", job
        submitted = await chat.hc.submit(worker.key, job["id"], REPLY, usage=usage)
        assert submitted.status_code == 200, submitted.text
        return float(submitted.json()["reward"])

    client = chat.openai(payer).completions
    if not stream:
        answer, reward = await along(client.create(model=MODEL, prompt=PROMPT, max_tokens=64), serve())
        return answer.usage, answer.id.removeprefix("cmpl-"), reward

    async def streamed() -> tuple[Any, str]:
        chunks = [c async for c in await client.create(
            model=MODEL, prompt=PROMPT, max_tokens=64, stream=True, stream_options={"include_usage": True}
        )]  # fmt: skip
        assert [c.text for c in chunks[0].choices] == [REPLY]
        return chunks[-1].usage, chunks[-1].id.removeprefix("cmpl-")

    (usage_shown, request_id), reward = await along(streamed(), serve())
    return usage_shown, request_id, reward


async def _expected_reward(chat: Chat, request_id: str, tokens: int) -> float:
    """The documented reward of a trusted owner's job of `tokens` tokens for the request."""
    request = await chat.request(request_id)
    return prices.job_reward(chat.horde.sizes, tokens, MODEL, request.price_context, True, request.job_price)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_legacy_jobs_usage_is_the_models_shown_and_paid(chat: Chat, stream: bool) -> None:
    payer = await chat.hc.user("payer", kudos=10_000)
    owner = await chat.hc.user("volunteer", trusted=True)
    worker = _legacy(chat, owner, "legacy")
    # The model's counts, where the horde's own are 8 (the prompt) and 6 (the reply).
    assert (prompt_tokens(PROMPT), prices.text_tokens(REPLY)) == (8, 6)
    shown, request_id, reward = await _legacy_served(
        chat, payer, worker, {"prompt_tokens": 5, "completion_tokens": 11}, stream=stream
    )
    assert shown is not None
    assert (shown.prompt_tokens, shown.completion_tokens, shown.total_tokens) == (5, 11, 16)
    [generation] = await chat.generations(request_id)
    assert (generation.tokens, generation.usage) == (11, {"prompt_tokens": 5, "completion_tokens": 11})
    assert reward == generation.reward == await _expected_reward(chat, request_id, 11) > 0
    # The horde API's status keeps upstream's shape: the text, no usage.
    [listed] = (await chat.hc.status(request_id)).json()["generations"]
    assert listed["text"] == REPLY
    assert "usage" not in listed
    # A submit without it (upstream's workers) is counted by the horde as before.
    shown, request_id, reward = await _legacy_served(chat, payer, worker, {}, stream=stream)
    assert (shown.prompt_tokens, shown.completion_tokens) == (8, 6)
    [generation] = await chat.generations(request_id)
    assert (generation.tokens, generation.usage) == (6, None)
    assert reward == await _expected_reward(chat, request_id, 6)
    report = await check(chat.horde.engine)
    assert report.ok, report.violations


async def test_a_hostile_legacy_usage_moves_nothing_beyond_the_cap(chat: Chat) -> None:
    payer = await chat.hc.user("payer", kudos=10_000)
    owner = await chat.hc.user("volunteer", trusted=True)
    worker = _legacy(chat, owner, "hostile")
    assert not (await worker.pop()).get("id")

    async def serve() -> float:
        job = await worker.pop_job()
        gen_id = job["id"]
        # Refused, nothing stored, the job still the worker's: each is a clear horde API error.
        for usage in (
            {"completion_tokens": -1},
            {"prompt_tokens": "9"},
            {"completion_tokens": INT32_MAX + 1},
            {"total_tokens": 14},
            [9, 5],
        ):
            refused = await chat.hc.submit(owner, gen_id, REPLY, usage=usage)
            assert (refused.status_code, refused.json()["rc"]) == (400, "BadRequest"), (usage, refused.text)
            assert "usage" in refused.json()["message"], refused.text
        # The largest counts it may send: the completion is capped at the job's max_length (what
        # it allowed, and what is paid), the prompt count no declared context holds is dropped.
        most = {"prompt_tokens": INT32_MAX, "completion_tokens": INT32_MAX}
        submitted = await chat.hc.submit(owner, gen_id, REPLY, usage=most)
        assert submitted.status_code == 200, submitted.text
        return float(submitted.json()["reward"])

    answer, reward = await along(
        chat.openai(payer).completions.create(model=MODEL, prompt=PROMPT, max_tokens=64), serve()
    )
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (prompt_tokens(PROMPT), 64)
    assert answer.choices[0].finish_reason == "length"  # it used, by its word, the whole budget
    request_id = answer.id.removeprefix("cmpl-")
    request = await chat.request(request_id)
    [generation] = await chat.generations(request_id)
    assert (generation.tokens, generation.usage) == (64, {"completion_tokens": 64})
    assert 0 < reward == await _expected_reward(chat, request_id, 64) <= request.job_price
    report = await check(chat.horde.engine)
    assert report.ok, report.violations


async def test_usage_on_a_chat_job_is_refused_and_on_a_fault_ignored(chat: Chat) -> None:
    payer = await chat.hc.user("payer", kudos=10_000)
    owner = await chat.hc.user("volunteer", trusted=True)
    other_owner = await chat.hc.user("another", trusted=True)
    worker, other = chat.worker(owner, "chatty"), chat.worker(other_owner, "other")
    assert not (await worker.pop()).get("id")
    most = {"prompt_tokens": INT32_MAX, "completion_tokens": INT32_MAX}

    async def serve() -> float:
        job = await worker.pop_job()
        assert job["kind"] == "chat", job
        # A chat job's usage travels in `chat.usage`: the extension is refused there, nothing kept.
        chat_block = {"message": {"role": "assistant", "content": REPLY}, "usage": {"completion_tokens": 6}}
        refused = await chat.hc.submit(owner, job["id"], REPLY, chat=chat_block, usage=most)
        assert (refused.status_code, refused.json()["rc"]) == (400, "BadRequest"), refused.text
        assert "chat.usage" in refused.json()["message"]
        # A fault stores nothing of a submit: its usage is ignored, nobody is paid or charged.
        faulted = await chat.hc.submit(owner, job["id"], "", state="faulted", usage=most)
        assert (faulted.status_code, faulted.json()["reward"]) == (200, 0), faulted.text
        # The request went back to the queue (nothing was relayed yet), for another owner's worker
        # (an owner whose worker failed it is not offered it again): answered honestly now.
        submitted = await other.submit((await other.pop_job())["id"], REPLY, usage={"completion_tokens": 6})
        assert submitted.status_code == 200, submitted.text
        return float(submitted.json()["reward"])

    answer, reward = await along(
        chat.openai(payer).chat.completions.create(model=MODEL, messages=HI, max_tokens=64), serve()
    )
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 6
    request_id = answer.id.removeprefix("chatcmpl-")
    # Both were popped at the same instant of the test's clock: told apart by state, not by order.
    generations = {generation.state: generation for generation in await chat.generations(request_id)}
    assert sorted(generations) == ["faulted", "ok"], generations
    faulted, served = generations["faulted"], generations["ok"]
    assert (faulted.state, faulted.tokens, faulted.reward, faulted.usage, faulted.chat_result) == (
        "faulted",
        0,
        0.0,
        None,
        None,
    )
    assert (served.state, served.tokens, served.usage) == ("ok", 6, None)
    assert reward == served.reward > 0
    report = await check(chat.horde.engine)
    assert report.ok, report.violations
