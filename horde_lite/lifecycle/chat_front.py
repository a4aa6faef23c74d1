"""The chat front's lifecycle (POST /v1/chat/completions), without HTTP (api.md "Chat front").

The front creates a chat request through the same admission as the native route, then waits for it
in short transactions, never holding one while it waits: it polls the database every
`chat.poll_seconds` and wakes early on `horde.notifier` (pop, progress, submit, lapse and cancel
notify the request's id). The database stays the source of truth, so several server processes on
one PostgreSQL work too, and every poll honours a lapse of the request's own lease, so the front
works with or without the periodic sweep.

Waiting, in order:

- **Assignment.** If no worker has taken the request `chat.grace_seconds` after it was created and
  no eligible worker exists, the request is cancelled and the front fails with `NoEligibleWorker`
  (503). Otherwise it waits up to `chat.max_queue_wait_seconds` in the queue (counted again from a
  silent restart) and then cancels and fails with `QueueTimeout` (503).
- **Output.** The progress of the generation holding the job is relayed as it grows; the stored
  submit is final. A lapse or fault of that generation before any output was relayed restarts the
  job silently (the lease code gives it back to the queue; the front keeps waiting). After output
  was relayed it cancels the request and fails with `WorkerFailed` (502), which the streaming face
  sends as an in-stream error. A request faulted by too many failures fails with `WorkerFailed`.
- **Client gone.** The face calls `abandon()`: the request is cancelled, nothing more is handed
  out, and the worker's next progress answer says `cancel: true`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from horde_lite.db.models import Generation, TextRequest, Worker, WorkerModel
from horde_lite.lifecycle import admission
from horde_lite.lifecycle import status as status_rules
from horde_lite.lifecycle.context import Horde
from horde_lite.lifecycle.eligibility import eligibility_clauses
from horde_lite.lifecycle.errors import HordeError
from horde_lite.lifecycle.inputs import ChatPayload
from horde_lite.lifecycle.lease import lapse_expired
from horde_lite.lifecycle.users import authenticate

log = logging.getLogger("horde_lite.chat_front")

FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter", "function_call")
# A comment line keeps idle streams (a worker preparing, a long pause) from read timeouts.
KEEPALIVE_SECONDS = 15.0
# After the grace, how often (real seconds) the eligibility check runs for a waiting request.
ELIGIBILITY_CHECK_SECONDS = 1.0


# --- what the front gets back ------------------------------------------------------------------


@dataclass(frozen=True)
class ChatRequest:
    """A chat request the front created and now waits for."""

    request_id: str
    model: str
    created_at: float
    stream: bool
    kudos: float  # held upfront (0 for a free request)
    max_tokens: int  # applied
    prompt_tokens: int
    context_adjustments: list[dict[str, Any]]
    spec: admission.AdmissionSpec


@dataclass(frozen=True)
class Quote:
    """A chat dry run: what the request would be, without creating it."""

    model: str
    kudos: float
    outcome: str
    allowance: int
    max_tokens: int
    requested_max_tokens: int
    prompt_tokens: int
    eligible_workers: int
    estimated_wait_seconds: float | None
    features: list[str]
    image_transports: list[str]
    context_adjustments: list[dict[str, Any]]


@dataclass(frozen=True)
class Delta:
    """New output of the generation holding the job (only streaming jobs have any)."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class KeepAlive:
    """Nothing new for KEEPALIVE_SECONDS."""


@dataclass(frozen=True)
class Final:
    """The stored submit: the authoritative message, and what the stream still lacks of it."""

    message: dict[str, Any]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    kudos: float
    remainder: Delta | None


Event = Delta | KeepAlive | Final


# --- creating ----------------------------------------------------------------------------------


async def known_chat_model(session: AsyncSession, model: str) -> bool:
    """A model some registered chat worker declares, online or not. An unknown model is a 404
    (`model_not_found`); a known one whose workers are offline waits the grace like any request
    no worker can take, and then fails with `no_eligible_worker` (docs/reference/chat_requests.md)."""
    found = await session.execute(
        select(WorkerModel.model)
        .join(Worker, Worker.id == WorkerModel.worker_id)
        .where(WorkerModel.model == model, Worker.chat_max_completion_tokens.is_not(None))
        .limit(1)
    )
    return found.first() is not None


async def _admit(
    session: AsyncSession,
    horde: Horde,
    apikey: str | None,
    payload: ChatPayload,
    model: str,
    *,
    stream: bool,
    dry_run: bool,
    client_agent: str,
) -> tuple[admission.AdmissionSpec, admission.Admission]:
    requester = await authenticate(session, apikey, horde.clock.now())
    if not await known_chat_model(session, model):
        raise HordeError(
            "ModelNotFound",
            f"The model {model!r} does not exist on this horde: no chat worker serves it. "
            "GET /v1/models lists the models online chat workers serve.",
            param="model",
        )
    spec = await admission.chat_spec(
        session, horde, requester, payload, models=[model], stream=stream, dry_run=dry_run,
        native_route=False, client_agent=client_agent,
    )  # fmt: skip
    return spec, await admission.admit(session, horde, spec)


