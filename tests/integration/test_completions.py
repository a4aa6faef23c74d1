"""POST /v1/completions end to end with the real `openai` package (docs/reference/chat_requests.md,
"POST /v1/completions"), and how waiting /v1 calls are woken (in process, and across two apps on
one PostgreSQL through LISTEN/NOTIFY). Every test runs on SQLite and on PostgreSQL unless marked."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from horde_lite.clock import ManualClock
from horde_lite.core.notify import JOBS_CHANNEL
from horde_lite.settings import Settings
from tests.conftest import is_postgres, make_settings
from tests.support.chat import MODEL, Chat, ChatWorker, along, collect, in_background, open_chat, settled
from tests.support.statements import statements_sent

PROMPT = "Once upon a time"
# A poll far longer than any wake-up (and shorter than a stream's keep-alive interval, which also
# makes a streaming waiter read): an answer that comes before it was woken by an event.
SLOW_POLL = 10.0
# Wake-up tests: no deadline (grace, queue timeout) may wake the waiter before the poll either.
WAKE_SETTINGS: dict[str, Any] = {
    "poll_seconds": SLOW_POLL,
    "grace_seconds": 600,
    "max_queue_wait_seconds": 600,
}


@pytest.fixture
async def chat(settings: Settings, clock: ManualClock) -> AsyncIterator[Chat]:
    async with open_chat(settings, clock) as opened:
        yield opened


def legacy_worker(chat: Chat, key: str, name: str = "legacy", **declarations: Any) -> ChatWorker:
    """A worker without a chat block: it takes legacy text jobs only."""
    return chat.worker(key, name, chat=None, **declarations)


async def serve_text(worker: ChatWorker, text: str) -> dict[str, Any]:
    """Take one legacy job and submit its text whole (legacy workers post no progress)."""
    job = await worker.pop_job()
    assert job["kind"] == "text", job
    submitted = await worker.hc.submit(worker.key, job["id"], text)
    assert submitted.status_code == 200, submitted.text
    return job


def error_of(e: openai.APIStatusError) -> dict[str, Any]:
    body = e.response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


async def refused(awaitable: Any) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        await settled(awaitable)
    return caught.value


# --- answers -----------------------------------------------------------------------------------


async def test_text_completion_maps_onto_a_legacy_request(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    worker = legacy_worker(chat, key)
    await worker.pop()
    reply = " there was a horde."
    raw, job = await along(
        chat.openai().completions.with_raw_response.create(
            model=MODEL,
            prompt=[PROMPT],
            max_tokens=100,
            temperature=0.5,
            top_p=0.9,
            stop="\n",
            seed=7,
            presence_penalty=0.1,
            user="ignored",
        ),
        serve_text(worker, reply),
    )
    answer = raw.parse()
    request_id = raw.headers["x-horde-request-id"]
    assert (answer.id, answer.object, answer.model) == (f"cmpl-{request_id}", "text_completion", MODEL)
    [choice] = answer.choices
    assert (choice.text, choice.index, choice.finish_reason, choice.logprobs) == (reply, 0, "stop", None)
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == math.ceil(len(PROMPT) / 3)
    assert answer.usage.completion_tokens == math.ceil(len(reply) / 4)
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    extra = answer.model_extra or {}
    assert extra["context_adjustments"] == []
    assert extra["kudos"] > 0
    # The worker got a legacy job: the prompt and the Kobold parameters the OpenAI fields map to.
    payload = job["payload"]
    assert payload["prompt"] == PROMPT
    assert (payload["max_length"], payload["temperature"], payload["top_p"]) == (100, 0.5, 0.9)
    assert (payload["stop_sequence"], payload["sampler_seed"], payload["n"]) == (["\n"], 7, 1)
    assert payload["max_context_length"] == math.ceil(len(PROMPT) / 3) + 100
    # The same request on the horde's status route.
    status = (await chat.hc.status(request_id)).json()
    assert status["done"] is True
    assert status["generations"][0]["text"] == reply


async def test_finish_reason_length_and_the_max_tokens_limits(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    worker = legacy_worker(chat, key, max_length=256)
    await worker.pop()
    # Below the horde's minimum of 16: raised, and said so; output that fills it is "length".
    answer, job = await along(
        chat.openai().completions.create(model=MODEL, prompt=PROMPT, max_tokens=5),
        serve_text(worker, "x" * 64),
    )
    assert job["payload"]["max_length"] == 16
    assert answer.choices[0].finish_reason == "length"
    [raised] = (answer.model_extra or {})["context_adjustments"]
    assert (raised["field"], raised["requested"], raised["applied"]) == ("max_tokens", 5, 16)
    # Above what any online worker for the model declares: lowered to it; absent: the default.
    answer, job = await along(
        chat.openai().completions.create(model=MODEL, prompt=PROMPT, max_tokens=1000),
        serve_text(worker, "ok"),
    )
    assert job["payload"]["max_length"] == 256
    assert answer.choices[0].finish_reason == "stop"
    [lowered] = (answer.model_extra or {})["context_adjustments"]
    assert (lowered["requested"], lowered["applied"]) == (1000, 256)
    _, job = await along(
        chat.openai().completions.create(model=MODEL, prompt=PROMPT), serve_text(worker, "ok")
    )
    assert job["payload"]["max_length"] == 256  # the default (512), lowered likewise


async def test_streamed_text_completion(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    worker = legacy_worker(chat, key)
    await worker.pop()
    reply = " the end."
    (chunks, error), _ = await along(
        collect(
            chat.openai().completions.create(
                model=MODEL, prompt=PROMPT, stream=True, stream_options={"include_usage": True}
            )
        ),
        serve_text(worker, reply),
    )
    assert error is None
    text_chunk, usage_chunk = chunks
    assert text_chunk.object == "text_completion"
    assert [(c.text, c.finish_reason) for c in text_chunk.choices] == [(reply, "stop")]
    assert text_chunk.usage is None
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == math.ceil(len(reply) / 4)
    assert text_chunk.id == usage_chunk.id
    assert text_chunk.id.startswith("cmpl-")


async def test_stream_wire_format(chat: Chat) -> None:
    """`data: {...}` events and a blank line each, no `event:`/`id:` lines, `data: [DONE]` last."""
    key = await chat.hc.user("owner")
    worker = legacy_worker(chat, key)
    await worker.pop()
    body = {"model": MODEL, "prompt": PROMPT, "stream": True}
    response, _ = await along(chat.http.post("/v1/completions", json=body), serve_text(worker, "abc"))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    text = response.text
    assert text.endswith("\n\ndata: [DONE]\n\n")
    events = [e for e in text.split("\n\n") if e and not e.startswith(":")]
    assert all(e.startswith("data: ") and "\n" not in e for e in events)
    [only] = [json.loads(e[6:]) for e in events[:-1]]
    assert only["choices"] == [{"text": "abc", "index": 0, "logprobs": None, "finish_reason": "stop"}]
    assert "usage" not in only


# --- refusals and failures ---------------------------------------------------------------------


async def test_refusals_take_the_openai_shape(chat: Chat) -> None:
    key = await chat.hc.user("owner", kudos=100_000)
    big = legacy_worker(chat, key, max_length=8192, max_context_length=16384)
    await big.pop()
    over = await refused(chat.openai().completions.create(model=MODEL, prompt=PROMPT, max_tokens=8192))
    assert over.status_code == 403
    assert isinstance(over, openai.PermissionDeniedError)
    error = error_of(over)
    assert (error["code"], error["type"]) == ("kudos_upfront", "insufficient_quota")
    assert "4096 tokens" in error["message"]
    unknown = await refused(chat.openai().completions.create(model="no/such-model", prompt=PROMPT))
    assert (unknown.status_code, error_of(unknown)["code"], error_of(unknown)["param"]) == (
        404,
        "model_not_found",
        "model",
    )
    two = await refused(chat.openai().completions.create(model=MODEL, prompt=PROMPT, n=2))
    assert (two.status_code, error_of(two)["param"]) == (400, "n")
    long = await refused(chat.openai().completions.create(model=MODEL, prompt="x" * 3 * 16384))
    assert (long.status_code, error_of(long)["code"], error_of(long)["param"]) == (
        400,
        "context_length_exceeded",
        "prompt",
    )

    async def post(body: Any) -> tuple[int, dict[str, Any]]:
        response = await chat.http.post("/v1/completions", json=body)
        return response.status_code, response.json()["error"]

    status, error = await post({"model": MODEL, "prompt": [PROMPT, PROMPT]})
    assert (status, error["param"]) == (400, "prompt")
    status, error = await post({"model": MODEL, "prompt": PROMPT, "max_tokens": "many"})
    assert (status, error["param"], error["type"]) == (400, "max_tokens", "invalid_request_error")
    status, error = await post({"model": MODEL, "prompt": PROMPT, "max_tokens": 100_000})
    assert (status, error["param"]) == (400, "max_tokens")
    status, error = await post({"model": MODEL, "prompt": "  "})
    assert status == 400
    bad_key = await chat.http.post(
        "/v1/completions", json={"model": MODEL, "prompt": PROMPT}, headers={"Authorization": "Bearer nope"}
    )
    assert (bad_key.status_code, bad_key.json()["error"]["code"]) == (401, "invalid_api_key")
    assert await chat.requests() == []  # nothing refused left a request behind


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
async def test_no_eligible_worker_after_the_grace(chat: Chat, stream: bool) -> None:
    key = await chat.hc.user("owner")
    await legacy_worker(chat, key).pop()
    chat.clock.advance(chat.horde.settings.worker.online_seconds + 1)  # known model, worker offline
    asking = await in_background(chat.openai().completions.create(model=MODEL, prompt=PROMPT, stream=stream))  # type: ignore[call-overload]
    request = await chat.until_request()
    chat.clock.advance(chat.horde.settings.chat.grace_seconds + 1)
    failure = await refused(asking)
    assert failure.status_code == 503  # a real status even when streaming: nothing was sent before
    assert error_of(failure)["code"] == "no_eligible_worker"
    assert (await chat.request(request.id)).state == "cancelled"


@pytest.mark.slow
async def test_queue_timeout(db_url: str, clock: ManualClock) -> None:
    async with open_chat(make_settings(db_url, chat={"max_queue_wait_seconds": 5}), clock) as chat:
        key = await chat.hc.user("owner")
        await legacy_worker(chat, key).pop()  # online and able, but it never pops again
        asking = await in_background(chat.openai().completions.create(model=MODEL, prompt=PROMPT))
        request = await chat.until_request()
        chat.clock.advance(6)
        failure = await refused(asking)
        assert (failure.status_code, error_of(failure)["code"]) == (503, "queue_timeout")
        assert failure.response.headers["x-should-retry"] == "false"
        assert (await chat.request(request.id)).state == "cancelled"


# --- waking ------------------------------------------------------------------------------------


async def before_the_poll(call: Any) -> Any:
    """The result of `call`, which must come before one slow poll interval has passed since the
    call began (the interval starts first, so the waiter's own poll can only come after it): only
    a wake-up can have made the waiting call read its request in time."""
    poll = asyncio.ensure_future(asyncio.sleep(SLOW_POLL))
    answer = asyncio.ensure_future(call)
    try:
        done, _ = await asyncio.wait({answer, poll}, return_when=asyncio.FIRST_COMPLETED)
        assert answer in done, "the waiting call was not woken: it would have waited for the poll"
        return answer.result()
    finally:
        for task in (answer, poll):
            task.cancel()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_waiting_call_is_woken_by_the_pop_and_the_submit(
    db_url: str, clock: ManualClock, stream: bool
) -> None:
    async with open_chat(make_settings(db_url, chat=WAKE_SETTINGS), clock) as chat:
        key = await chat.hc.user("owner")
        worker = legacy_worker(chat, key)
        await worker.pop()
        asking = await in_background(
            before_the_poll(
                collect(chat.openai().completions.create(model=MODEL, prompt=PROMPT, stream=True))
                if stream
                else chat.openai().completions.create(model=MODEL, prompt=PROMPT)
            )
        )
        await chat.until_request()
        await serve_text(worker, "woken")
        answer = await settled(asking)
        chunks = answer[0] if stream else [answer]
        assert chunks[-1].choices[0].text == "woken"


@pytest.mark.parametrize("front", ["chat", "text"])
async def test_two_apps_wake_each_other_through_listen_notify(
    db_url: str, clock: ManualClock, front: str
) -> None:
    """Two server processes on one PostgreSQL (two apps, two notifiers): the worker pops and submits
    through one, the client waits on the other, which only LISTEN/NOTIFY can wake in time."""
    if not is_postgres(db_url):
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; processes on one SQLite file meet at the poll")
    settings = make_settings(db_url, chat=WAKE_SETTINGS)
    async with open_chat(settings, clock) as waiting, open_chat(settings, clock) as working:
        assert waiting.horde.notifier is not working.horde.notifier
        for app in (waiting, working):
            await settled(app.horde.notifier.listening.wait())
        key = await working.hc.user("owner")
        if front == "chat":
            worker = working.worker(key, "w1")
            await worker.pop()
            hi = [{"role": "user", "content": "Hi"}]
            asking = await in_background(
                before_the_poll(waiting.openai().chat.completions.create(model=MODEL, messages=hi))
            )
            await working.until_request()
            await worker.serve("from the other process")
            answer = await settled(asking)
            assert answer.choices[0].message.content == "from the other process"
        else:
            worker = legacy_worker(working, key)
            await worker.pop()
            asking = await in_background(
                before_the_poll(waiting.openai().completions.create(model=MODEL, prompt=PROMPT))
            )
            await working.until_request()
            await serve_text(worker, "from the other process")
            answer = await settled(asking)
            assert answer.choices[0].text == "from the other process"


async def test_only_requests_a_v1_client_waits_on_are_announced_across_processes(
    db_url: str, clock: ManualClock
) -> None:
    """A native-route request (its client polls the status route) is popped and submitted without a
    NOTIFY, which would wake no one; a /v1 request's pop and submit send one each."""
    if not is_postgres(db_url):
        pytest.skip("NOTIFY is PostgreSQL's; SQLite sends none")
    async with open_chat(make_settings(db_url, chat=WAKE_SETTINGS), clock) as app:
        key = await app.hc.user("owner")
        worker = legacy_worker(app, key)
        await worker.pop()
        with statements_sent(app.horde.engine) as sent:
            created = await app.hc.create(models=[MODEL], params={"max_length": 16})
            assert created.status_code == 202, created.text
            # The admission tells the waiting pops of every process (jobs/pop_waiters.py), once.
            assert len([s for s in sent if JOBS_CHANNEL in s.statement]) == 1
            sent.clear()
            await serve_text(worker, "for the status route")
            assert [s for s in sent if "pg_notify" in s.statement] == []
            asking = await in_background(app.openai().completions.create(model=MODEL, prompt=PROMPT))
            await app.until_request()
            await serve_text(worker, "for the waiting client")
            assert (await settled(asking)).choices[0].text == "for the waiting client"
        notified = [s for s in sent if "pg_notify" in s.statement and JOBS_CHANNEL not in s.statement]
        assert len(notified) == 2  # its pop and its submit
