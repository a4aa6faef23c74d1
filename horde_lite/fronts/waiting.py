"""Waiting for a request while its client holds the connection: the /v1 fronts (chat completions and
text completions) create a request through admission and then follow it here, without HTTP.

The waiter reads the request and its jobs in one statement outside any transaction (a transaction
only to honour a lapse), never holding one while it waits. It wakes when
the request changes (`horde.notifier`: pop, progress, submit, lapse and cancel notify the request's
id, in this process and, on PostgreSQL, in every process through LISTEN/NOTIFY), at its own next
deadline (the grace, the queue timeout, the lease of the job it follows, the next keep-alive), and
otherwise at the slow poll `chat.poll_seconds`. Every read honours a lapse of the request's own
lease, so waiting works with or without the periodic sweep.

Waiting, in order:

- **Assignment.** If no worker has taken the request `chat.grace_seconds` after it was created and
  no eligible worker exists, the request is cancelled and the front fails with `NoEligibleWorker`
  (503). Otherwise it waits up to `chat.max_queue_wait_seconds` in the queue (counted again from a
  silent restart) and then cancels and fails with `QueueTimeout` (503).
- **Output.** The progress of the generation holding the job is relayed as it grows (only streaming
  chat jobs post progress; a legacy job's text arrives whole with its submit); the stored submit is
  final. A lapse or fault of that generation before any output was relayed restarts the job
  silently (the lease code gives it back to the queue; the waiter keeps waiting). After output was
  relayed it cancels the request and fails with `WorkerFailed` (502), which a stream sends as an
  in-stream error. A request faulted by too many failures fails with `WorkerFailed`.
- **Client gone.** The face calls `abandon()`: the request is cancelled, nothing more is handed
  out, and a streaming worker's next progress answer says `cancel: true`. A caller cancelled
  while its request is being admitted has it cancelled once admission ends (`queue`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
from sqlalchemy import and_, bindparam, func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from horde_lite.core.context import Caller, Horde
from horde_lite.core.errors import HordeError
from horde_lite.db.models import Generation, TextRequest, Worker
from horde_lite.jobs.lease import LapseSeen, lapse_expired, lease_ran_out, read_honouring_lapses
from horde_lite.jobs.worker_output import (
    count,
    finish_reason,
    message_tool_calls,
    text_of,
    tool_call_delta,
)
from horde_lite.queue.eligibility import eligibility_clauses
from horde_lite.rc import Rc
from horde_lite.requests import admission
from horde_lite.requests import status as status_rules
from horde_lite.requests.admission_rule import AdmissionOutcome

log = logging.getLogger("horde_lite.waiting")

# A comment line keeps idle streams (a worker preparing, a long pause) from read timeouts.
KEEPALIVE_SECONDS = 15.0
# After the grace, the eligibility check runs at most this often (real seconds) per waiting request.
ELIGIBILITY_CHECK_SECONDS = 1.0
# The shortest sleep between two reads, so a deadline just passed never spins.
MIN_PAUSE_SECONDS = 0.05


@dataclass(frozen=True)
class FrontRequest:
    """A request a /v1 front created and now waits for."""

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
class Delta:
    """New output of the generation holding the job (only streaming chat jobs have any)."""

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

    @property
    def text(self) -> str:
        return str(self.message.get("content") or "")


Event = Delta | KeepAlive | Final


async def queue(
    horde: Horde,
    caller: Caller,
    build: admission.SpecBuilder,
    *,
    model: str,
    stream: bool,
    prompt_tokens: int | None = None,
) -> FrontRequest:
    """Admit and queue a front's request (`admission.decide`; HordeError for a refusal).
    `prompt_tokens` overrides the spec's estimate where the spec keeps none (a legacy prompt).

    A caller cancelled while admission runs (the server stopping; a cancel lands even after the
    commit, as the call resumes) would leave a request no one waits for: admission runs in a task
    of its own, and a caller that leaves hands it to `_abandon_once_admitted`."""
    admitting = asyncio.ensure_future(admission.decide(horde, caller, build))
    try:
        decided = await asyncio.shield(admitting)
    except asyncio.CancelledError:
        horde.detach(_abandon_once_admitted(horde, admitting), "abandon a request being admitted")
        raise
    spec, result = decided.spec, decided.admission
    assert result.request_id is not None
    log.info("front request queued request=%s model=%s stream=%s", result.request_id, model, stream)
    return FrontRequest(
        request_id=result.request_id,
        model=model,
        created_at=result.created_at,
        stream=stream,
        kudos=result.kudos if result.outcome is AdmissionOutcome.FUNDED else 0.0,
        max_tokens=result.max_length,
        prompt_tokens=spec.prompt_tokens if prompt_tokens is None else prompt_tokens,
        context_adjustments=list(result.context_adjustments),
        spec=spec,
    )


async def _abandon_once_admitted(horde: Horde, admitting: asyncio.Future[admission.Decision]) -> None:
    """Its caller left while `admitting` ran: once it ends, cancel the request it created."""
    try:
        decided = await admitting
    except HordeError:  # refused: nothing was created
        return
    if decided.admission.request_id is not None:
        await _cancel(horde, decided.admission.request_id)


async def abandon(horde: Horde, request_id: str) -> None:
    """The client went away (or the front gave up): cancel what has not been handed out and flag
    running jobs, so the worker's next progress answer says `cancel: true`.

    It is called as the caller is being cancelled. The shielded scope makes the caller wait for it
    through the cancel scopes of Litestar and anyio (a stream's disconnect); the detached task
    (`Horde.detach`) keeps a task's own cancellation, which a shield does not stop, from cutting
    the cancel off midway."""
    task = horde.detach(_cancel(horde, request_id), f"abandon request={request_id}")
    with anyio.CancelScope(shield=True):
        await asyncio.shield(task)


async def _cancel(horde: Horde, request_id: str) -> None:
    try:
        async with horde.transaction() as session:
            await status_rules.cancel(session, horde, request_id)
    except HordeError:  # already removed
        return
    log.info("front request abandoned request=%s", request_id)


@dataclass(frozen=True)
class _Gen:
    id: str
    state: str
    text: str
    tokens: int
    lease_expires_at: float
    progress_content: str
    progress_tool_calls: list[Any]
    chat_result: dict[str, Any] | None
    usage: dict[str, Any] | None  # a legacy job's reported usage, as kept


@dataclass
class _Snapshot:
    state: str | None  # None: the request is gone
    failures: int = 0
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
        lease_expires_at=g.lease_expires_at,
        progress_content=g.progress_content or "",
        progress_tool_calls=list(g.progress_tool_calls or []),
        chat_result=dict(g.chat_result) if g.chat_result else None,
        usage=dict(g.usage) if g.usage else None,
    )


# A request's state and cost with its real jobs, oldest first (no row: the request is gone).
_REQUEST_AND_JOBS = (
    select(TextRequest.state, TextRequest.failures, TextRequest.kudos_spent, Generation)
    .outerjoin(Generation, and_(Generation.request_id == TextRequest.id, Generation.fake.is_(False)))
    .where(TextRequest.id == bindparam("id"))
    .order_by(Generation.popped_at)
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


class Waiter:
    """Follows one front request. Call `close()` when done with it."""

    def __init__(self, horde: Horde, request: FrontRequest) -> None:
        self.horde = horde
        self.request = request
        self.queued_since = request.created_at
        self.following: str | None = None  # the generation holding the job
        self.streamed_text = ""
        self.streamed_tool_calls = 0
        self._next_eligibility_check = 0.0
        self._deadline: float | None = None  # the next clock time a rule may change the outcome
        self._event = horde.notifier.subscribe(request.request_id)
        self._closed = False

    @property
    def streamed(self) -> bool:
        """Whether output of the job has been relayed to the client."""
        return bool(self.streamed_text) or self.streamed_tool_calls > 0

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.horde.notifier.unsubscribe(self.request.request_id, self._event)

    async def _pause(self, most: float | None = None) -> None:
        """Sleep until woken, the next deadline, `most` seconds, or the slow poll."""
        seconds = self.horde.settings.chat.poll_seconds
        if most is not None:
            seconds = min(seconds, most)
        if self._deadline is not None:
            until = self._deadline - self.horde.clock.now()
            if until > 0:
                seconds = min(seconds, until)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), max(seconds, MIN_PAUSE_SECONDS))

    async def _snapshot(self, *, check_eligible: bool) -> _Snapshot:
        """The request as it stands: a waiting call reads at every wake-up, outside a transaction
        unless it meets a lapsed job, which is honoured first (`read_honouring_lapses`)."""
        now = self.horde.clock.now()
        return await read_honouring_lapses(
            self.horde,
            lambda session, may_write: self._read(
                session, now, check_eligible=check_eligible, may_write=may_write
            ),
        )

    async def _read(
        self, session: AsyncSession, now: float, *, check_eligible: bool, may_write: bool
    ) -> _Snapshot:
        """`may_write`: a lapsed job of the request is honoured first; else one raises `LapseSeen`."""
        horde = self.horde
        request_id = self.request.request_id
        if may_write:
            await lapse_expired(session, horde, now, request_id=request_id)
        # One statement: outside a transaction, a submit committed between two reads would show its
        # finished job beside the request as it stood before (its cost not yet charged).
        rows = (await session.execute(_REQUEST_AND_JOBS, {"id": request_id})).all()
        if not rows:
            return _Snapshot(state=None)
        state, failures, kudos_spent = rows[0][:3]
        snap = _Snapshot(state=state, failures=failures, kudos_spent=kudos_spent)
        for *_, g in rows:
            if g is None:
                continue
            if not may_write and lease_ran_out(g, now):
                raise LapseSeen()
            if g.state in status_rules.FINISHED:
                snap.finished = _gen(g)
            elif g.state == "processing":
                snap.processing = _gen(g)
        unassigned = snap.processing is None and snap.finished is None and state == "waiting"
        if check_eligible and unassigned:
            snap.eligible = await eligible_worker_count(session, horde, request_id, now)
            if snap.eligible == 0:
                snap.gap = await admission.declaration_gap(session, horde.in_force(), self.request.spec, now)
        return snap

    async def _fail(self, error: HordeError) -> HordeError:
        await abandon(self.horde, self.request.request_id)
        log.info("front request failed request=%s rc=%s", self.request.request_id, error.rc)
        return error

    async def _follow(self, snap: _Snapshot, now: float) -> None:
        """A job followed whose generation ended without a result (its lease lapsed or it faulted)
        fails the call once part of its answer was streamed; otherwise the request waits again."""
        current = snap.processing.id if snap.processing is not None else None
        if self.following is None or current == self.following:
            return
        if self.streamed:
            raise await self._fail(
                HordeError(
                    Rc.WorkerFailed,
                    "The worker stopped after part of the answer was streamed (its lease lapsed or "
                    "it reported a fault); the request was cancelled.",
                )
            )
        log.info("front job restarted silently request=%s", self.request.request_id)
        self.following = None
        self.queued_since = now

    async def _step(self) -> _Snapshot:
        """One read: apply the waiting rules (raises HordeError) and note the next deadline."""
        settings = self.horde.settings.chat
        now = self.horde.clock.now()
        waited = now - self.request.created_at
        due = waited >= settings.grace_seconds and time.monotonic() >= self._next_eligibility_check
        snap = await self._snapshot(check_eligible=due)
        if snap.eligible is not None:
            self._next_eligibility_check = time.monotonic() + ELIGIBILITY_CHECK_SECONDS
        if snap.state is None:
            raise HordeError(
                Rc.WorkerFailed, "The request expired or was removed before a worker answered it."
            )
        if snap.finished is not None:
            return snap
        await self._follow(snap, now)
        if snap.state == "faulted":
            raise HordeError(
                Rc.WorkerFailed,
                f"The workers that took this request failed it {snap.failures} times; it was given up.",
            )
        if snap.processing is not None:
            self.following = snap.processing.id
            self._deadline = snap.processing.lease_expires_at
            return snap
        if snap.state == "cancelled":
            raise HordeError(Rc.RequestCancelled, "This request was cancelled.")
        if snap.eligible == 0:
            detail = f": {snap.gap}" if snap.gap else ""
            raise await self._fail(
                HordeError(
                    Rc.NoEligibleWorker,
                    f"No online worker can take this request (waited {settings.grace_seconds:g} s){detail}. "
                    "The model may still be listed while its workers cannot serve this request.",
                    retry_after=max(1, int(settings.grace_seconds)),
                    gap=snap.gap,
                )
            )
        timeout_at = self.queued_since + settings.max_queue_wait_seconds
        if now >= timeout_at:
            raise await self._fail(
                HordeError(
                    Rc.QueueTimeout,
                    f"No worker took this request within {settings.max_queue_wait_seconds:g} s; the "
                    f"workers for {self.request.model} are busy. Try again later.",
                    retry_after=30,
                )
            )
        grace_at = self.request.created_at + settings.grace_seconds
        self._deadline = min(grace_at, timeout_at) if now < grace_at else timeout_at
        return snap

    async def assigned(self) -> None:
        """Return once a worker holds the job (or its result is in); raise HordeError otherwise."""
        while True:
            self._event.clear()
            snap = await self._step()
            if snap.finished is not None or snap.processing is not None:
                return
            await self._pause()

    async def events(self, *, keepalive: bool = True) -> AsyncIterator[Event]:
        """Progress deltas as they arrive, keep-alives while idle (unless told not to: nobody
        reads them), then the final message."""
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
            if not keepalive:
                await self._pause()
                continue
            if time.monotonic() - last_sent >= KEEPALIVE_SECONDS:
                last_sent = time.monotonic()
                yield KeepAlive()
            await self._pause(KEEPALIVE_SECONDS - (time.monotonic() - last_sent))

    async def result(self) -> Final:
        """The final message (non-streaming)."""
        async for event in self.events(keepalive=False):
            if isinstance(event, Final):
                return event
        raise AssertionError("events() ends only with a Final")  # pragma: no cover

    def _new_output(self, g: _Gen) -> Delta | None:
        content = g.progress_content
        text = None
        if len(content) > len(self.streamed_text) and content.startswith(self.streamed_text):
            text = content[len(self.streamed_text) :]
            self.streamed_text = content
        tool_calls = self._unsent_tool_calls(g)
        if text is None and not tool_calls:
            return None
        return Delta(content=text, tool_calls=tool_calls or None)

    def _unsent_tool_calls(self, g: _Gen) -> list[dict[str, Any]]:
        """The tool-call fragments the worker posted since the last ones relayed, as deltas."""
        calls = g.progress_tool_calls[self.streamed_tool_calls :]
        start = self.streamed_tool_calls
        self.streamed_tool_calls = len(g.progress_tool_calls)
        return [tool_call_delta(c, start + i) for i, c in enumerate(calls)]

    def _final(self, snap: _Snapshot, g: _Gen) -> Final:
        result = g.chat_result or {}
        raw = result.get("message") if isinstance(result.get("message"), dict) else {}
        assert isinstance(raw, dict)
        tool_calls = message_tool_calls(raw.get("tool_calls"))
        content = text_of(raw.get("content"))
        if content is None and not tool_calls:
            content = g.text
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        usage = result.get("usage") if isinstance(result.get("usage"), dict) else g.usage or {}
        assert isinstance(usage, dict)
        remainder_text = None
        if content and content.startswith(self.streamed_text) and len(content) > len(self.streamed_text):
            remainder_text = content[len(self.streamed_text) :]
        remainder_tools = None
        if tool_calls and self.streamed_tool_calls == 0:
            remainder_tools = [{"index": i, **call} for i, call in enumerate(tool_calls)]
        elif self.streamed_tool_calls:
            # Fragments posted after the last ones relayed, when the result came in before the
            # stream read them: without them the client's calls would stop half-way.
            remainder_tools = self._unsent_tool_calls(g) or None
        remainder = None
        if remainder_text or remainder_tools:
            remainder = Delta(content=remainder_text, tool_calls=remainder_tools)
        if g.chat_result is None and g.state != "censored":
            # A legacy result carries no reason: output that used the whole budget was cut there.
            reason = "length" if g.tokens >= self.request.max_tokens else "stop"
        else:
            reason = finish_reason(result.get("finish_reason"), g.state, bool(tool_calls))
        return Final(
            message=message,
            finish_reason=reason,
            prompt_tokens=count(usage.get("prompt_tokens"), self.request.prompt_tokens),
            # The stored count (the submit bounds it), not the worker's word in `usage`.
            completion_tokens=g.tokens,
            kudos=round(snap.kudos_spent, 2),
            remainder=remainder,
        )
