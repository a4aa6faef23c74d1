"""Chat requests end to end with the real `openai` package (docs/reference/chat_requests.md,
including the speed gate of decision 0001 and the free output allowance of decision 0002). Every
test runs on SQLite and on PostgreSQL; the chat worker is driven over HTTP in a concurrent task
while the client waits (see tests/support/chat.py for why a streaming transport)."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from sqlalchemy import event
from sqlalchemy.util import await_only

from horde_lite.clock import ManualClock
from horde_lite.db.engine import READ_ONLY
from horde_lite.requests.prices import context_multiplier
from horde_lite.settings import Settings
from tests.conftest import make_settings
from tests.support.chat import (
    CHAT_BLOCK,
    MODEL,
    Chat,
    along,
    collect,
    gather_stream,
    in_background,
    joined,
    open_chat,
    settled,
    text_until,
)
from tests.support.horde import ANON, quote
from tests.support.prom import value

HI = [{"role": "user", "content": "Hi there"}]
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
PNG_DATA = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
PNG_URL = "https://example.com/cat.png"


def image_message(url: str) -> list[dict[str, Any]]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
    ]


@pytest.fixture
async def chat(settings: Settings, clock: ManualClock) -> AsyncIterator[Chat]:
    async with open_chat(settings, clock) as opened:
        yield opened


async def raised(awaitable: Any) -> openai.APIStatusError:
    """The APIStatusError an openai call ends with (the test fails if it succeeds)."""
    with pytest.raises(openai.APIStatusError) as caught:
        await settled(awaitable)
    return caught.value


def error_of(e: openai.APIStatusError) -> dict[str, Any]:
    body = e.response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


# --- answers -----------------------------------------------------------------------------------


async def test_non_streaming_completion(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "w1")
    await worker.pop()
    messages = [{"role": "system", "content": "Be brief."}, *HI]
    raw, job = await along(
        chat.openai().chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=100, temperature=0.5, top_p=0.9, stop=["\n\n"], seed=7
        ),
        worker.serve("Hello from the worker."),
    )
    answer = raw.parse()

    request_id = raw.headers["x-horde-request-id"]
    assert answer.id == f"chatcmpl-{request_id}"
    assert answer.object == "chat.completion"
    assert answer.model == MODEL
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == "Hello from the worker."
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (11, 6)
    assert answer.usage.total_tokens == 17
    extra = answer.model_extra or {}
    assert extra["context_adjustments"] == []
    assert extra["kudos"] > 0
    # The worker got a chat job with the messages and the chat parameters.
    assert (job["kind"], job["stream"], job["model"]) == ("chat", False, MODEL)
    payload = job["payload"]
    assert payload["messages"] == messages
    assert (payload["max_tokens"], payload["temperature"], payload["top_p"]) == (100, 0.5, 0.9)
    assert (payload["stop"], payload["seed"]) == (["\n\n"], 7)
    # The same request on the horde's status route: the generation's text is the message content.
    status = (await chat.hc.status(request_id)).json()
    assert status["done"] is True
    assert status["generations"][0]["text"] == "Hello from the worker."


async def test_a_submit_landing_while_the_client_reads_is_answered_with_its_cost(
    db_url: str, clock: ManualClock
) -> None:
    """The waiter reads outside a transaction. A submit that commits right after its read of the
    request must not show up as a finished job beside the request's cost before the charge: the
    answer's `kudos` is what the request was charged. The real submit runs, over HTTP, at the end of
    the waiter's first statement that reads the request (from inside the driver's call)."""
    settings = make_settings(db_url, chat={"poll_seconds": 0.05})
    async with open_chat(settings, clock) as chat:
        key = await chat.hc.user("owner")
        worker = chat.worker(key, "w1")
        await worker.pop()
        asking = await in_background(chat.openai().chat.completions.create(model=MODEL, messages=HI))
        job = await worker.pop_job()
        submitted: list[int] = []

        def submit_after_the_read(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            reading = conn.get_execution_options().get(READ_ONLY)
            if submitted or not reading or "FROM text_requests" not in statement:
                return
            usage = {"prompt_tokens": 11, "completion_tokens": 2}
            submitted.append(await_only(worker.submit(job["id"], "late", usage=usage)).status_code)

        engine = chat.horde.engine.sync_engine
        event.listen(engine, "after_cursor_execute", submit_after_the_read)
        try:
            answer = await settled(asking)
        finally:
            event.remove(engine, "after_cursor_execute", submit_after_the_read)
        assert submitted == [200]
        assert answer.choices[0].message.content == "late"
        charged = (await chat.hc.status(answer.id.removeprefix("chatcmpl-"))).json()["kudos"]
        assert charged > 0
        assert (answer.model_extra or {})["kudos"] == charged


async def test_default_max_tokens_when_absent(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "w1")
    await worker.pop()
    _, job = await along(chat.openai().chat.completions.create(model=MODEL, messages=HI), worker.serve("ok"))
    assert job["payload"]["max_tokens"] == chat.horde.settings.chat.default_max_tokens == 512


async def test_streaming_with_usage(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "w1")
    await worker.pop()
    reply = "Streaming works, piece by piece."
    (chunks, error), job = await along(
        collect(
            chat.openai().chat.completions.create(
                model=MODEL, messages=HI, stream=True, stream_options={"include_usage": True}
            )
        ),
        worker.serve(reply),
    )

    assert error is None
    assert job["stream"] is True
    assert joined(chunks) == reply
    assert chunks[0].choices[0].delta.role == "assistant"
    assert (chunks[0].model_extra or {})["context_adjustments"] == []
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason is not None]
    assert [c.choices[0].finish_reason for c in finals] == ["stop"]
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == math.ceil(len(reply) / 4)
    assert usage_chunk.usage.total_tokens == 11 + math.ceil(len(reply) / 4)
    assert all(c.usage is None for c in chunks[:-1])
    assert {c.id for c in chunks} == {chunks[0].id}
    assert all(c.object == "chat.completion.chunk" for c in chunks)


async def test_stream_wire_format(chat: Chat) -> None:
    """Events are `data: {...}` separated by a blank line and end with `data: [DONE]`; without
    include_usage there is no usage chunk."""
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "w1")
    await worker.pop()
    body = {"model": MODEL, "messages": HI, "stream": True}

    async def read() -> str:
        async with chat.http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            return (await response.aread()).decode()

    text, _ = await along(read(), worker.serve("abc def ghi"))
    assert text.endswith("data: [DONE]\n\n")
    events = [e for e in text.split("\n\n") if e and not e.startswith(":")]
    assert all(e.startswith("data: ") for e in events)
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "abc def ghi"
    assert all(c["choices"] for c in chunks)
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_the_submitted_message_is_final(chat: Chat) -> None:
    """The stream relays progress; the submit completes it; the non-streamed record is the submit."""
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "w1")
    await worker.pop()
    creating = await in_background(
        chat.openai().chat.completions.create(model=MODEL, messages=HI, stream=True)
    )
    job = await worker.pop_job()
    stream = await settled(creating)
    reading = await in_background(gather_stream(stream))
    assert (await worker.progress(job["id"], 1, "The answer")).status_code == 200
    assert (await worker.submit(job["id"], "The answer is 42.", finish_reason="length")).status_code == 200
    chunks, error = await settled(reading)
    assert error is None
    assert joined(chunks) == "The answer is 42."
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "length"
    ]


# --- tools, vision, requirements ---------------------------------------------------------------


async def test_tools_round_trip(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "tooly")
    await worker.pop()
    client = chat.openai()

    async def call_the_tool() -> dict[str, Any]:
        job = await worker.pop_job()
        call = {
            "id": "call_abc",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
        response = await worker.submit(job["id"], None, tool_calls=[call], finish_reason="tool_calls")
        assert response.status_code == 200, response.text
        return job

    first, job = await along(
        client.chat.completions.create(model=MODEL, messages=HI, tools=TOOLS, tool_choice="auto"),  # type: ignore[arg-type]
        call_the_tool(),
    )
    assert job["payload"]["tools"] == TOOLS
    assert job["payload"]["tool_choice"] == "auto"
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert message.content is None
    assert message.tool_calls is not None
    call = message.tool_calls[0]
    assert call.id == "call_abc"
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]

    # The tool's result goes back with the conversation; the worker sees all of it.
    tool_result = {"role": "tool", "tool_call_id": "call_abc", "content": "18 C, sunny"}
    history = [*HI, message.model_dump(exclude_none=True), tool_result]
    second, job = await along(
        client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS),  # type: ignore[arg-type]
        worker.serve("It is 18 C and sunny in Paris."),
    )
    sent = job["payload"]["messages"]
    assert sent[1]["role"] == "assistant"
    assert sent[1]["tool_calls"][0]["id"] == "call_abc"
    assert sent[2] == tool_result
    assert second.choices[0].message.content == "It is 18 C and sunny in Paris."
    assert second.choices[0].finish_reason == "stop"


async def _next_tool_calls(stream: Any) -> list[Any]:
    """The tool-call fragments of the stream's next chunk that carries any."""
    while True:
        chunk = await settled(anext(stream))
        if chunk.choices and chunk.choices[0].delta.tool_calls:
            return list(chunk.choices[0].delta.tool_calls)


