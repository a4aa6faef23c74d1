"""`horde-lite worker` against a real horde_lite server (uvicorn on a free port) and a fake
OpenAI-compatible backend that streams like llama-server (tests/support/fake_backend.py). The
worker talks to the horde through a proxy that records its progress posts and can lose an answer.

The worker is database-agnostic: streamed chat and the legacy job run on both databases, the rest
on SQLite only."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.fake_backend import (
    HOLD_TOKENS,
    LEGACY_TEXT,
    LEGACY_USAGE,
    MODEL_ID,
    RAMBLE,
    RAMBLE_TOKENS,
    TOKENS,
    TOOL_ARGS,
    FakeBackend,
    Served,
    free_port,
)
from tests.support.worker_rig import (
    MODEL,
    PATIENCE,
    Rig,
    leave_after_first_content,
    rig,
    running,
    served_horde,
    sqlite_rig,
    until,
)

FULL = "".join(TOKENS)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture
async def both(db_url: str) -> AsyncIterator[Rig]:
    """The rig on each database."""
    with served_horde(db_url) as url:
        async with rig(url, db_url) as r:
            yield r


@pytest.fixture
async def lite(tmp_path: Path, sqlite_template: Path) -> AsyncIterator[Rig]:
    """The rig on SQLite only."""
    async with sqlite_rig(tmp_path, sqlite_template) as r:
        yield r


@pytest.mark.slow
async def test_streamed_chat_reaches_the_client_while_the_backend_generates(both: Rig) -> None:
    worker = both.worker("streamer")
    async with running(worker):
        await both.online("streamer")
        stream = await both.openai().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hold"}], stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        text, usage, finish, first_seen_while_generating = "", None, None, False
        async with asyncio.timeout(PATIENCE):
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                if not chunk.choices:
                    continue
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
                if text and not both.backend.gate.is_set():
                    # The backend is holding after its first tokens: it has not finished.
                    first_seen_while_generating = both.backend.finished == 0
                    assert FULL.startswith(text)
                    assert len(text) <= len("".join(TOKENS[:HOLD_TOKENS]))
                    both.backend.release()
    assert first_seen_while_generating
    assert text == FULL
    assert finish == "stop"
    assert usage is not None
    assert usage.completion_tokens == len(TOKENS)  # the backend's own count
    [sent] = both.backend.bodies("/v1/chat/completions")
    assert sent["model"] == MODEL_ID  # the name the backend lists, not the horde's
    assert sent["stream"] is True
    assert sent["messages"] == [{"role": "user", "content": "hold"}]
    seqs = both.proxy.seqs()
    assert seqs == list(range(1, len(seqs) + 1))  # seq exact: 1, 2, ... with no gap or repeat
    assert 2 <= len(seqs) < len(TOKENS)  # batched: fewer posts than tokens
    assert "".join(b["delta"].get("content", "") for b in both.proxy.progress) == FULL


@pytest.mark.slow
async def test_tool_call_fragments_are_relayed_as_they_come(lite: Rig) -> None:
    async with running(lite.worker("toolsmith", features=["tools"])):
        await lite.online("toolsmith")
        stream = await lite.openai().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "tools"}], tools=[WEATHER], stream=True
        )
        name, args, finish = "", "", None
        async with asyncio.timeout(PATIENCE):
            async for chunk in stream:
                if not chunk.choices:
                    continue
                for call in chunk.choices[0].delta.tool_calls or []:
                    assert call.index == 0
                    name += (call.function.name or "") if call.function else ""
                    args += (call.function.arguments or "") if call.function else ""
                finish = chunk.choices[0].finish_reason or finish
    assert (name, json.loads(args), finish) == ("get_weather", json.loads(TOOL_ARGS), "tool_calls")
    relayed = [b["delta"]["tool_calls"] for b in lite.proxy.progress if "tool_calls" in b["delta"]]
    assert relayed, "tool-call fragments were not posted as progress"
    assert "".join(f["function"].get("arguments", "") for batch in relayed for f in batch) == TOOL_ARGS


@pytest.mark.slow
async def test_a_legacy_job_goes_to_v1_completions_with_mapped_parameters(both: Rig) -> None:
    params = {"max_length": 40, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "rep_pen": 1.1,
              "rep_pen_range": 320, "stop_sequence": ["\n\n"], "typical": 1}  # fmt: skip
    created = await both.http.post(
        "/api/v2/generate/text/async",
        json={"prompt": "Once upon a time", "params": params, "models": [MODEL]},
        headers={"apikey": both.key},
    )
    assert created.status_code == 202, created.text
    async with running(both.worker("legacy", chat=False)):
        status = await both.until_done(created.json()["id"])
    assert [g["text"] for g in status["generations"]] == [LEGACY_TEXT]
    [sent] = both.backend.bodies("/v1/completions")
    assert sent == {
        "model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0.5, "top_p": 0.9,
        "top_k": 40, "repetition_penalty": 1.1, "repeat_penalty": 1.1, "stop": ["\n\n"],
    }  # fmt: skip


async def test_a_legacy_jobs_usage_is_the_backends(both: Rig, caplog: pytest.LogCaptureFixture) -> None:
    """/v1/completions through the worker shows the backend's counts, not the horde's estimate
    (10 tokens from LEGACY_TEXT's characters, the prompt's characters / 3), and its log says them."""
    caplog.set_level(logging.INFO, logger="horde_lite.worker")
    async with running(both.worker("counted", chat=False)):
        await both.online("counted")
        answer = await both.openai().completions.create(model=MODEL, prompt="Once upon a time", max_tokens=40)
    assert answer.choices[0].text == LEGACY_TEXT
    assert answer.usage is not None
    assert answer.usage.model_dump(exclude_none=True) == LEGACY_USAGE
    [line] = [r.getMessage() for r in caplog.records if "submitted (text)" in r.getMessage()]
    assert f": {LEGACY_USAGE['completion_tokens']} tokens in" in line


async def test_a_legacy_answer_without_usage_is_counted_by_the_horde(
    lite: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="horde_lite.worker")
    async with running(lite.worker("unsaid", chat=False)):
        await lite.online("unsaid")
        answer = await lite.openai().completions.create(model=MODEL, prompt="mute", max_tokens=40)
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (2, 10)  # "mute": 4 / 3
    [line] = [r.getMessage() for r in caplog.records if "submitted (text)" in r.getMessage()]
    assert ": 10 tokens in" in line


@pytest.mark.slow
async def test_cancel_closes_the_backend_stream_and_submits_what_was_made(lite: Rig) -> None:
    worker = lite.worker("canceller")
    async with running(worker):
        await lite.online("canceller")
        stream = await lite.openai().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hold"}], stream=True
        )
        request_id = stream.response.headers["x-horde-request-id"]
        seen = await leave_after_first_content(stream)  # the horde cancels the request
        lite.backend.release()  # more output comes; its progress post is answered cancel: true
        status = await lite.until_done(request_id)
        await until(lambda: lite.backend.closed_early > 0)
    assert (lite.backend.closed_early, lite.backend.finished) == (1, 0)
    [generation] = status["generations"]
    assert FULL.startswith(generation["text"])
    assert len(seen) <= len(generation["text"]) < len(FULL)
    record = await lite.http.get(f"/api/v2/workers/{generation['worker_id']}")
    assert record.json()["faulted_jobs"] == 0


@pytest.mark.slow
async def test_a_backend_error_faults_that_job_and_names_the_cause(
    lite: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="horde_lite.worker")

    async def ask(said: str) -> str:
        chat = {"messages": [{"role": "user", "content": said}], "max_tokens": 64}
        created = await lite.http.post(
            "/api/v2/generate/text/async",
            json={"chat": chat, "models": [MODEL]},
            headers={"apikey": lite.key},
        )
        assert created.status_code == 202, created.text
        return str(created.json()["id"])

    failing = await ask("fail")
    async with running(lite.worker("flaky")):
        await until(lambda: any("faulted" in r.getMessage() for r in caplog.records))
        fine = await ask("hello")  # the worker carries on with the next job
        served = await lite.until_done(fine)
    assert [g["text"] for g in served["generations"]] == [FULL]
    # The faulted job went back to its request at once (another worker may take it).
    status = await lite.status(failing)
    assert (status["waiting"], status["processing"], status["faulted"]) == (1, 0, False)
    record = await lite.worker_record("flaky")
    assert record is not None
    assert record["faulted_jobs"] == 1
    [line] = [r.getMessage() for r in caplog.records if "faulted" in r.getMessage()]
    assert "backend error: chat completion: HTTP 500" in line
    assert "the model crashed" in line


@pytest.mark.slow
async def test_a_backend_that_is_down_pauses_popping_and_faults_nothing(
    lite: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="horde_lite.worker")
    port = free_port()  # nothing listens there yet
    created = await lite.http.post(
        "/api/v2/generate/text/async",
        json={"prompt": "Hi", "params": {"max_length": 32}, "models": [MODEL]},
        headers={"apikey": lite.key},
    )
    request_id = created.json()["id"]
    worker = lite.worker("patient", backend_url=f"http://127.0.0.1:{port}/v1", chat=False)
    async with running(worker):
        await asyncio.sleep(2.0)
        assert any("popping paused" in r.getMessage() for r in caplog.records)
        assert await lite.worker_record("patient") is None  # it never popped
        status = await lite.status(request_id)
        assert (status["waiting"], status["restarted"], status["faulted"]) == (1, 0, False)
        with Served(FakeBackend(), port=port):  # the backend comes up: the worker resumes
            status = await lite.until_done(request_id)
    assert [g["text"] for g in status["generations"]] == [LEGACY_TEXT]
    record = (await lite.http.get(f"/api/v2/workers/{status['generations'][0]['worker_id']}")).json()
    assert (record["faulted_jobs"], record["aborted_jobs"]) == (0, 0)


@pytest.mark.slow
async def test_a_lost_progress_answer_is_retried_with_the_same_seq(lite: Rig) -> None:
    lite.proxy.lose_answer_to_seq = 2
    lite.backend.release()  # no hold: tokens after the third come 0.1 s apart, one post each
    async with running(lite.worker("retrier")):
        await lite.online("retrier")
        stream = await lite.openai().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hold"}], stream=True
        )
        text = ""
        async with asyncio.timeout(PATIENCE):
            async for chunk in stream:
                text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
    assert lite.proxy.lost == 1
    seqs = lite.proxy.seqs()
    assert seqs[:3] == [1, 2, 2]
    assert seqs[2:] == list(range(2, len(seqs)))
    assert lite.proxy.progress[1] == lite.proxy.progress[2]  # the same body again
    assert set(lite.proxy.answers) == {200}  # the repeat was acknowledged
    assert text == FULL  # and nothing was relayed twice


async def test_a_backend_that_does_not_say_its_context_stops_the_worker_naming_the_flag(lite: Rig) -> None:
    with Served(FakeBackend(context=None)) as silent:
        worker = lite.worker("guessless", backend_url=f"{silent.url}/v1", chat=False)
        assert await asyncio.wait_for(worker.run(), PATIENCE) == 1
    assert worker.fatal is not None
    assert "the backend does not say its context: give --max-context-length N" in worker.fatal
    assert await lite.worker_record("guessless") is None  # it never popped, so declared nothing
    with Served(FakeBackend(context=None)) as silent:
        flagged = lite.worker("flagged", backend_url=f"{silent.url}/v1", chat=False, max_context_length=2048)
        async with running(flagged):
            await lite.online("flagged")
    record = await lite.worker_record("flagged")
    assert record is not None
    assert record["max_context_length"] == 2048


async def test_the_log_counts_a_legacy_job_at_most_what_it_allowed(
    lite: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="horde_lite.worker")
    created = await lite.http.post(
        "/api/v2/generate/text/async",
        json={"prompt": "ramble", "params": {"max_length": 16}, "models": [MODEL]},
        headers={"apikey": lite.key},
    )
    assert created.status_code == 202, created.text
    async with running(lite.worker("rambler", chat=False)):
        status = await lite.until_done(created.json()["id"])
    assert [g["text"] for g in status["generations"]] == [RAMBLE]  # kept as sent
    [line] = [r.getMessage() for r in caplog.records if "submitted (text)" in r.getMessage()]
    assert RAMBLE_TOKENS > 16
    assert ": 16 tokens in" in line  # the backend's count, capped