async def create(
    horde: Horde,
    apikey: str | None,
    payload: ChatPayload,
    model: str,
    *,
    stream: bool,
    client_agent: str = "",
) -> ChatRequest:
    """Admit and queue a chat request from the /v1 front (HordeError for a refusal)."""
    async with horde.sessionmaker() as session, session.begin():
        spec, result = await _admit(
            session, horde, apikey, payload, model, stream=stream, dry_run=False, client_agent=client_agent
        )
        assert result.request_id is not None
        row = await session.get(TextRequest, result.request_id)
        assert row is not None
        created_at = row.created_at
    log.info("chat request queued request=%s model=%s stream=%s", result.request_id, model, stream)
    return ChatRequest(
        request_id=result.request_id,
        model=model,
        created_at=created_at,
        stream=stream,
        kudos=result.kudos if result.outcome == "funded" else 0.0,
        max_tokens=result.max_length,
        prompt_tokens=spec.prompt_tokens,
        context_adjustments=list(result.context_adjustments),
        spec=spec,
    )


class _Quoted(Exception):
    """Raised inside the admission transaction so nothing of the dry run is kept."""

    def __init__(self, quote: Quote) -> None:
        self.quote = quote


async def quote(
    horde: Horde, apikey: str | None, payload: ChatPayload, model: str, *, client_agent: str = ""
) -> Quote:
    """A chat dry run: judged exactly like the real request (refused the same way), then rolled
    back. Chat dry runs are computed fresh every time; nothing is cached."""
    try:
        async with horde.sessionmaker() as session, session.begin():
            spec, result = await _admit(
                session, horde, apikey, payload, model, stream=False, dry_run=True, client_agent=client_agent
            )
            raise _Quoted(
                Quote(
                    model=model,
                    kudos=result.kudos,
                    outcome=result.outcome,
                    allowance=result.allowance,
                    max_tokens=result.max_length,
                    requested_max_tokens=spec.requested_max_length,
                    prompt_tokens=spec.prompt_tokens,
                    eligible_workers=result.estimate.eligible_workers,
                    estimated_wait_seconds=result.estimate.estimated_wait,
                    features=list(spec.required_features),
                    image_transports=list(spec.required_transports),
                    context_adjustments=list(result.context_adjustments),
                )
            )
    except _Quoted as quoted:
        return quoted.quote
    raise AssertionError("unreachable")  # pragma: no cover


async def abandon(horde: Horde, request_id: str) -> None:
    """The client went away (or the front gave up): cancel what has not been handed out and flag
    running jobs, so the worker's next progress answer says `cancel: true`."""
    try:
        async with horde.sessionmaker() as session, session.begin():
            await status_rules.cancel(session, horde, request_id)
    except HordeError:  # already removed
        return
    log.info("chat request abandoned request=%s", request_id)


# --- waiting -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Gen:
    id: str
    state: str
    text: str
    tokens: int
    progress_content: str
    progress_tool_calls: list[Any]
    chat_result: dict[str, Any] | None


@dataclass
class _Snapshot:
    state: str | None  # None: the request is gone
    failures: int = 0
    prompt_tokens: int = 0
    kudos_spent: float = 0.0
    processing: _Gen | None = None
    finished: _Gen | None = None
    eligible: int | None = None  # counted only when the grace rule needs it
    gap: str | None = None


def _gen(g: Generation) -> _Gen:
    return _Gen(
        id=g.id,
        state=g.state,
        text=g.text or "",
        tokens=g.tokens or 0,
        progress_content=g.progress_content or "",
        progress_tool_calls=list(g.progress_tool_calls or []),
        chat_result=dict(g.chat_result) if g.chat_result else None,
    )


async def eligible_worker_count(session: AsyncSession, horde: Horde, request_id: str, now: float) -> int:
    """Online workers passing the one eligibility check for the request (speed gate included)."""
    rules = horde.rules(now)
    r = aliased(TextRequest, name="r")
    w = aliased(Worker, name="w")
    query = (
        select(func.count(w.id))
        .select_from(r)
        .join(w, and_(*eligibility_clauses(w, r, rules)))
        .where(r.id == request_id)
    )
    return int((await session.execute(query)).scalar_one())


