"""Progress posts from streaming chat jobs (docs/reference/chat_requests.md, the worker side).

A worker running a streaming chat job posts its output as it comes: `{id, seq, delta, completion_tokens?}`.
Only the lease holder may post; `seq` counts from 1 and must be the last accepted one plus 1. A repeat
of an already accepted `seq` is acknowledged and changes nothing (a worker may retry a post whose
answer it lost); a gap is a 409, so nothing is relayed out of order. Each accepted post appends its
delta to the generation, extends the lease to at least now + `lease.progress_extension_seconds`, never
beyond `popped_at + lease.max_seconds`, and wakes the chat front waiting on the request. The answer
tells the worker when its lease now ends and whether to stop (the client went away or the request was
cancelled). A post that is one too many, too fast, or would take the job's output past its bound is
refused before anything changes (jobs/output_bounds.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.core.context import Caller, Horde
from horde_lite.core.errors import HordeError
from horde_lite.inputs import ProgressInput
from horde_lite.jobs.completion import load_generation_for_worker, require_live
from horde_lite.jobs.lease import as_lease_holder
from horde_lite.jobs.output_bounds import check_progress
from horde_lite.rc import Rc
from horde_lite.requests import prices


@dataclass(frozen=True, slots=True)
class ProgressAnswer:
    request_id: str
    lease_expires_at: float  # epoch seconds
    cancel: bool  # the client went away or the request was cancelled: stop
    accepted: bool  # False for an acknowledged repeat
    fake: bool


async def record(
    session: AsyncSession, horde: Horde, apikey: str | None, body: ProgressInput
) -> ProgressAnswer:
    """Store one progress post (a lapse of this generation is honoured as it is loaded)."""
    now = horde.clock.now()
    generation, _worker, request, _owner = await load_generation_for_worker(
        session, apikey, body.id, horde, now
    )
    require_live(generation)
    if not request.is_chat or not request.stream:
        raise HordeError(
            Rc.NotStreamingJob,
            "Progress posts are only for streaming chat jobs (a pop answer with kind 'chat' and "
            "stream true); submit this job's result instead.",
        )
    cancel = bool(generation.cancel_requested) or request.state == "cancelled"
    last = generation.progress_seq or 0
    if body.seq <= last:
        # A repeat of a post already accepted: acknowledged, changes nothing, extends nothing.
        return ProgressAnswer(request.id, generation.lease_expires_at, cancel, False, generation.fake)
    if body.seq != last + 1:
        raise HordeError(
            Rc.ProgressOutOfOrder,
            f"Progress seq {body.seq} leaves a gap: the next one expected is {last + 1} "
            f"(repeats of 1..{last} are acknowledged and ignored).",
            expected_seq=last + 1,
        )
    delta = body.delta
    # Checked before anything changes: a refused post leaves the job as it was, still the worker's.
    check_progress(
        seq=body.seq,
        max_length=request.max_length,
        stored_content=generation.progress_content or "",
        stored_tool_calls=generation.progress_tool_calls or [],
        content=delta.content,
        tool_calls=delta.tool_calls,
        popped_at=generation.popped_at,
        now=now,
        settings=horde.settings,
    )
    if delta.content:
        generation.progress_content = (generation.progress_content or "") + delta.content
    if delta.tool_calls:
        generation.progress_tool_calls = [*(generation.progress_tool_calls or []), *delta.tool_calls]
    if body.completion_tokens is not None:
        generation.completion_tokens = body.completion_tokens
    else:
        generation.completion_tokens = max(
            generation.completion_tokens or 0, prices.text_tokens(generation.progress_content or "")
        )
    generation.progress_seq = body.seq
    lease = horde.settings.lease
    ceiling = generation.popped_at + lease.max_seconds
    generation.lease_expires_at = min(
        max(generation.lease_expires_at, now + lease.progress_extension_seconds), ceiling
    )
    await session.flush()
    if not generation.fake:  # wake the waiting front (in every process) once this commits
        horde.notifier.on_commit(session, request.id, remote=request.waited)
    return ProgressAnswer(request.id, generation.lease_expires_at, cancel, True, generation.fake)


async def post(horde: Horde, caller: Caller, body: ProgressInput) -> ProgressAnswer:
    """POST /generate/text/progress: the post as the job's lease holder (a lapse of the job is
    honoured first), then wake the waiting front."""
    return await as_lease_holder(horde, caller, lambda session, apikey: record(session, horde, apikey, body))
