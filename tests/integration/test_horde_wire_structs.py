"""The request and job routes answer exactly their response structs (horde_lite/api/horde/schemas.py),
on both databases: every answer decodes into its struct with msgspec in strict mode, and encoding the
decoded struct again gives the same JSON (so no key is undeclared, and a key the struct leaves out
is absent from the wire, not null). The OpenAPI schema is generated from these structs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypeVar

import httpx
import msgspec
import pytest
from sqlalchemy import text

from horde_lite.api.horde.schemas import (
    GenerationKobold,
    GenerationPayloadKobold,
    GenerationProgress,
    GenerationSubmitted,
    RequestAsync,
    RequestQuote,
    RequestStatusKobold,
)
from horde_lite.clock import ManualClock
from horde_lite.settings import Settings
from tests.integration.test_chat_progress import start_stream
from tests.support.chat import MODEL, Chat, gather_stream, in_background, joined, open_chat, settled
from tests.support.horde import ANON, HordeClient

S = TypeVar("S")
HI = [{"role": "user", "content": "Hello there."}]


def wire(response: httpx.Response, struct: type[S], status: int = 200) -> S:
    """The answer as its struct, strictly; and the struct says all of it, no more, no less."""
    assert response.status_code == status, response.text
    decoded = msgspec.json.decode(response.content, type=struct, strict=True)
    assert msgspec.json.decode(msgspec.json.encode(decoded)) == response.json()
    return decoded


@pytest.fixture
async def chat(settings: Settings, clock: ManualClock) -> AsyncIterator[Chat]:
    async with open_chat(settings, clock) as opened:
        yield opened


async def test_requests_and_their_status(client: HordeClient) -> None:
    owner = await client.user("owner")
    quote = wire(await client.create(ANON, dry_run=True, params={"max_length": 64}), RequestQuote)
    assert quote.max_length == 64
    assert quote.context_adjustments is msgspec.UNSET
    created = wire(await client.create(ANON, params={"max_length": 64}), RequestAsync, 202)
    assert created.warnings is msgspec.UNSET
    assert created.message is msgspec.UNSET
    waiting = wire(await client.status(created.id), RequestStatusKobold)
    assert (waiting.waiting, waiting.generations) == (1, [])

    job = wire(await client.pop(owner, "w1"), GenerationPayloadKobold)
    assert (job.kind, job.softprompt, job.ids) == ("text", None, [job.id])
    assert job.payload["max_length"] == 64
    assert job.id is not None
    submitted = wire(
        await client.submit(owner, job.id, "x" * 40, seed=7, gen_metadata=[{"type": "t", "value": "v"}]),
        GenerationSubmitted,
    )
    assert submitted.reward > 0
    done = wire(await client.status(created.id), RequestStatusKobold)
    [generation] = done.generations
    assert (generation.seed, generation.state, generation.chat) == (7, "ok", msgspec.UNSET)
    assert generation.gen_metadata == [{"type": "t", "value": "v"}]

    nothing = wire(await client.pop(owner, "w1"), GenerationPayloadKobold)
    assert (nothing.id, nothing.ids, nothing.payload, nothing.model) == (None, [], {}, msgspec.UNSET)
    cancelled = wire(await client.cancel(wire(await client.create(ANON), RequestAsync, 202).id),
                     RequestStatusKobold)  # fmt: skip
    assert cancelled.done


async def test_a_downgrade_and_what_a_small_worker_skips(client: HordeClient) -> None:
    owner = await client.user("owner")
    await client.pop(owner, "w1", max_length=16384, max_context_length=32768)
    big = {"max_length": 8000, "max_context_length": 16384}
    lowered = wire(await client.create(ANON, params=big, allow_downgrade=True), RequestAsync, 202)
    assert isinstance(lowered.warnings, list)
    assert lowered.warnings[0].code == "Downgraded"
    assert isinstance(lowered.context_adjustments, list)
    assert lowered.context_adjustments[0].field == "max_length"
    assert lowered.message == lowered.warnings[0].message
    quote = wire(await client.create(ANON, params=big, allow_downgrade=True, dry_run=True), RequestQuote)
    assert isinstance(quote.context_adjustments, list)
    assert quote.max_length < 8000
    skipped = wire(await client.pop(owner, "w1", max_length=512), GenerationPayloadKobold)
    assert skipped.skipped.max_length == 1


async def test_chat_jobs(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "w1")
    await worker.pop()
    body: dict[str, Any] = {"models": [MODEL], "chat": {"messages": HI, "max_tokens": 64}}
    assert wire(await chat.hc.create(ANON, dry_run=True, **body), RequestQuote).context_adjustments == []
    created = wire(await chat.hc.create(ANON, **body), RequestAsync, 202)
    assert created.context_adjustments == []
    job = wire(await chat.hc.pop(key, "w1", **worker.body()), GenerationPayloadKobold)
    assert (job.kind, job.stream, job.softprompt) == ("chat", False, msgspec.UNSET)
    assert job.payload["messages"] == HI
    assert job.id is not None
    reply = await worker.submit(job.id, "Hi.", usage={"prompt_tokens": 3, "completion_tokens": 1})
    wire(reply, GenerationSubmitted)
    [generation] = wire(await chat.hc.status(created.id), RequestStatusKobold).generations
    assert isinstance(generation, GenerationKobold)
    assert not isinstance(generation.chat, msgspec.UnsetType)
    assert generation.chat.message["content"] == "Hi."


async def test_progress_answers(chat: Chat) -> None:
    key = await chat.hc.user("owner")
    worker = chat.worker(key, "w1")
    await worker.pop()
    stream, job = await start_stream(chat, worker)
    reading = await in_background(gather_stream(stream))
    answer = wire(await worker.progress(job["id"], 1, "Once"), GenerationProgress)
    assert answer.cancel is False
    assert answer.lease_expires_at.tzinfo is not None
    wire(await worker.submit(job["id"], "Once."), GenerationSubmitted)
    chunks, error = await settled(reading)
    assert error is None
    assert joined(chunks) == "Once."


async def test_a_body_of_the_wrong_shape_is_a_400_naming_the_field(client: HordeClient) -> None:
    """Bodies decode strictly (no "512" for 512, no 1 for true); defaults apply to what is left out."""
    owner = await client.user("owner")
    cases: list[tuple[str, Any, str]] = [
        ("/api/v2/generate/text/pop", {"name": "w1", "max_length": "512"}, "max_length"),
        (
            "/api/v2/generate/text/pop",
            {"name": "w1", "chat": {"max_completion_tokens": 0}},
            "chat.max_completion_tokens",
        ),
        ("/api/v2/generate/text/async", {"prompt": "p", "dry_run": 1}, "dry_run"),
        ("/api/v2/generate/text/async", {"prompt": "p", "models": ["m", 5]}, "models[1]"),
        ("/api/v2/generate/text/submit", {"id": "x", "state": "great"}, "state"),
        ("/api/v2/generate/text/progress", {"id": "x", "seq": 0}, "seq"),
        ("/api/v2/generate/text/async", None, "body"),
        ("/api/v2/generate/text/async", [1], "body"),
    ]
    for path, body, field in cases:
        sent = b"" if body is None else msgspec.json.encode(body)
        response = await client.http.post(
            path, content=sent, headers={"apikey": owner, "content-type": "application/json"}
        )
        assert response.status_code == 400, (path, body, response.text)
        answer = response.json()
        assert answer["rc"] == "BadRequest"
        assert list(answer["errors"]) == [field], answer
        assert answer["message"].startswith(f"Input payload validation failed: {field}"), answer
    malformed = await client.http.post(
        "/api/v2/generate/text/pop", content=b"{nope", headers={"apikey": owner}
    )
    assert malformed.status_code == 400
    assert set(malformed.json()) == {"message", "rc"}
    # Only `name` sent: every other declaration takes its default on the server.
    assert (await client.pop(owner, "w1")).status_code == 200
    [(max_length, threads)] = await _worker_row(client)
    assert (max_length, threads) == (512, 1)


async def _worker_row(client: HordeClient) -> list[Any]:
    async with client.horde.sessionmaker() as session:
        return list((await session.execute(text("SELECT max_length, threads FROM workers"))).all())
