"""Streaming chat jobs: progress posts, the lease they extend, lapses before and after output, and
the client going away (docs/reference/chat_requests.md, "Chat workers" and "Job lease"). Both
databases."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import msgspec
import openai
import pytest

from horde_lite.api.openai.schemas import ChatCompletionInput, to_payload
from horde_lite.clock import ManualClock
from horde_lite.core.context import Caller
from horde_lite.db.engine import READ_ONLY
from horde_lite.fronts import chat_front
from horde_lite.fronts.waiting import Delta, Final, Waiter
from horde_lite.jobs import output_bounds as bounds
from horde_lite.settings import Settings
from tests.conftest import make_settings
from tests.support.chat import (
    MODEL,
    PATIENCE,
    Chat,
    ChatWorker,
    gather_stream,
    in_background,
    joined,
    open_chat,
    settled,
    text_until,
)
from tests.support.statements import statements_sent

HI = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture
async def chat(settings: Settings, clock: ManualClock) -> AsyncIterator[Chat]:
    async with open_chat(settings, clock) as opened:
        yield opened


def epoch(iso: str) -> float:
    assert iso.endswith("Z"), iso
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


async def start_stream(chat: Chat, worker: ChatWorker, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    """A streaming /v1 request taken by `worker`: the stream opens once the job is assigned."""
    creating = await in_background(
        chat.openai().chat.completions.create(model=MODEL, messages=HI, stream=True, **kwargs)
    )
    job = await worker.pop_job()
    assert job["stream"] is True
    return await settled(creating), job


async def test_progress_extends_the_lease_up_to_max_seconds(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "w1")
    await worker.pop()
    stream, job = await start_stream(chat, worker)
    reading = await in_background(gather_stream(stream))
    [generation] = await chat.generations((await chat.until_request()).id)
    popped = generation.popped_at
    lease = chat.horde.settings.lease
    assert job["ttl"] == lease.base_seconds == 150

    first = await worker.progress(job["id"], 1, "a")
    assert first.status_code == 200, first.text
    assert first.json()["cancel"] is False
    # now + 30 s is inside the base lease: nothing to extend yet.
    assert epoch(first.json()["lease_expires_at"]) == pytest.approx(popped + 150, abs=1e-3)
    chat.clock.advance(140)
    second = await worker.progress(job["id"], 2, "b")
    assert epoch(second.json()["lease_expires_at"]) == pytest.approx(popped + 170, abs=1e-3)
    elapsed, seq = 140, 3
    while elapsed < lease.max_seconds:
        step = min(25, lease.max_seconds - elapsed)
        chat.clock.advance(step)
        elapsed += step
        answer = await worker.progress(job["id"], seq, ".")
        assert answer.status_code == 200, (elapsed, answer.text)
        expected = min(popped + elapsed + lease.progress_extension_seconds, popped + lease.max_seconds)
        assert epoch(answer.json()["lease_expires_at"]) == pytest.approx(expected, abs=1e-3)
        seq += 1
    assert elapsed == lease.max_seconds == 900
    # Capped at popped_at + max_seconds: one second later the lease has lapsed.
    chat.clock.advance(1)
    late = await worker.progress(job["id"], seq, "late")
    assert (late.status_code, late.json()["rc"]) == (400, "AbortedGen")
    chunks, error = await settled(reading)
    # Output had been streamed, so the lapse ends the stream with an in-stream error.
    assert isinstance(error, openai.APIError)
    assert error.body["code"] == "worker_failed"  # type: ignore[index]
    assert joined(chunks).startswith("ab..")
    assert "late" not in joined(chunks)
    assert (await worker.pop())["id"] is None  # the request was cancelled, not restarted


async def test_repeats_are_acknowledged_and_gaps_refused(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "w1")
    await worker.pop()
    stream, job = await start_stream(chat, worker)
    reading = await in_background(gather_stream(stream))
    first = await worker.progress(job["id"], 1, "Hello", completion_tokens=2)
    assert first.status_code == 200
    chat.clock.advance(130)
    repeat = await worker.progress(job["id"], 1, "Hello", completion_tokens=2)
    assert repeat.status_code == 200
    # Acknowledged, and not extended.
    assert repeat.json() == {"lease_expires_at": first.json()["lease_expires_at"], "cancel": False}
    gap = await worker.progress(job["id"], 3, "!!")
    assert gap.status_code == 409
    assert gap.json()["rc"] == "ProgressOutOfOrder"
    assert "2" in gap.json()["message"]
    second = await worker.progress(job["id"], 2, ", world", completion_tokens=4)
    assert second.status_code == 200
    assert epoch(second.json()["lease_expires_at"]) > epoch(first.json()["lease_expires_at"])
    request = await chat.until_request()
    [generation] = await chat.generations(request.id)
    assert (generation.progress_seq, generation.progress_content) == (2, "Hello, world")
    assert generation.completion_tokens == 4
    assert (await worker.submit(job["id"], "Hello, world!")).status_code == 200
    chunks, error = await settled(reading)
    assert error is None
    assert joined(chunks) == "Hello, world!"


async def test_progress_only_from_the_lease_holder_of_a_streaming_chat_job(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    other = await chat.hc.user("intruder")
    worker = chat.worker(key, "w1")
    await worker.pop()
    stream, job = await start_stream(chat, worker)
    reading = await in_background(gather_stream(stream))

    wrong = await worker.progress(job["id"], 1, "x", key=other)
    assert (wrong.status_code, wrong.json()["rc"]) == (403, "WrongCredentials")
    unknown = await worker.progress(str(uuid.uuid4()), 1, "x")
    assert (unknown.status_code, unknown.json()["rc"]) == (404, "InvalidJobID")
    bad = await chat.http.post(
        "/api/v2/generate/text/progress", json={"id": job["id"], "seq": 0}, headers={"apikey": key}
    )
    assert bad.status_code == 400
    assert "errors" in bad.json()
    assert (await worker.progress(job["id"], 1, "fine")).status_code == 200
    assert (await worker.submit(job["id"], "fine")).status_code == 200
    done = await worker.progress(job["id"], 2, "more")
    assert (done.status_code, done.json()["rc"]) == (400, "DuplicateGen")
    chunks, error = await settled(reading)
    assert error is None
    assert joined(chunks) == "fine"
    # A legacy job takes no progress posts.
    await chat.hc.create(key, models=[MODEL], params={"max_length": 64})
    legacy = await worker.pop()
    assert legacy["kind"] == "text"
    refused = await worker.progress(legacy["id"], 1, "x")
    assert (refused.status_code, refused.json()["rc"]) == (400, "NotStreamingJob")


async def test_client_disconnect_cancels_the_request_and_tells_the_worker(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "w1")
    await worker.pop()
    stream, job = await start_stream(chat, worker)
    first = await worker.progress(job["id"], 1, "Once upon")
    assert first.json()["cancel"] is False
    seen = ""
    async for chunk in stream:
        seen += chunk.choices[0].delta.content or ""
        if seen:
            break
    assert seen == "Once upon"
    await stream.close()  # the client goes away mid-stream
    request = await chat.until_request()
    assert (await chat.request(request.id)).state == "cancelled"
    second = await worker.progress(job["id"], 2, " a time")
    assert second.status_code == 200
    assert second.json()["cancel"] is True
    # The worker stops and submits what it has; it is paid, and the request ends.
    assert (await worker.submit(job["id"], "Once upon")).json()["reward"] > 0
    status = (await chat.hc.status(request.id)).json()
    assert status["done"] is True
    assert await chat.active_holds() == 0


async def test_client_leaving_before_assignment_cancels_the_request(chat: Chat) -> None:
    key = await chat.hc.user("owner", kudos=100_000)
    big = {"max_completion_tokens": 8192, "max_context_tokens": 16384, "features": [], "image_transports": []}
    worker = chat.worker(key, "w1", chat=big)
    await worker.pop()  # online, but it does not pop again while the client waits
    # A funded request (over the free allowance), so its hold must be released too.
    client = chat.openai(key)
    asking = await in_background(client.chat.completions.create(model=MODEL, messages=HI, max_tokens=8000))
    request = await chat.until_request()
    assert await chat.active_holds() == 1
    asking.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await settled(asking)
    assert (await chat.request(request.id)).state == "cancelled"
    assert await chat.active_holds() == 0
    assert (await worker.pop())["id"] is None


async def test_a_waiting_call_cancelled_twice_still_cancels_its_request(chat: Chat) -> None:
    """A stopping server cancels a waiting call, and its event loop's teardown may cancel it again
    while it is cancelling its request: the request is cancelled all the same (the abandon runs in
    a task of its own, which the app waits for before it closes the database)."""
    key = await chat.hc.user("owner", kudos=100_000)
    big = {"max_completion_tokens": 8192, "max_context_tokens": 16384, "features": [], "image_transports": []}
    worker = chat.worker(key, "w1", chat=big)
    await worker.pop()
    asking = await in_background(
        chat.openai(key).chat.completions.create(model=MODEL, messages=HI, max_tokens=8000)
    )
    request = await chat.until_request()
    assert await chat.active_holds() == 1
    (handler,) = chat.handlers()
    handler.cancel()
    await asyncio.sleep(0)  # the call starts cancelling its request
    handler.cancel()
    with contextlib.suppress(asyncio.CancelledError, openai.APIError):
        await settled(asking)
    assert await chat.horde.drain(within=PATIENCE) == 0
    assert (await chat.request(request.id)).state == "cancelled"
    assert await chat.active_holds() == 0


async def test_a_call_cancelled_at_any_moment_leaves_no_request_waiting(
    db_url: str, clock: ManualClock
) -> None:
    """Cancelled a little later each time (before, during and after its admission, whose commit a
    cancel may follow before the call resumes), a call never leaves a request waiting or a hold
    placed: what it created is cancelled. It stops once a call was cancelled while it waited.

    The step grows with the delay (1 ms steps to 10 ms, then a tenth of the delay), so a loaded
    machine, whose admissions take longer, reaches them in tens of calls, not hundreds; the calls
    are many, so the create limit is off (it would answer 429 and the loop would never end)."""
    settings = make_settings(db_url, ratelimit={"create_per_minute": 0})
    async with open_chat(settings, clock) as chat:
        key = await chat.hc.user("owner", kudos=1_000_000)
        big = {
            "max_completion_tokens": 8192,
            "max_context_tokens": 16384,
            "features": [],
            "image_transports": [],
        }
        await chat.worker(key, "w1", chat=big).pop()
        delay, after_admission = 0.0, 0
        while after_admission < 3:  # a few cancels after the request was visible, then stop
            before = len(await chat.requests())
            asking = await in_background(
                chat.openai(key).chat.completions.create(model=MODEL, messages=HI, max_tokens=8000)
            )
            await asyncio.sleep(delay)
            after_admission += len(await chat.requests()) > before
            for handler in chat.handlers():
                handler.cancel()
            with contextlib.suppress(asyncio.CancelledError, openai.APIError):
                await settled(asking)
            assert await chat.horde.drain(within=PATIENCE) == 0
            left = [row.state for row in await chat.requests() if row.state != "cancelled"]
            assert left == [], f"cancelled after {delay * 1000:.0f} ms"
            assert await chat.active_holds() == 0
            delay += max(0.001, delay / 10)
            assert delay < PATIENCE


@pytest.mark.slow
async def test_a_lapse_before_any_output_restarts_the_job_silently(chat: Chat) -> None:
    # Another owner's worker: the one that lapsed refuses the request for all its owner's workers.
    first = chat.worker(await chat.hc.user("owner"), "first")
    second = chat.worker(await chat.hc.user("other"), "second")
    await first.pop()
    await second.pop()
    stream, job = await start_stream(chat, first)
    reading = await in_background(gather_stream(stream))
    chat.clock.advance(chat.horde.settings.lease.base_seconds + 1)  # the first worker never answers
    again = await second.serve("Second time lucky.")
    assert again["payload"] == job["payload"]
    chunks, error = await settled(reading)
    assert error is None
    assert joined(chunks) == "Second time lucky."
    late = await first.submit(job["id"], "too late")
    assert (late.status_code, late.json()["rc"]) == (400, "AbortedGen")
    request = await chat.until_request()
    assert (await chat.hc.status(request.id)).json()["restarted"] == 1


@pytest.mark.slow
async def test_a_waiting_call_reads_outside_transactions_until_it_meets_a_lapse(chat: Chat) -> None:
    """A waiting /v1 call reads its request at every wake-up outside any transaction (no write lock
    on SQLite, no BEGIN or COMMIT on PostgreSQL); only a read that meets a lapsed job goes on in a
    transaction, which gives the job back, and the call then follows the new one."""
    with statements_sent(chat.horde.engine) as sent:
        first = chat.worker(await chat.hc.user("owner"), "first")
        second = chat.worker(await chat.hc.user("other"), "second")
        await first.pop()
        await second.pop()
        stream, _job = await start_stream(chat, first)
        reading = await in_background(gather_stream(stream))
        chat.clock.advance(chat.horde.settings.lease.base_seconds + 1)
        await second.serve("After the lapse.")
        chunks, error = await settled(reading)
    # Per read of the call's jobs: outside a transaction?
    reads = [bool(s.options.get(READ_ONLY)) for s in sent if "ORDER BY generations.popped_at" in s.statement]
    assert (error, joined(chunks)) == (None, "After the lapse.")
    assert reads[0] is True, reads
    assert reads.count(False) >= 1, reads  # the read that met the lapse, in a transaction
    assert reads[-1] is True, reads


@pytest.mark.slow
async def test_a_lapse_after_output_ends_the_stream_with_an_error_event(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "w1")
    await worker.pop()
    popping = await in_background(worker.pop_job())
    body = {"model": MODEL, "messages": HI, "stream": True}
    async with chat.http.stream("POST", "/v1/chat/completions", json=body) as response:
        job = await settled(popping)
        assert (await worker.progress(job["id"], 1, "partial")).status_code == 200
        # Relayed before the lapse (a lapse before any output restarts the job silently).
        parts = response.aiter_text()
        text = await text_until(parts, "partial")
        chat.clock.advance(chat.horde.settings.lease.base_seconds + 1)
        text += "".join([part async for part in parts])
    events = [e for e in text.split("\n\n") if e]
    assert "partial" in text
    assert "[DONE]" not in text
    error = json.loads(events[-1].removeprefix("data: "))["error"]
    assert error["code"] == "worker_failed"
    assert error["type"] == "server_error"
    # The stream ended, so the request was cancelled rather than given to another worker.
    assert (await worker.pop())["id"] is None


async def test_tool_call_fragments_posted_after_the_last_read_reach_the_stream(chat: Chat) -> None:
    """The worker posts a second fragment and its result before the stream reads again: the
    closing chunk carries that fragment, so the client's call is whole (it was cut half-way)."""
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "tooly")
    await worker.pop()
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    body = msgspec.convert(
        {"model": MODEL, "messages": HI, "tools": tools, "stream": True}, ChatCompletionInput
    )
    front = await chat_front.create(chat.horde, Caller(apikey=None), to_payload(body), MODEL, stream=True)
    waiter = Waiter(chat.horde, front)
    events = waiter.events(keepalive=False)
    try:
        job = await worker.pop_job()
        function = {"name": "get_weather", "arguments": ""}
        start = {"index": 0, "id": "call_9", "type": "function", "function": function}
        assert (await worker.progress(job["id"], 1, tool_calls=[start])).status_code == 200
        first = await anext(events)
        assert isinstance(first, Delta)
        assert first.tool_calls is not None
        assert [c["index"] for c in first.tool_calls] == [0]
        # The stream is not reading now: the rest of the call and the result both come in.
        rest = {"index": 0, "function": {"arguments": '{"city": "Oslo"}'}}
        assert (await worker.progress(job["id"], 2, tool_calls=[rest])).status_code == 200
        whole = {
            "id": "call_9",
            "type": "function",
            "function": {**function, "arguments": '{"city": "Oslo"}'},
        }
        submitted = await worker.submit(job["id"], None, tool_calls=[whole], finish_reason="tool_calls")
        assert submitted.status_code == 200
        last = await anext(events)
        assert isinstance(last, Final)
        assert last.remainder is not None
        assert last.remainder.tool_calls == [{"index": 0, "function": {"arguments": '{"city": "Oslo"}'}}]
        fragments = [*first.tool_calls, *last.remainder.tool_calls]
        assert json.loads("".join(f["function"].get("arguments", "") for f in fragments)) == {"city": "Oslo"}
    finally:
        await events.aclose()
        waiter.close()


