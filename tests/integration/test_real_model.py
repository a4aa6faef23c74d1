"""A real model end to end: llama-cpp-python's server with SmolLM2-135M-Instruct
(tests/support/model_server.py, one per session), bridged by `horde-lite worker` as a real process
to the real horde_lite app (uvicorn on a free port, on each database), and real clients: the
`openai` package and the horde-sdk.

What the clients get is checked against what the model server says when asked directly: greedy
sampling (temperature 0) makes its answer to the same request the same text, with the same counts.
Skipped without the `model` extra (`pip install -e '.[model]'`), failed instead when
HORDE_LITE_REQUIRE_MODEL=1 (CI); `-m "not real_model"` leaves these tests out."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select

from horde_lite.db.models import Generation, TextRequest
from horde_lite.demo.server import make_users
from horde_lite.fronts.text_front import prompt_tokens
from horde_lite.requests import prices
from tests.conftest import make_settings
from tests.support.cli import query
from tests.support.model_server import ModelServer
from tests.support.sdk_client import sdk_text
from tests.support.worker_rig import (
    PATIENCE,
    leave_after_first_content,
    request_status,
    served_horde,
    until_done,
)

pytestmark = pytest.mark.real_model

WORKER = "smol"
# Greedy, so the horde's answer and the model server's own answer to the same request match.
GREEDY = {"temperature": 0.0, "seed": 7}
STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]


@dataclass
class Stack:
    horde_url: str
    db_url: str
    client_key: str
    model: ModelServer
    worker: subprocess.Popen[bytes]
    log: Path
    http: httpx.AsyncClient

    def openai(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.horde_url}/v1", api_key=self.client_key, max_retries=0)

    def direct(self) -> openai.AsyncOpenAI:
        """The model server itself, for what it says of the same request."""
        return openai.AsyncOpenAI(base_url=self.model.url, api_key="none", max_retries=0)

    async def worker_record(self) -> dict[str, Any] | None:
        workers = (await self.http.get("/api/v2/workers")).json()
        return next((w for w in workers if w["name"] == WORKER), None)

    async def status(self, request_id: str) -> dict[str, Any]:
        return await request_status(self.http, request_id)

    async def until_done(self, request_id: str) -> dict[str, Any]:
        return await until_done(self.http, request_id, self.log_text)

    async def priced(self, request_id: str) -> tuple[int, float, int]:
        """The request's priced context and job price, and its one job's stored tokens."""
        statement = (
            select(TextRequest.price_context, TextRequest.job_price, Generation.tokens)
            .join(Generation, Generation.request_id == TextRequest.id)
            .where(TextRequest.id == request_id)
        )
        [row] = await asyncio.to_thread(query, self.db_url, statement)
        return int(row[0]), float(row[1]), int(row[2])

    async def reward_for(self, request_id: str, model: str, completion_tokens: int) -> float:
        """The documented reward rule for a trusted owner's job of `completion_tokens` tokens."""
        context, job_price, tokens = await self.priced(request_id)
        assert tokens == completion_tokens
        sizes = prices.ModelSizes.from_settings(make_settings(self.db_url).kudos)
        return prices.job_reward(sizes, completion_tokens, model, context, True, job_price)

    async def check_paid(self, answer: Any, request_id: str, completion_tokens: int) -> None:
        """The worker earned the documented reward for `completion_tokens`, and the client paid it
        (plus the burn)."""
        reward = await self.reward_for(request_id, self.model.model, completion_tokens)
        assert reward > 0
        record = await self.worker_record()
        assert record is not None
        assert record["kudos_rewards"] == reward
        assert (answer.model_extra or {})["kudos"] == round(reward + prices.BURN, 2)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    async def logged(self, needle: str) -> str:
        """The worker's first log line holding `needle`, once written (it logs after the horde
        answered its submit, so after the request shows done)."""
        deadline = time.monotonic() + PATIENCE
        while not (lines := [x for x in self.log_text().splitlines() if needle in x]):
            assert time.monotonic() < deadline, f"never logged {needle!r}: {self.log_text()}"
            await asyncio.sleep(0.05)
        return lines[0]


def worker_command(horde_url: str, model: ModelServer, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "horde_lite.worker", "--horde", horde_url, "--name", WORKER,
        "--backend", model.url, "--progress-interval", "0.1", "--wait-seconds", "5", *extra,
    ]  # fmt: skip