class ChatWaiter:
    """Follows one chat request for the front. Call `close()` when done with it."""

    def __init__(self, horde: Horde, chat: ChatRequest) -> None:
        self.horde = horde
        self.chat = chat
        self.queued_since = chat.created_at
        self.following: str | None = None  # the generation holding the job
        self.streamed_text = ""
        self.streamed_tool_calls = 0
        self._next_eligibility_check = 0.0
        self._event = horde.notifier.subscribe(chat.request_id)
        self._closed = False

    @property
    def streamed(self) -> bool:
        """Whether output of the job has been relayed to the client."""
        return bool(self.streamed_text) or self.streamed_tool_calls > 0

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.horde.notifier.unsubscribe(self.chat.request_id, self._event)

    async def _pause(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), self.horde.settings.chat.poll_seconds)

    async def _snapshot(self, *, check_eligible: bool) -> _Snapshot:
        horde = self.horde
        request_id = self.chat.request_id
        now = horde.clock.now()
        async with horde.sessionmaker() as session, session.begin():
            await lapse_expired(session, horde, now, request_id=request_id)
            request = await session.get(TextRequest, request_id)
            if request is None:
                return _Snapshot(state=None)
            snap = _Snapshot(
                state=request.state,
                failures=request.failures,
                prompt_tokens=request.prompt_tokens,
                kudos_spent=request.kudos_spent,
            )
            rows = (
                await session.execute(
                    select(Generation)
                    .where(Generation.request_id == request_id, Generation.fake.is_(False))
                    .order_by(Generation.popped_at)
                )
            ).scalars()
            for g in rows:
                if g.state in status_rules.FINISHED:
                    snap.finished = _gen(g)
                elif g.state == "processing":
                    snap.processing = _gen(g)
            unassigned = snap.processing is None and snap.finished is None and request.state == "waiting"
            if check_eligible and unassigned:
                snap.eligible = await eligible_worker_count(session, horde, request_id, now)
                if snap.eligible == 0:
                    snap.gap = await admission.declaration_gap(session, horde, self.chat.spec, now)
        return snap

    async def _fail(self, error: HordeError) -> HordeError:
        await abandon(self.horde, self.chat.request_id)
        log.info("chat request failed request=%s rc=%s", self.chat.request_id, error.rc)
        return error

    async def _step(self) -> _Snapshot:
        """One poll: read the request and apply the waiting rules (raises HordeError)."""
        settings = self.horde.settings.chat
        now = self.horde.clock.now()
        waited = now - self.chat.created_at
        due = waited >= settings.grace_seconds and time.monotonic() >= self._next_eligibility_check
        snap = await self._snapshot(check_eligible=due)
        if snap.eligible is not None:
            self._next_eligibility_check = time.monotonic() + ELIGIBILITY_CHECK_SECONDS
        if snap.state is None:
            raise HordeError(
                "WorkerFailed", "The request expired or was removed before a worker answered it."
            )
        if snap.finished is not None:
            return snap
        current = snap.processing.id if snap.processing is not None else None
        if self.following is not None and current != self.following:
            # The job's generation ended without a result: its lease lapsed or it faulted.
            if self.streamed:
                raise await self._fail(
                    HordeError(
                        "WorkerFailed",
                        "The worker stopped after part of the answer was streamed (its lease lapsed or "
                        "it reported a fault); the request was cancelled.",
                    )
                )
            log.info("chat job restarted silently request=%s", self.chat.request_id)
            self.following = None
            self.queued_since = now
        if snap.state == "faulted":
            raise HordeError(
                "WorkerFailed",
                f"The workers that took this request failed it {snap.failures} times; it was given up.",
            )
        if current is not None:
            self.following = current
            return snap
        if snap.state == "cancelled":
            raise HordeError("RequestCancelled", "This request was cancelled.")
        if snap.eligible == 0:
            detail = f": {snap.gap}" if snap.gap else ""
            raise await self._fail(
                HordeError(
                    "NoEligibleWorker",
                    f"No online worker can take this request (waited {settings.grace_seconds:g} s){detail}. "
                    "The model may still be listed while its workers cannot serve this request.",
                    retry_after=max(1, int(settings.grace_seconds)),
                    gap=snap.gap,
                )
            )
        if now - self.queued_since >= settings.max_queue_wait_seconds:
            raise await self._fail(
                HordeError(
                    "QueueTimeout",
                    f"No worker took this request within {settings.max_queue_wait_seconds:g} s; the "
                    f"workers for {self.chat.model} are busy. Try again later.",
                    retry_after=30,
                )
            )
        return snap

    async def assigned(self) -> None:
        """Return once a worker holds the job (or its result is in); raise HordeError otherwise."""
        while True:
            self._event.clear()
            snap = await self._step()
            if snap.finished is not None or snap.processing is not None:
                return
            await self._pause()

    async def events(self) -> AsyncIterator[Event]:
        """Progress deltas as they arrive, keep-alives while idle, then the final message."""
        last_sent = time.monotonic()
        while True:
            self._event.clear()
            snap = await self._step()
            if snap.finished is not None:
                yield self._final(snap, snap.finished)
                return
            if snap.processing is not None:
                delta = self._new_output(snap.processing)
                if delta is not None:
                    last_sent = time.monotonic()
                    yield delta
            if time.monotonic() - last_sent >= KEEPALIVE_SECONDS:
                last_sent = time.monotonic()
                yield KeepAlive()
            await self._pause()

    async def result(self) -> Final:
        """The final message (non-streaming)."""
        async for event in self.events():
            if isinstance(event, Final):
                return event
        raise AssertionError("events() ends only with a Final")  # pragma: no cover

    def _new_output(self, g: _Gen) -> Delta | None:
        content = g.progress_content
        text = None
        if len(content) > len(self.streamed_text) and content.startswith(self.streamed_text):
            text = content[len(self.streamed_text) :]
            self.streamed_text = content
        calls = g.progress_tool_calls[self.streamed_tool_calls :]
        self.streamed_tool_calls = len(g.progress_tool_calls)
        tool_calls = [
            tool_call_delta(c, self.streamed_tool_calls - len(calls) + i) for i, c in enumerate(calls)
        ]
        if text is None and not tool_calls:
            return None
        return Delta(content=text, tool_calls=tool_calls or None)

    def _final(self, snap: _Snapshot, g: _Gen) -> Final:
        result = g.chat_result or {}
        raw = result.get("message") if isinstance(result.get("message"), dict) else {}
        assert isinstance(raw, dict)
        tool_calls = message_tool_calls(raw.get("tool_calls"))
        content = _text_of(raw.get("content"))
        if content is None and not tool_calls:
            content = g.text
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        usage = result.get("usage") if isinstance(result.get("usage"), dict) else {}
        assert isinstance(usage, dict)
        remainder_text = None
        if content and content.startswith(self.streamed_text) and len(content) > len(self.streamed_text):
            remainder_text = content[len(self.streamed_text) :]
        remainder_tools = None
        if tool_calls and self.streamed_tool_calls == 0:
            remainder_tools = [{"index": i, **call} for i, call in enumerate(tool_calls)]
        remainder = None
        if remainder_text or remainder_tools:
            remainder = Delta(content=remainder_text, tool_calls=remainder_tools)
        return Final(
            message=message,
            finish_reason=finish_reason(result.get("finish_reason"), g.state, bool(tool_calls)),
            prompt_tokens=_count(usage.get("prompt_tokens"), snap.prompt_tokens),
            completion_tokens=_count(usage.get("completion_tokens"), g.tokens),
            kudos=round(snap.kudos_spent, 2),
            remainder=remainder,
        )