async def test_streamed_tool_calls(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "tooly")
    await worker.pop()
    creating = await in_background(
        chat.openai().chat.completions.create(model=MODEL, messages=HI, tools=TOOLS, stream=True)  # type: ignore[arg-type]
    )
    job = await worker.pop_job()
    stream = await settled(creating)
    start = {
        "index": 0,
        "id": "call_9",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    rest = {"index": 0, "function": {"arguments": '{"city": "Oslo"}'}}
    # Each fragment is read off the stream before the next is posted: relayed as posted.
    assert (await worker.progress(job["id"], 1, tool_calls=[start])).status_code == 200
    [first] = await _next_tool_calls(stream)
    assert (first.index, first.id, first.type) == (0, "call_9", "function")
    assert first.function is not None
    assert (first.function.name, first.function.arguments) == ("get_weather", "")
    assert (await worker.progress(job["id"], 2, tool_calls=[rest])).status_code == 200
    [second] = await _next_tool_calls(stream)
    assert second.index == 0
    assert second.function is not None
    assert json.loads(second.function.arguments or "") == {"city": "Oslo"}
    whole = {
        "id": "call_9",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    assert (
        await worker.submit(job["id"], None, tool_calls=[whole], finish_reason="tool_calls")
    ).status_code == 200
    # The submit's whole call is not sent again: the client already has it, fragment by fragment.
    chunks, error = await settled(gather_stream(stream))
    assert error is None
    assert [t for c in chunks if c.choices for t in (c.choices[0].delta.tool_calls or [])] == []
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_a_tool_call_submitted_before_the_stream_read_any_arrives_whole(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "tooly")
    await worker.pop()
    creating = await in_background(
        chat.openai().chat.completions.create(model=MODEL, messages=HI, tools=TOOLS, stream=True)  # type: ignore[arg-type]
    )
    job = await worker.pop_job()
    stream = await settled(creating)
    whole = {
        "id": "call_9",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    assert (
        await worker.submit(job["id"], None, tool_calls=[whole], finish_reason="tool_calls")
    ).status_code == 200
    chunks, error = await settled(gather_stream(stream))
    assert error is None
    fragments = [t for c in chunks if c.choices for t in (c.choices[0].delta.tool_calls or [])]
    assert [(f.index, f.id) for f in fragments] == [(0, "call_9")]
    assert fragments[0].function is not None
    assert fragments[0].function.name == "get_weather"
    assert json.loads(fragments[0].function.arguments or "") == {"city": "Oslo"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.slow
async def test_a_worker_without_tools_never_gets_a_tools_request(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    plain = chat.worker(key, "plain", chat={**CHAT_BLOCK, "features": []})
    await plain.pop()
    # On /v1, with only that worker online: 503 no_eligible_worker after the grace, naming the gap.
    asking = await in_background(chat.openai().chat.completions.create(model=MODEL, messages=HI, tools=TOOLS))  # type: ignore[arg-type]
    request = await chat.until_request()
    assert (await plain.pop())["id"] is None
    chat.clock.advance(3)
    error = error_of(await raised(asking))
    assert error["code"] == "no_eligible_worker"
    assert "tools" in error["message"]
    assert (await chat.request(request.id)).state == "cancelled"
    # On the native route the request queues: the plain worker still never gets it, a tools worker does.
    created = await chat.hc.create(key, models=[MODEL], chat={"messages": HI, "tools": TOOLS})
    assert created.status_code == 202, created.text
    assert (await plain.pop())["id"] is None
    tooly = chat.worker(key, "tooly")
    job = await tooly.pop()
    assert job["payload"]["tools"] == TOOLS
    # tool_choice "none" requires no tools: any chat worker may take it.
    await chat.hc.create(key, models=[MODEL], chat={"messages": HI, "tools": TOOLS, "tool_choice": "none"})
    assert (await plain.pop())["payload"]["tool_choice"] == "none"


async def test_image_parts_need_vision_and_the_right_transport(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    base64_only = chat.worker(
        key, "b64", chat={**CHAT_BLOCK, "features": ["vision"], "image_transports": ["base64"]}
    )
    url_only = chat.worker(
        key, "urls", chat={**CHAT_BLOCK, "features": ["vision"], "image_transports": ["url"]}
    )
    blind = chat.worker(
        key, "blind", chat={**CHAT_BLOCK, "features": [], "image_transports": ["url", "base64"]}
    )
    for worker in (base64_only, url_only, blind):
        await worker.pop()
    quote = await chat.http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": image_message(PNG_URL), "dry_run": True}
    )
    assert quote.json()["requirements"] == {"features": ["vision"], "image_transports": ["url"]}
    assert quote.json()["eligible_workers"] == 1
    # Queued on the native route (a URL image first, then a data: image).
    for url in (PNG_URL, PNG_DATA):
        created = await chat.hc.create(key, models=[MODEL], chat={"messages": image_message(url)})
        assert created.status_code == 202, created.text
    assert (await blind.pop())["id"] is None
    job = await base64_only.pop()
    assert job["payload"]["messages"][0]["content"][1]["image_url"]["url"] == PNG_DATA
    assert (await base64_only.pop())["id"] is None  # never the URL image
    job = await url_only.pop()
    assert job["payload"]["messages"][0]["content"][1]["image_url"]["url"] == PNG_URL
    # Through /v1: a data: image is served by the base64 worker.
    answer, _ = await along(
        chat.openai().chat.completions.create(model=MODEL, messages=image_message(PNG_DATA)),  # type: ignore[arg-type]
        base64_only.serve("A single pixel."),
    )
    assert answer.choices[0].message.content == "A single pixel."


# --- no worker, busy workers, failures ---------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
async def test_no_eligible_worker_after_the_grace(chat: Chat, stream: bool) -> None:
    key = await chat.hc.user("owner", kudos=1000)
    worker = chat.worker(key, "blind")  # no vision
    await worker.pop()
    asking = await in_background(
        chat.openai(key).chat.completions.create(model=MODEL, messages=image_message(PNG_URL), stream=stream)  # type: ignore[call-overload]
    )
    request = await chat.until_request()
    # The model stays listed: its worker is online, it just cannot take this request.
    assert [m.id for m in (await chat.openai().models.list()).data] == [MODEL]
    chat.clock.advance(chat.horde.settings.chat.grace_seconds + 1)
    failure = await raised(asking)
    assert failure.status_code == 503  # a real status, even when streaming: nothing was sent before
    assert error_of(failure)["code"] == "no_eligible_worker"
    assert failure.response.headers["x-should-retry"] == "false"
    assert int(failure.response.headers["retry-after"]) > 0
    assert (await chat.request(request.id)).state == "cancelled"
    assert await chat.active_holds() == 0
    assert (await worker.pop())["id"] is None


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
async def test_queue_timeout(db_url: str, clock: ManualClock, stream: bool) -> None:
    settings = make_settings(db_url, chat={"max_queue_wait_seconds": 5})
    async with open_chat(settings, clock) as chat:
        key = await chat.hc.user("owner")
        worker = chat.worker(key, "busy")
        await worker.pop()  # online and capable, but it never pops again
        asking = await in_background(
            chat.openai().chat.completions.create(model=MODEL, messages=HI, stream=stream)  # type: ignore[call-overload]
        )
        request = await chat.until_request()
        chat.clock.advance(6)
        failure = await raised(asking)
        assert failure.status_code == 503
        assert error_of(failure)["code"] == "queue_timeout"
        assert failure.response.headers["x-should-retry"] == "false"
        assert "retry-after" in failure.response.headers
        assert (await chat.request(request.id)).state == "cancelled"
        assert (await worker.pop())["id"] is None


@pytest.mark.slow
async def test_unknown_model_is_404_and_an_offline_model_waits_the_grace(chat: Chat) -> None:
    """model_not_found means no chat worker declares the model at all; a model whose chat workers
    are all offline is known, so the request waits the grace and gets no_eligible_worker."""
    key = await chat.hc.user("owner")
    failure = await raised(chat.openai().chat.completions.create(model="no/such-model", messages=HI))
    assert failure.status_code == 404
    assert error_of(failure) | {"message": ""} == {
        "message": "",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    # A model only legacy (non-chat) workers serve is not a chat model either.
    legacy = await chat.hc.pop(key, "legacy", models=["legacy-13B"])
    assert legacy.status_code == 200
    failure = await raised(chat.openai().chat.completions.create(model="legacy-13B", messages=HI))
    assert error_of(failure)["code"] == "model_not_found"
    # Known but offline.
    await chat.worker(key, "w1").pop()
    chat.clock.advance(chat.horde.settings.worker.online_seconds + 1)
    assert (await chat.openai().models.list()).data == []
    asking = await in_background(chat.openai().chat.completions.create(model=MODEL, messages=HI))
    await chat.until_request()
    chat.clock.advance(3)
    failure = await raised(asking)
    assert failure.status_code == 503
    error = error_of(failure)
    assert error["code"] == "no_eligible_worker"
    assert "no online chat worker serves" in error["message"]
    assert await chat.requests() != []  # it was admitted, then cancelled
    assert {r.state for r in await chat.requests()} == {"cancelled"}


async def test_worker_failures_end_in_502(chat: Chat) -> None:
    # A request is given up only when the workers of more than max_failures DISTINCT owners failed it.
    failures = chat.horde.settings.request.max_failures + 1
    workers = [chat.worker(await chat.hc.user(f"owner{i}"), f"flaky{i}") for i in range(failures)]
    for worker in workers:
        await worker.pop()

    async def fail_every_time() -> None:
        for worker in workers:
            job = await worker.pop_job()
            response = await worker.submit(job["id"], None, state="faulted")
            assert response.status_code == 200, response.text

    failure, _ = await along(
        raised(chat.openai().chat.completions.create(model=MODEL, messages=HI)), fail_every_time()
    )
    assert failure.status_code == 502
    assert error_of(failure)["code"] == "worker_failed"
    assert [r.state for r in await chat.requests()] == ["faulted"]


async def test_fault_after_output_ends_the_stream_with_an_error_event(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "flaky")
    await worker.pop()
    popping = await in_background(worker.pop_job())
    async with chat.http.stream(
        "POST", "/v1/chat/completions", json={"model": MODEL, "messages": HI, "stream": True}
    ) as response:
        job = await settled(popping)
        assert (await worker.progress(job["id"], 1, "Half an ans")).status_code == 200
        # Relayed before the fault (a fault before any output restarts the job silently).
        parts = response.aiter_text()
        text = await text_until(parts, "Half an ans")
        assert (await worker.submit(job["id"], None, state="faulted")).status_code == 200
        text += "".join([part async for part in parts])
    assert response.status_code == 200
    events = [e for e in text.split("\n\n") if e]
    assert "Half an ans" in text
    assert "[DONE]" not in text
    last = json.loads(events[-1][6:])
    assert last["error"]["code"] == "worker_failed"
    assert set(last["error"]) == {"message", "type", "param", "code"}
    # The request was cancelled: nobody gets the job again.
    assert (await worker.pop())["id"] is None


# --- errors ------------------------------------------------------------------------------------


async def test_errors_take_the_openai_shape(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    await chat.worker(key, "w1").pop()

    async def post(body: Any, **kwargs: Any) -> dict[str, Any]:
        response = await chat.http.post("/v1/chat/completions", **({"json": body} | kwargs))
        payload = response.json()
        assert set(payload) == {"error"}, payload
        assert set(payload["error"]) == {"message", "type", "param", "code"}
        return {"status": response.status_code, **payload["error"]}

    malformed = await post(None, content=b"{not json", headers={"content-type": "application/json"})
    assert (malformed["status"], malformed["type"]) == (400, "invalid_request_error")
    missing_model = await post({"messages": HI})
    assert (missing_model["status"], missing_model["type"]) == (400, "invalid_request_error")
    assert "model" in missing_model["message"]
    wrong_type = await post({"model": MODEL, "messages": HI, "max_tokens": "many"})
    assert (wrong_type["status"], wrong_type["param"]) == (400, "max_tokens")
    too_hot = await post({"model": MODEL, "messages": HI, "temperature": 5})
    assert (too_hot["status"], too_hot["param"]) == (400, "temperature")
    no_messages = await post({"model": MODEL, "messages": []})
    assert no_messages["status"] == 400
    two = await post({"model": MODEL, "messages": HI, "n": 2})
    assert (two["status"], two["param"], two["type"]) == (400, "n", "invalid_request_error")
    ftp = await post({"model": MODEL, "messages": image_message("ftp://example.com/x.png")})
    assert (ftp["status"], ftp["param"]) == (400, "messages")
    audio = [
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}
    ]
    assert (await post({"model": MODEL, "messages": audio}))["status"] == 400
    long = [{"role": "user", "content": "x" * 3 * CHAT_BLOCK["max_context_tokens"]}]
    overflow = await post({"model": MODEL, "messages": long})
    assert (overflow["status"], overflow["code"], overflow["param"]) == (
        400,
        "context_length_exceeded",
        "messages",
    )
    bad_key = await post({"model": MODEL, "messages": HI}, headers={"Authorization": "Bearer not-a-key"})
    assert (bad_key["status"], bad_key["code"], bad_key["type"]) == (
        401,
        "invalid_api_key",
        "authentication_error",
    )
    huge = await post(None, content=b'{"model": "' + b"x" * (5 * 1024 * 1024) + b'"}')
    assert (huge["status"], huge["code"]) == (413, "request_too_large")
    # Routes that do not exist and wrong methods are OpenAI-shaped too.
    nowhere = await chat.http.get("/v1/nowhere")
    assert nowhere.status_code == 404
    assert set(nowhere.json()["error"]) == {"message", "type", "param", "code"}
    wrong_method = await chat.http.get("/v1/chat/completions")
    assert wrong_method.status_code == 405
    assert "error" in wrong_method.json()
    # The openai package reads them as its own error classes.
    with pytest.raises(openai.BadRequestError) as caught:
        await chat.openai().chat.completions.create(model=MODEL, messages=HI, n=2)
    assert caught.value.code == "invalid_request_error"
    assert caught.value.param == "n"
    with pytest.raises(openai.AuthenticationError):
        await chat.openai("0123456789abcdefghijkl").chat.completions.create(model=MODEL, messages=HI)
    assert await chat.requests() == []  # nothing refused left a request behind


async def test_anonymous_request_above_the_allowance_is_403_kudos_upfront(chat: Chat) -> None:
    key = await chat.hc.user("owner", kudos=100_000)
    big = chat.worker(
        key, "big", chat={**CHAT_BLOCK, "max_completion_tokens": 16384, "max_context_tokens": 32768}
    )
    await big.pop()
    failure = await raised(chat.openai().chat.completions.create(model=MODEL, messages=HI, max_tokens=8192))
    assert failure.status_code == 403
    error = error_of(failure)
    assert error["code"] == "kudos_upfront"
    assert "4096 tokens" in error["message"]
    assert isinstance(failure, openai.PermissionDeniedError)
    assert await chat.requests() == []
    # A chat request is never downgraded: the funded requester gets what it asked for.
    answer, job = await along(
        chat.openai(key).chat.completions.create(model=MODEL, messages=HI, max_tokens=8192),
        big.serve("long answer"),
    )
    assert job["payload"]["max_tokens"] == 8192
    assert (answer.model_extra or {})["context_adjustments"] == []


async def test_too_many_waiting_requests_is_429_rate_limit_exceeded(db_url: str, clock: ManualClock) -> None:
    settings = make_settings(db_url, request={"max_waiting_anonymous": 1})
    async with open_chat(settings, clock) as chat:
        key = await chat.hc.user("owner")
        await chat.worker(key, "w1").pop()
        assert (await chat.hc.create(ANON, models=[MODEL], chat={"messages": HI})).status_code == 202
        failure = await raised(chat.openai().chat.completions.create(model=MODEL, messages=HI))
        assert failure.status_code == 429
        assert error_of(failure)["code"] == "rate_limit_exceeded"
        assert failure.response.headers["x-should-retry"] == "false"
        assert "retry-after" in failure.response.headers


# --- context adjustments, dry runs, models -----------------------------------------------------


async def test_context_adjustments_on_both_routes(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    small = chat.worker(key, "small", chat={**CHAT_BLOCK, "max_completion_tokens": 256})
    await small.pop()
    lowered = {"field": "max_tokens", "requested": 1000, "applied": 256}
    # Native route: the 202 body reports it, and [] when nothing changed.
    native = await chat.hc.create(key, models=[MODEL], chat={"messages": HI, "max_tokens": 1000})
    assert native.status_code == 202, native.text
    [adjustment] = native.json()["context_adjustments"]
    assert adjustment | lowered == adjustment
    assert adjustment["reason"]
    unchanged = await chat.hc.create(key, models=[MODEL], chat={"messages": HI, "max_tokens": 100})
    assert unchanged.json()["context_adjustments"] == []
    default = await chat.hc.create(key, models=[MODEL], chat={"messages": HI})
    assert default.json()["context_adjustments"][0]["requested"] == 512
    for created in (native, unchanged, default):
        await chat.hc.cancel(created.json()["id"])
    # A native dry run quotes the same adjustment and creates nothing.
    quote = await chat.hc.create(key, models=[MODEL], chat={"messages": HI, "max_tokens": 1000}, dry_run=True)
    assert quote.status_code == 200, quote.text
    assert quote.json()["max_length"] == 256
    assert quote.json()["context_adjustments"][0] | lowered == quote.json()["context_adjustments"][0]
    # /v1, non-streaming and streaming.
    answer, job = await along(
        chat.openai().chat.completions.create(model=MODEL, messages=HI, max_tokens=1000), small.serve("short")
    )
    assert job["payload"]["max_tokens"] == 256
    [adjustment] = (answer.model_extra or {})["context_adjustments"]
    assert adjustment | lowered == adjustment
    (chunks, error), _ = await along(
        collect(
            chat.openai().chat.completions.create(
                model=MODEL, messages=HI, max_completion_tokens=1000, stream=True
            )
        ),
        small.serve("short"),
    )
    assert error is None
    [adjustment] = (chunks[0].model_extra or {})["context_adjustments"]
    assert adjustment | lowered == adjustment
    unchanged_answer = await chat.openai().chat.completions.with_raw_response.create(
        model=MODEL, messages=HI, max_tokens=10, extra_body={"dry_run": True}
    )
    assert unchanged_answer.http_response.json()["context_adjustments"] == []


async def test_chat_dry_run_quotes_without_creating_a_request(chat: Chat) -> None:
    key = await chat.hc.user("owner", kudos=1000)
    await chat.worker(key, "w1").pop()
    raw = await chat.openai(key).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=HI,
        max_tokens=300,
        tools=TOOLS,
        extra_body={"dry_run": True},  # type: ignore[arg-type]
    )
    quote = raw.http_response.json()
    assert raw.http_response.status_code == 200
    assert quote["dry_run"] is True
    # Upstream's quote for an 8B model at the context the job needs (messages and max_tokens), plus the burn.
    context = quote["prompt_tokens"] + 300
    assert quote["kudos"] == round(300 * 8 * context_multiplier(context) / 100 + 1, 2)
    assert quote["max_tokens"] == 300
    assert quote["eligible_workers"] == 1
    assert quote["requirements"] == {"features": ["tools"], "image_transports": []}
    assert quote["context_adjustments"] == []
    assert quote["prompt_tokens"] > 0
    lowered = await chat.http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 5000, "dry_run": True}
    )
    assert lowered.json()["max_tokens"] == CHAT_BLOCK["max_completion_tokens"]
    assert lowered.json()["context_adjustments"][0]["applied"] == CHAT_BLOCK["max_completion_tokens"]
    vision = await chat.http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": image_message(PNG_DATA), "dry_run": True}
    )
    assert vision.json()["eligible_workers"] == 0
    assert await chat.requests() == []


async def test_models_lists_the_models_of_online_chat_workers(chat: Chat) -> None:
    client = chat.openai()
    listed = await chat.http.get("/v1/models")
    assert listed.json() == {"object": "list", "data": []}
    key = await chat.hc.user("owner")
    assert (await chat.hc.pop(key, "legacy", models=["legacy-13B"])).status_code == 200
    assert (await client.models.list()).data == []  # not a chat worker
    await chat.worker(key, "w1").pop()
    [model] = (await client.models.list()).data
    assert (model.id, model.object, model.owned_by) == (MODEL, "model", "horde_lite")
    assert isinstance(model.created, int)
    assert (await client.models.retrieve(MODEL)).id == MODEL
    failure = await raised(client.models.retrieve("no/such-model"))
    assert (failure.status_code, error_of(failure)["code"]) == (404, "model_not_found")
    with pytest.raises(openai.AuthenticationError):
        await chat.openai("wrong-key-0000000000000").models.list()
    chat.clock.advance(chat.horde.settings.worker.online_seconds + 1)
    assert (await client.models.list()).data == []


# --- the native route ----------------------------------------------------------------------------


async def test_native_chat_request_is_polled_with_the_status_route(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "w1")
    await worker.pop()
    created = await chat.hc.create(
        key, models=[MODEL], chat={"messages": HI, "max_tokens": 64, "temperature": 0.2}
    )
    assert created.status_code == 202, created.text
    assert created.json()["context_adjustments"] == []
    request_id = created.json()["id"]
    job = await worker.pop()
    assert (job["kind"], job["stream"]) == ("chat", False)
    assert job["payload"] == {"messages": HI, "max_tokens": 64, "temperature": 0.2}
    assert (await worker.progress(job["id"], 1, "no")).json()["rc"] == "NotStreamingJob"
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    submitted = await worker.submit(
        job["id"], "Paris.", tool_calls=[call], usage={"prompt_tokens": 3, "completion_tokens": 2}
    )
    assert submitted.json()["reward"] > 0
    status = (await chat.hc.status(request_id)).json()
    assert status["done"] is True
    [generation] = status["generations"]
    assert generation["text"] == "Paris."
    assert generation["chat"]["message"]["content"] == "Paris."
    assert generation["chat"]["message"]["tool_calls"] == [call]
    assert generation["chat"]["usage"] == {"prompt_tokens": 3, "completion_tokens": 2}


# --- the speed gate (decision 0001) -------------------------------------------------------------


async def test_assignment_of_a_chat_request_beyond_the_only_online_workers_capacity(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    slow = chat.worker(key, "slow")
    await slow.pop()
    await chat.hc.set_worker_speed("slow", 4.0)  # capacity floor(4.0 x 120) = 480
    answer, job = await along(
        chat.openai().chat.completions.create(model=MODEL, messages=HI, max_tokens=512),
        slow.serve("slow but sure"),
    )
    assert answer.choices[0].message.content == "slow but sure"
    assert job["payload"]["max_tokens"] == 512
    [generation] = await chat.generations(answer.id.removeprefix("chatcmpl-"))
    assert generation.over_capacity_at_assignment is True
    assert generation.capacity_at_assignment == 480
    metrics = await chat.hc.metrics()
    assert value(metrics, "horde_text_gate_shadow_assignments_total", horde_chat=True) == 1


async def test_refusal_to_assign_a_chat_request_to_a_slower_worker_when_a_capable_worker_can_take_it(
    chat: Chat,
) -> None:
    key = await chat.hc.user("owner")
    slow = chat.worker(key, "slow")
    fast = chat.worker(key, "fast")  # unmeasured: the assumed 10 tokens/s, capacity 1200
    await slow.pop()
    await fast.pop()
    await chat.hc.set_worker_speed("slow", 4.0)
    asking = await in_background(
        chat.openai().chat.completions.create(model=MODEL, messages=HI, max_tokens=512)
    )
    await chat.until_request()
    assert (await slow.pop())["id"] is None
    answer, _ = await along(asking, fast.serve("fast answer"))
    assert answer.choices[0].message.content == "fast answer"
    # A legacy request of the same size still goes to the slower worker.
    legacy = await chat.hc.create(key, models=[MODEL], params={"max_length": 512, "max_context_length": 1024})
    assert legacy.status_code == 202, legacy.text
    job = await slow.pop()
    assert job["kind"] == "text"
    assert job["payload"]["max_length"] == 512


# --- the free output allowance's quotes (decision 0002) -----------------------------------------


async def test_a_funded_quote_is_not_returned_for_an_anonymous_dry_run_above_the_allowance(
    chat: Chat,
) -> None:
    """horde_lite computes every dry run fresh (no quote cache), so the funded requester's quote
    cannot leak: the anonymous dry run of the same body is refused like the real request."""
    key = await chat.hc.user("rich", kudos=100_000)
    worker = await chat.hc.pop(key, "big", models=["m-12B"], max_length=8192, max_context_length=16384)
    assert worker.status_code == 200
    body: dict[str, Any] = {
        "models": ["m-12B"],
        "params": {"max_length": 8192, "max_context_length": 16384},
        "dry_run": True,
    }
    funded = await chat.hc.create(key, **body)
    assert funded.status_code == 200, funded.text
    assert funded.json()["kudos"] == quote(8192, 12, 8192 + 3)
    anonymous = await chat.hc.create(ANON, **body)
    assert anonymous.status_code == 403
    assert anonymous.json()["rc"] == "KudosUpfront"
    assert "4096" in anonymous.json()["message"]
    again = await chat.hc.create(key, **body)
    assert again.json() == funded.json()
    assert await chat.requests() == []