def spawn(command: list[str], log: Path, key: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent,
            env={**os.environ, "HORDE_LITE_WORKER_KEY": key},
        )  # fmt: skip


@pytest.fixture
async def stack(db_url: str, model_server: ModelServer, tmp_path: Path) -> AsyncIterator[Stack]:
    """The horde on `db_url`, a volunteer's worker bridging the model server, a client with kudos."""
    with served_horde(db_url) as horde_url:
        keys = await make_users(db_url, {"volunteer": 0, "client": 10_000})
        log = tmp_path / "worker.log"
        command = worker_command(horde_url, model_server, "--max-context-length", str(model_server.n_ctx))
        process = spawn(command, log, keys["volunteer"])
        async with httpx.AsyncClient(base_url=horde_url, timeout=PATIENCE) as http:
            stack = Stack(horde_url, db_url, keys["client"], model_server, process, log, http)
            try:
                deadline = time.monotonic() + PATIENCE
                while await stack.worker_record() is None:
                    assert process.poll() is None, stack.log_text()
                    assert time.monotonic() < deadline, stack.log_text()
                    await asyncio.sleep(0.05)
                yield stack
            finally:
                process.send_signal(signal.SIGTERM)
                code = await asyncio.to_thread(process.wait, PATIENCE)
        assert code == 0, stack.log_text()
        assert "Traceback" not in stack.log_text(), stack.log_text()


def test_without_a_context_flag_the_worker_stops_at_start_naming_it(model_server: ModelServer) -> None:
    """llama-cpp-python's server says its context nowhere: the worker refuses to guess one."""
    command = worker_command("http://127.0.0.1:9", model_server)  # never reached: it stops first
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=PATIENCE,
        env={**os.environ, "HORDE_LITE_WORKER_KEY": "k" * 22},
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "the backend does not say its context: give --max-context-length N" in result.stderr
    assert "declared" not in result.stderr


async def test_the_worker_declares_the_context_the_server_has(stack: Stack) -> None:
    record = await stack.worker_record()
    assert record is not None
    assert record["max_context_length"] == stack.model.n_ctx
    [declared] = [line for line in stack.log_text().splitlines() if f"{WORKER}: declared" in line]
    assert f"'max_context_length': {stack.model.n_ctx}" in declared
    assert f"'max_context_tokens': {stack.model.n_ctx}" in declared
    assert f"'models': ['{stack.model.model}']" in declared


async def test_a_chat_answer_is_the_models_with_its_counts_and_the_reward_they_earn(stack: Stack) -> None:
    asked: dict[str, Any] = {"model": stack.model.model, "messages": STORY, "max_tokens": 16, **GREEDY}
    answer = await stack.openai().chat.completions.create(**asked)
    own = await stack.direct().chat.completions.create(**asked)
    text = answer.choices[0].message.content
    assert text
    assert text == own.choices[0].message.content
    assert answer.usage is not None
    assert own.usage is not None
    # The model's counts, prompt included (its chat template's tokens, not the horde's estimate).
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (
        own.usage.prompt_tokens,
        own.usage.completion_tokens,
    )
    assert answer.usage.total_tokens == own.usage.total_tokens
    assert answer.choices[0].finish_reason == own.choices[0].finish_reason
    request_id = answer.id.removeprefix("chatcmpl-")
    await stack.check_paid(answer, request_id, own.usage.completion_tokens)
    # The horde API shows the same counts.
    [generation] = (await stack.status(request_id))["generations"]
    assert generation["chat"]["usage"]["prompt_tokens"] == own.usage.prompt_tokens
    assert generation["chat"]["usage"]["completion_tokens"] == own.usage.completion_tokens


async def test_max_tokens_is_honoured_and_the_answer_says_length(stack: Stack) -> None:
    asked: dict[str, Any] = {"model": stack.model.model, "messages": STORY, "max_tokens": 8, **GREEDY}
    answer = await stack.openai().chat.completions.create(**asked)
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 8
    own = await stack.direct().chat.completions.create(**asked)
    assert answer.choices[0].message.content == own.choices[0].message.content