# --- shaping what workers send -----------------------------------------------------------------


def finish_reason(raw: Any, state: str, has_tool_calls: bool) -> str:
    """Never null: the worker's reason when it is one OpenAI knows, else `stop`."""
    if state == "censored":
        return "content_filter"
    reason = raw if raw in FINISH_REASONS else "stop"
    if has_tool_calls and reason == "stop":
        return "tool_calls"
    return str(reason)


def _text_of(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return None


def _count(value: Any, default: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return int(default)


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value if value is not None else {})


def message_tool_calls(raw: Any) -> list[dict[str, Any]]:
    """A submitted message's tool calls in the shape OpenAI clients validate."""
    out: list[dict[str, Any]] = []
    for call in raw if isinstance(raw, list) else []:
        if not isinstance(call, dict):
            continue
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        assert isinstance(function, dict)
        out.append(
            {
                "id": str(call.get("id") or f"call_{uuid.uuid4().hex[:24]}"),
                "type": "function",
                "function": {
                    "name": str(function.get("name") or ""),
                    "arguments": _arguments(function.get("arguments")),
                },
            }
        )
    return out


def tool_call_delta(raw: Any, position: int) -> dict[str, Any]:
    """A streamed tool-call fragment in the shape OpenAI clients validate (`index` required)."""
    call = raw if isinstance(raw, dict) else {}
    index = call.get("index")
    out: dict[str, Any] = {
        "index": index if isinstance(index, int) and not isinstance(index, bool) else position
    }
    if call.get("id") is not None:
        out["id"] = str(call["id"])
    if call.get("type") is not None or call.get("id") is not None:
        out["type"] = "function"
    function = call.get("function")
    if isinstance(function, dict):
        fn: dict[str, Any] = {}
        if function.get("name") is not None:
            fn["name"] = str(function["name"])
        if function.get("arguments") is not None:
            fn["arguments"] = _arguments(function["arguments"])
        out["function"] = fn
    return out


__all__ = [
    "ChatRequest",
    "ChatWaiter",
    "Delta",
    "Event",
    "Final",
    "KeepAlive",
    "Quote",
    "abandon",
    "create",
    "eligible_worker_count",
    "known_chat_model",
    "quote",
]
