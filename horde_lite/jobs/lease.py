"""Leases: progress posts extend a streaming chat job's lease; a lapsed lease aborts the job and
gives it back; the sweep finds lapses and expired requests (docs/reference/chat_requests.md,
"Job lease"; expiry: docs/reference/horde_api.md)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy import bindparam, delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.accounts import kudos, limits, owner_limits, worker_messages
from horde_lite.core.context import Caller, Horde
from horde_lite.core.errors import HordeError
from horde_lite.db import change_log
from horde_lite.db.models import Generation, RequestModel, TextRequest, Worker
from horde_lite.jobs.settlement import give_back, processing_count, shadow_outcome
from horde_lite.operators import usage
from horde_lite.rc import Rc

log = logging.getLogger("horde_lite.lease")

T = TypeVar("T")


async def lapse(
    session: AsyncSession,
    horde: Horde,
    generation: Generation,
    worker: Worker,
    request: TextRequest,
    *,
    noted: list[Worker] | None = None,
) -> None:
    """Abort one generation whose lease ran out: the job is delayed, not lost. The failure counts
    against the worker's owner now, or is appended to `noted` for the caller to count once it has
    locked every request and worker it will (a users row is locked after them)."""
    generation.state = "aborted"
    if generation.fake:
        return
    worker.aborted_jobs += 1
    await give_back(session, horde, request, aborted=True, worker=worker)
    if noted is None:
        await owner_limits.note_failure(session, horde.settings, worker, horde.clock.now())
    else:
        noted.append(worker)
    await shadow_outcome(session, horde, generation, worker, request, "aborted")
    horde.notifier.on_commit(session, request.id, remote=request.waited)
    log.info("lease lapsed generation=%s request=%s worker=%s", generation.id, request.id, worker.id)


def lease_ran_out(generation: Generation, now: float) -> bool:
    """A job still processing past its lease: `_LAPSED`'s test, for a job already read."""
    return generation.state == "processing" and generation.lease_expires_at < now


LAPSED = "This generation's lease lapsed; the job was given back to the queue."  # AbortedGen's message


class JobLapsed(HordeError):
    """The job's lease had run out when its worker posted about it: the lapse is applied in the
    post's transaction, which is then committed (`as_lease_holder`) and the post refused."""

    def __init__(self) -> None:
        super().__init__(Rc.AbortedGen, LAPSED)


class LapseSeen(Exception):
    """A read outside a transaction (`Horde.reading`) found a running job whose lease ran out: the
    caller reads again in a transaction, which honours the lapse first (`lapse_expired`)."""


async def read_honouring_lapses(horde: Horde, read: Callable[[AsyncSession, bool], Awaitable[T]]) -> T:
    """`read(session, may_write)` outside any transaction (may_write False: no write lock on SQLite,
    no BEGIN or COMMIT on PostgreSQL); only when it meets a lapsed job (`LapseSeen`) again in a
    transaction (may_write True), where it honours the lapse first. For reads that clients poll."""
    try:
        async with horde.reading() as session:
            return await read(session, False)
    except LapseSeen:
        pass
    async with horde.transaction() as session:
        return await read(session, True)


# The requests with a lapsed job (at most 500 a pass), built once: every status read asks it of its
# own request (a submit or progress post finds its own job's lapse as it loads it).
_LAPSED = (
    select(Generation.request_id)
    .where(Generation.state == "processing", Generation.lease_expires_at < bindparam("now"))
    .order_by(Generation.lease_expires_at)
    .limit(500)
)
_LAPSED_OF_REQUEST = _LAPSED.where(Generation.request_id == bindparam("of"))


async def lapse_expired(
    session: AsyncSession,
    horde: Horde,
    now: float,
    request_id: str | None = None,
) -> int:
    """Abort every processing generation whose lease has lapsed (optionally of one request: reads
    that depend on a lapse honour it between two sweeps)."""
    if request_id is not None:
        query, values = _LAPSED_OF_REQUEST, {"now": now, "of": request_id}
    else:
        query, values = _LAPSED, {"now": now}
    request_ids = sorted(set((await session.execute(query, values)).scalars()))
    # The sweep skips a request another transaction holds (the next pass takes it); a read that
    # must honour the lapse waits for it.
    sweeping = request_id is None
    count = 0
    noted: list[Worker] = []
    for rid in request_ids:
        # Lock order: the request, then its generations, then the worker (as submit and cancel).
        locked = (
            select(TextRequest)
            .where(TextRequest.id == rid)
            .with_for_update(skip_locked=sweeping)
            .execution_options(populate_existing=True)
        )
        request = (await session.execute(locked)).scalar_one_or_none()
        if request is None:
            continue
        generations = (
            select(Generation)
            .where(Generation.request_id == rid, Generation.state == "processing")
            .where(Generation.lease_expires_at < now)
            .with_for_update()
            .execution_options(populate_existing=True)
        )
        for generation in list((await session.execute(generations)).scalars()):
            worker = await session.get(
                Worker, generation.worker_id, with_for_update=True, populate_existing=True
            )
            if worker is not None:
                await lapse(session, horde, generation, worker, request, noted=noted)
                count += 1
    # The owners' users rows last, in ascending id (the lock order): waiting for the next worker
    # row while holding an owner's could deadlock with that worker's submit, which locks users rows.
    for worker in sorted(noted, key=lambda w: w.owner_id):
        await owner_limits.note_failure(session, horde.settings, worker, now)
    await session.flush()
    return count


async def expire_requests(session: AsyncSession, horde: Horde, now: float) -> int:
    """Remove requests past their expiry with nothing running, with their results; release holds."""
    # Lock the request first (the lock order of submit and cancel); skip one another holds.
    expired = select(TextRequest.id).where(TextRequest.expires_at < now).limit(500)
    candidates = (await session.execute(expired.with_for_update(skip_locked=True))).scalars()
    removed = 0
    for request_id in list(candidates):
        if await processing_count(session, request_id) > 0:
            continue
        await kudos.release_hold(session, request_id)
        await limits.settle_tokens(session, request_id)
        await session.execute(delete(Generation).where(Generation.request_id == request_id))
        await session.execute(delete(RequestModel).where(RequestModel.request_id == request_id))
        await session.execute(delete(TextRequest).where(TextRequest.id == request_id))
        horde.notifier.on_commit(session, request_id)
        removed += 1
    await limits.forget_before(session, now)
    return removed


async def as_lease_holder(
    horde: Horde, caller: Caller, act: Callable[[AsyncSession, str | None], Awaitable[T]]
) -> T:
    """A worker's post about one of its jobs (a submit, a progress post), in one transaction. `act`
    gets the caller's key and loads the job with it (`completion.load_generation_for_worker`), which
    authenticates the worker's owner in the statement that reads the job's request, and aborts and
    gives back a job whose lease ran out; that lapse is committed, and the post is then refused
    with AbortedGen (`JobLapsed`)."""
    async with horde.transaction() as session:
        try:
            return await act(session, caller.apikey)
        except JobLapsed as lapsed:
            refused = lapsed  # leaving the block normally commits the lapse
    raise refused


async def sweep(horde: Horde) -> tuple[int, int]:
    """One pass of the periodic sweep, in its own short transaction."""
    now = horde.clock.now()
    async with horde.transaction() as session:
        lapsed = await lapse_expired(session, horde, now)
        expired = await expire_requests(session, horde, now)
        await change_log.prune(session)  # the notes every process has read by now
        await usage.trim(session, now, horde.settings.usage.keep_days)
        await worker_messages.trim(session, now, horde.settings.messages.keep_expired_days)
    return lapsed, expired