async def test_a_stream_arrives_while_the_model_generates(stack: Stack) -> None:
    asked: dict[str, Any] = {"model": stack.model.model, "messages": STORY, "max_tokens": 32, **GREEDY}
    stream = await stack.openai().chat.completions.create(
        **asked, stream=True, stream_options={"include_usage": True}
    )
    request_id = stream.response.headers["x-horde-request-id"]
    text, unfinished, usage = "", 0, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices or not chunk.choices[0].delta.content:
            continue
        text += chunk.choices[0].delta.content
        if unfinished < 2:  # two pieces, each read while the job was still being generated
            status = await stack.status(request_id)
            assert (status["processing"], status["finished"]) == (1, 0), (text, status)
            unfinished += 1
    assert unfinished == 2
    own = await stack.direct().chat.completions.create(**asked)
    assert text == own.choices[0].message.content
    assert usage is not None
    assert own.usage is not None
    assert usage.prompt_tokens == own.usage.prompt_tokens
    assert usage.completion_tokens == own.usage.completion_tokens


async def test_completions_with_a_stop_sequence(stack: Stack) -> None:
    asked: dict[str, Any] = {
        "model": stack.model.model, "prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": 24, "stop": [" 9"], **GREEDY,
    }  # fmt: skip
    answer = await stack.openai().completions.create(**asked)
    own = await stack.direct().completions.create(**asked)
    text = answer.choices[0].text
    assert text == own.choices[0].text
    assert " 7" in text
    assert " 9" not in text
    assert answer.choices[0].finish_reason == "stop"


async def test_a_completion_shows_the_models_counts_and_earns_their_reward(stack: Stack) -> None:
    prompt = "Once upon a time, in a village at the foot of a mountain,"
    asked: dict[str, Any] = {"model": stack.model.model, "prompt": prompt, "max_tokens": 16, **GREEDY}
    answer = await stack.openai().completions.create(**asked)
    own = await stack.direct().completions.create(**asked)
    assert answer.choices[0].text
    assert answer.choices[0].text == own.choices[0].text
    assert answer.usage is not None
    assert own.usage is not None
    assert own.usage.prompt_tokens != prompt_tokens(prompt)  # the model's count, not the estimate
    shown = (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens)
    assert shown == (own.usage.prompt_tokens, own.usage.completion_tokens, own.usage.total_tokens)
    request_id = answer.id.removeprefix("cmpl-")
    await stack.check_paid(answer, request_id, own.usage.completion_tokens)
    assert f": {own.usage.completion_tokens} tokens in" in await stack.logged("submitted (text)")
    # Streamed, with the usage chunk asked for: the same counts.
    stream = await stack.openai().completions.create(
        **asked, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.text for chunk in chunks for c in chunk.choices) == own.choices[0].text
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        own.usage.prompt_tokens,
        own.usage.completion_tokens,
    )


async def test_a_client_that_leaves_mid_stream_cancels_and_the_worker_is_paid_for_what_it_made(
    stack: Stack,
) -> None:
    """chat_requests.md: the request is cancelled, the worker's next progress post is answered
    `cancel: true`; worker.md: the worker then submits what was made, and it is paid."""
    asked: dict[str, Any] = {"model": stack.model.model, "messages": STORY, "max_tokens": 512, **GREEDY}
    stream = await stack.openai().chat.completions.create(**asked, stream=True)
    request_id = stream.response.headers["x-horde-request-id"]
    seen = await leave_after_first_content(stream)
    status = await stack.until_done(request_id)
    [generation] = status["generations"]
    assert generation["state"] == "ok"
    assert generation["text"].startswith(seen)
    tokens = generation["chat"]["usage"]["completion_tokens"]
    assert 0 < tokens < 512
    assert "stopped early (cancel: true)" in await stack.logged("submitted (chat stream)")
    record = await stack.worker_record()
    assert record is not None
    assert record["kudos_rewards"] == await stack.reward_for(request_id, stack.model.model, tokens) > 0
    assert (record["requests_fulfilled"], record["uncompleted_jobs"]) == (1, 0)


async def test_the_horde_sdk_gets_real_text(stack: Stack) -> None:
    prompt = "The capital of France is"
    answer = await asyncio.to_thread(
        sdk_text, stack.horde_url, stack.client_key, stack.model.model, prompt, 16, PATIENCE
    )
    assert answer.done, answer
    [text] = answer.texts
    assert text.strip()
    line = await stack.logged("submitted (text)")
    logged = re.search(r": (\d+) tokens in", line)
    assert logged is not None
    _, _, tokens = await stack.priced(answer.request_id)
    assert int(logged.group(1)) == tokens <= 16  # the model's count, never more than the job allowed