# --- bounds (jobs/output_bounds.py) --------------------------------------------------------------------


async def test_streamed_output_is_bounded_by_the_jobs_tokens(chat: Chat) -> None:
    """A job of 64 tokens streams at most 64 x 16 + 1024 characters, content and tool calls together:
    a post that would pass that is refused and changes nothing, a post that lands exactly on it is
    accepted, and the job stays the worker's to submit."""
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "w1")
    await worker.pop()
    stream, job = await start_stream(chat, worker, max_tokens=64)
    reading = await in_background(gather_stream(stream))
    bound = bounds.output_bound(64, chat.horde.settings)
    assert bound == 64 * 16 + 1024
    request = await chat.until_request()

    async def stored() -> tuple[int, int, list[Any]]:
        [generation] = await chat.generations(request.id)
        return generation.progress_seq, len(generation.progress_content), generation.progress_tool_calls

    hostile = await worker.progress(job["id"], 1, "x" * 3_900_000)  # the tester's 3.9 MB delta
    assert (hostile.status_code, hostile.json()["rc"]) == (400, "ProgressTooLong"), hostile.text
    assert str(bound) in hostile.json()["message"]
    over = await worker.progress(job["id"], 1, "x" * (bound + 1))
    assert (over.status_code, over.json()["rc"]) == (400, "ProgressTooLong")
    assert await stored() == (0, 0, [])
    under = await worker.progress(job["id"], 1, "x" * (bound - 1))
    assert under.status_code == 200, under.text
    past = await worker.progress(job["id"], 2, "yy")
    assert (past.status_code, past.json()["rc"]) == (400, "ProgressTooLong")
    # Tool calls count as their JSON: even an empty fragment does not fit in the one character left.
    fragment = {"index": 0, "id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}
    tools = await worker.progress(job["id"], 2, tool_calls=[fragment])
    assert (tools.status_code, tools.json()["rc"]) == (400, "ProgressTooLong")
    assert await stored() == (1, bound - 1, [])
    last = await worker.progress(job["id"], 2, "y")  # exactly at the bound
    assert last.status_code == 200, last.text
    assert (await worker.progress(job["id"], 3, "z")).json()["rc"] == "ProgressTooLong"
    assert (await worker.progress(job["id"], 2, "y")).status_code == 200  # a repeat, acknowledged
    assert await stored() == (2, bound, [])
    # Nothing was lost: the worker submits, the client gets the whole text.
    whole = "x" * (bound - 1) + "y"
    assert (await worker.submit(job["id"], whole)).status_code == 200
    chunks, error = await settled(reading)
    assert error is None
    assert joined(chunks) == whole


async def test_accumulated_tool_calls_are_bounded_too(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "w1")
    await worker.pop()
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    stream, job = await start_stream(chat, worker, max_tokens=16, tools=tools)
    reading = await in_background(gather_stream(stream))
    bound = bounds.output_bound(16, chat.horde.settings)
    start = {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}
    assert (await worker.progress(job["id"], 1, tool_calls=[start])).status_code == 200
    used = len(json.dumps(start, separators=(",", ":")))
    # Fragments of arguments: each is `{"index":0,"function":{"arguments":"..."}}` as JSON.
    frame = len(json.dumps({"index": 0, "function": {"arguments": ""}}, separators=(",", ":")))
    fill = bound - used - frame - 3  # the list's brackets and the comma between its two items
    fits = {"index": 0, "function": {"arguments": "a" * fill}}
    more = {"index": 0, "function": {"arguments": "a" * (fill + 1)}}
    refused = await worker.progress(job["id"], 2, tool_calls=[more])
    assert (refused.status_code, refused.json()["rc"]) == (400, "ProgressTooLong"), refused.text
    assert (await worker.progress(job["id"], 2, tool_calls=[fits])).status_code == 200
    [generation] = await chat.generations((await chat.until_request()).id)
    assert len(json.dumps(generation.progress_tool_calls, separators=(",", ":"))) == bound
    assert (await worker.progress(job["id"], 3, "x")).json()["rc"] == "ProgressTooLong"
    assert (await worker.submit(job["id"], "done")).status_code == 200
    await settled(reading)


@pytest.mark.slow
async def test_a_progress_flood_is_refused_with_retry_after_and_loses_nothing(chat: Chat) -> None:
    """At most progress_burst (32) posts at once, then progress_per_second (10) a second since the
    pop: the 33rd post at the pop's instant is a 429 with Retry-After; after a tenth of a second the
    same seq is accepted. Repeats are still acknowledged at the limit."""
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "w1")
    await worker.pop()
    stream, job = await start_stream(chat, worker, max_tokens=512)
    reading = await in_background(gather_stream(stream))
    settings = chat.horde.settings.chat
    assert (settings.progress_burst, settings.progress_per_second) == (32, 10)
    for seq in range(1, 33):
        answer = await worker.progress(job["id"], seq, f"{seq},")
        assert answer.status_code == 200, (seq, answer.text)
    flood = await worker.progress(job["id"], 33, "33,")
    assert (flood.status_code, flood.json()["rc"]) == (429, "ProgressTooFast"), flood.text
    assert flood.headers["Retry-After"] == "1"
    assert (await worker.progress(job["id"], 32, "32,")).status_code == 200  # a repeat
    [generation] = await chat.generations((await chat.until_request()).id)
    assert generation.progress_seq == 32
    chat.clock.advance(0.1)
    assert (await worker.progress(job["id"], 33, "33,")).status_code == 200
    assert (await worker.progress(job["id"], 34, "34,")).json()["rc"] == "ProgressTooFast"
    chat.clock.advance(10)  # 100 more posts allowed by now
    for seq in range(34, 134):
        assert (await worker.progress(job["id"], seq, f"{seq},")).status_code == 200, seq
    late = await worker.progress(job["id"], 134, "134,")
    assert late.status_code == 429
    assert late.headers["Retry-After"] == "1"
    whole = "".join(f"{seq}," for seq in range(1, 134))
    assert (await worker.submit(job["id"], whole)).status_code == 200
    chunks, error = await settled(reading)
    assert error is None
    assert joined(chunks) == whole


async def test_a_job_takes_at_most_its_tokens_plus_16_progress_posts(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "w1")
    await worker.pop()
    stream, job = await start_stream(chat, worker, max_tokens=16)
    reading = await in_background(gather_stream(stream))
    most = 16 + bounds.PROGRESS_SLACK_POSTS
    for seq in range(1, most + 1):
        assert (await worker.progress(job["id"], seq, "a")).status_code == 200, seq
    chat.clock.advance(60)  # not a matter of pace: waiting does not help
    extra = await worker.progress(job["id"], most + 1, "a")
    assert (extra.status_code, extra.json()["rc"]) == (400, "TooManyProgressPosts"), extra.text
    assert (await worker.submit(job["id"], "a" * most)).status_code == 200
    chunks, error = await settled(reading)
    assert error is None
    assert joined(chunks) == "a" * most
