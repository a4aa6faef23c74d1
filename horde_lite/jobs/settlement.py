"""The end of jobs and requests: settle a stored submit, give back a faulted or lapsed job, finish
a request and release what is left of its hold. Shared by submit, the lease sweep and cancel."""

from __future__ import annotations

from sqlalchemy import bindparam, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.accounts import kudos, limits
from horde_lite.core.context import Horde
from horde_lite.core.notify import JobsArrived
from horde_lite.db.models import AssignmentRecord, Generation, TextRequest, Worker
from horde_lite.db.rows import Write, write_rows
from horde_lite.policies.protocols import Outcome

_PROCESSING = select(func.count(Generation.id)).where(
    Generation.request_id == bindparam("request_id"),
    Generation.state == "processing",
    Generation.fake.is_(False),
)  # built once: every submit asks it
_PROCESSING_BESIDES = _PROCESSING.where(Generation.id != bindparam("besides"))
# Assignment records are written by Core statements and never loaded as objects by the paths that
# end jobs, so the ORM has nothing to synchronise.
_records = AssignmentRecord.__table__


async def processing_count(session: AsyncSession, request_id: str, *, besides: str | None = None) -> int:
    """The request's real jobs still running (`besides`: not counting that generation)."""
    if besides is None:
        return (await session.execute(_PROCESSING, {"request_id": request_id})).scalar_one()
    values = {"request_id": request_id, "besides": besides}
    return (await session.execute(_PROCESSING_BESIDES, values)).scalar_one()


async def maybe_finish(session: AsyncSession, request: TextRequest, *, ended: str | None = None) -> bool:
    """A request with nothing left to hand out and nothing running is over: release its hold.
    True when it did. `ended`: the request's real job, still processing, whose end the caller is
    writing; it is not counted, and the count flushes nothing, so the request's row is written once
    (its end with the rest)."""
    if request.state == "waiting" and request.n_remaining > 0:
        return False
    if ended is None:
        running = await processing_count(session, request.id)
    elif request.n_total - request.n_remaining <= 1:
        # Real jobs are handed out only from n_remaining and given back to it when they fail, so
        # at most n_total - n_remaining run at once; `ended` is one: none else runs (every request
        # of n = 1), and the count's round trip is spared.
        running = 0
    else:
        with session.no_autoflush:
            running = await processing_count(session, request.id, besides=ended)
    if running > 0:
        return False
    if request.state == "waiting":  # its last job was taken: its entries left then
        request.state = "done"
    await kudos.release_hold(session, request.id)
    await limits.settle_tokens(session, request.id)
    return True


async def give_back(
    session: AsyncSession, horde: Horde, request: TextRequest, *, aborted: bool, worker: Worker
) -> None:
    """A real job that lapsed or faulted returns to its request (n += 1), and neither its worker nor
    any other worker of its owner is offered the request again. The request is faulted only when
    more than `max_failures` DISTINCT OWNERS' workers failed it: names are free, so one user
    failing it under many names, or over and over, cannot fault other people's requests. The
    caller also counts the failure against the owner (`owner_limits.note_failure`), once it holds
    every request and worker row it will lock."""
    request.failures += 1
    if aborted:
        request.restarts += 1
    worker_id, owner = worker.id, str(worker.owner_id)
    # New lists, so the ORM sees a change; the row's triggers refuse the worker and its owner in the
    # queue's index. Another worker of a refused owner can still fail a job it took before.
    if worker_id not in (request.failed_workers or []):
        request.failed_workers = [*(request.failed_workers or []), worker_id]
    if owner not in (request.failed_owners or []):
        request.failed_owners = [*(request.failed_owners or []), owner]
    if request.state != "waiting":
        await maybe_finish(session, request)
        return
    if len(request.failed_owners) > horde.settings.request.max_failures:
        request.state = "faulted"
        request.n_remaining = 0
        await maybe_finish(session, request)
        return
    request.n_remaining += 1  # with none left before, its entries come back at its old place
    arrived = JobsArrived.of_request(request.id, request.any_model, request.models, 1)
    horde.notifier.jobs_on_commit(session, arrived)  # a waiting pop may take it again


async def shadow_outcome(
    session: AsyncSession,
    horde: Horde,
    generation: Generation,
    worker: Worker,
    request: TextRequest,
    outcome: str,
) -> None:
    """`job_ended`, its assignment record's outcome written now."""
    ended = job_ended(horde, generation, worker, request, outcome)
    if ended is not None:
        await write_rows(session, [ended])


def job_ended(
    horde: Horde, generation: Generation, worker: Worker, request: TextRequest, outcome: str
) -> Write | None:
    """The end of a real job (completed, faulted or aborted), wherever it ends: its assignment
    record's outcome, for the caller to write in this transaction (None: a fake job, which has no
    record), and an over-capacity job's outcome reported to the shadow metrics."""
    if generation.fake:
        return None
    horde.metrics.job_ended(outcome, request.is_chat)  # every real job's end passes here once
    ended = Write(_records, {"outcome": outcome, "ended_at": horde.clock.now()}, generation.id)  # type: ignore[arg-type]
    if not generation.over_capacity_at_assignment:
        return ended
    service = None
    if outcome == "completed" and generation.submitted_at is not None:
        service = generation.submitted_at - generation.popped_at
    horde.policies.shadow_metrics.on_outcome(
        horde.metrics,
        Outcome(
            generation_id=generation.id,
            worker_trusted=worker.trusted,
            is_chat=request.is_chat,
            max_length=request.max_length,
            outcome=outcome,
            service_seconds=service,
        ),
    )
    return ended
