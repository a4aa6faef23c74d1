"""The status of a request (what the horde-sdk polls) and its cancellation."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, and_, bindparam, select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.core.context import Horde
from horde_lite.core.errors import HordeError
from horde_lite.db.models import Generation, TextRequest, Worker
from horde_lite.jobs.lease import LapseSeen, lapse_expired, lease_ran_out, read_honouring_lapses
from horde_lite.jobs.settlement import maybe_finish
from horde_lite.queue.estimate import HEAD_WIDTH, estimate, head_columns, queued
from horde_lite.rc import Rc

FINISHED = ("ok", "censored")


async def get_request(session: AsyncSession, request_id: str, *, lock: bool = False) -> TextRequest:
    query = select(TextRequest).where(TextRequest.id == request_id)
    if lock:
        query = query.with_for_update()
    request = (await session.execute(query)).scalar_one_or_none()
    if request is None:
        raise HordeError(Rc.RequestNotFound, f"No request with id {request_id} (it may have expired).")
    return request


@dataclass(frozen=True, slots=True)
class FinishedGeneration:
    id: str
    text: str
    model: str
    state: str  # one of FINISHED
    worker_id: str
    worker_name: str
    seed: str | None  # as the worker sent it (stored as text)
    gen_metadata: list[dict[str, Any]] | None
    chat_result: dict[str, Any] | None  # a chat job's message, finish_reason and usage


def seed_value(seed: str) -> int | str:
    """A stored seed as the wire shows it: an integer when it is one (ASCII digits, one optional
    leading minus, within 64 bits), else the text; "²" and "--5" stay text, never an int() error."""
    digits = seed[1:] if seed.startswith("-") else seed
    if digits.isascii() and digits.isdigit() and -(2**63) <= int(seed) <= 2**63 - 1:
        return int(seed)
    return seed


@dataclass(frozen=True, slots=True)
class RequestStatus:
    finished: int
    processing: int
    restarted: int
    waiting: int
    done: bool
    faulted: bool
    wait_time: int
    queue_position: int
    kudos: float
    is_possible: bool
    generations: list[FinishedGeneration]  # finished ones only, in submit order


async def read(horde: Horde, request_id: str) -> RequestStatus:
    """GET /generate/text/status/{id} (no key needed). Clients poll it: it reads outside a
    transaction, and only a read that finds a lapsed job reads again in one, which honours the
    lapse (`read_honouring_lapses`)."""
    return await read_honouring_lapses(
        horde, lambda session, may_write: status(session, horde, request_id, may_write=may_write)
    )


async def cancel_and_read(horde: Horde, request_id: str) -> RequestStatus:
    """DELETE /generate/text/status/{id} (no key needed): cancel, then the status."""
    async with horde.transaction() as session:
        await cancel(session, horde, request_id)
        return await status(session, horde, request_id)


async def status(
    session: AsyncSession, horde: Horde, request_id: str, *, may_write: bool = True
) -> RequestStatus:
    """The request's status; a lapsed job of it is honoured first. `may_write` false (a session
    that only reads): such a job raises `LapseSeen` instead."""
    now = horde.clock.now()
    # The request's counters and its jobs in ONE statement (with what the wait estimate reads first
    # of the request, which saves it a statement), so they come from one snapshot: under
    # PostgreSQL's READ COMMITTED, two statements could see a pop that commits between them by
    # halves (its generation without its lowered n_remaining, or the reverse).
    # The estimate's copy of the queue catches up on its own connection while this one reads.
    caught_up = horde.mirror.catch_up(now)
    values = {"request_id": request_id}
    rows = (await session.execute(_READ, values)).all()
    if any(g is not None and lease_ran_out(g, now) for *_, g, _ in rows):
        if not may_write:
            await asyncio.shield(caught_up)  # no read left running behind the answer
            raise LapseSeen()
        # Lapses are honoured by this read even between two sweeps: the jobs are given back (the
        # lapse locks and checks again), then read again. Seen in the rows, a lapse costs a status
        # read no statement of its own when there is none. The second read refreshes the jobs the
        # first one loaded: another transaction (the sweep) may have lapsed them in between, and
        # jobs kept as first read beside the request's new counters would count one job twice.
        await lapse_expired(session, horde, now, request_id)
        fresh = {"populate_existing": True}
        rows = (await session.execute(_READ, values, execution_options=fresh)).all()
    if not rows:
        await asyncio.shield(caught_up)  # no read left running behind the answer
        raise HordeError(Rc.RequestNotFound, f"No request with id {request_id} (it may have expired).")
    state, n_remaining, restarts, kudos_spent = rows[0][:4]
    jobs = [(g, name) for *_, g, name in rows if g is not None]
    finished = [(g, name) for g, name in jobs if g.state in FINISHED]
    processing = sum(1 for g, _ in jobs if g.state == "processing")
    waiting = n_remaining if state == "waiting" else 0
    head = rows[0][4 : 4 + HEAD_WIDTH]
    if waiting:
        est = await estimate(horde, queued(request_id, head), horde.rules(now), caught_up)
    else:
        est = None
        await asyncio.shield(caught_up)  # not needed after all: no read is left running
    return RequestStatus(
        finished=len(finished),
        processing=processing,
        restarted=restarts,
        waiting=waiting,
        done=processing == 0 and waiting == 0 and state in ("done", "cancelled"),
        faulted=state == "faulted",
        wait_time=est.wait_time if est else 0,
        queue_position=(1 + est.competing_requests) if est else 0,
        kudos=round(kudos_spent, 2),
        is_possible=processing > 0 or waiting == 0 or (est is not None and est.eligible_workers > 0),
        generations=[_finished(g, name) for g, name in finished],
    )


def _read() -> Select[Any]:
    """The request's counters, what the estimate reads of it, and its jobs with their workers'
    names."""
    r = TextRequest
    return (
        select(r.state, r.n_remaining, r.restarts, r.kudos_spent, *head_columns(r), Generation, Worker.name)
        .select_from(r)
        .outerjoin(Generation, and_(Generation.request_id == r.id, Generation.fake.is_(False)))
        .outerjoin(Worker, Worker.id == Generation.worker_id)
        .where(r.id == bindparam("request_id"))
        .order_by(Generation.submitted_at)
    )


_READ = _read()


def _finished(g: Generation, worker_name: str) -> FinishedGeneration:
    return FinishedGeneration(
        id=g.id,
        text=g.text or "",
        model=g.model,
        state=g.state,
        worker_id=g.worker_id,
        worker_name=worker_name,
        seed=g.seed,
        gen_metadata=g.gen_metadata or None,
        chat_result=dict(g.chat_result) if g.chat_result else None,
    )


async def cancel(session: AsyncSession, horde: Horde, request_id: str) -> None:
    """Hand out nothing more; running jobs finish (and are paid); the hold's rest is released then."""
    request = await get_request(session, request_id, lock=True)
    if request.state == "waiting":
        request.state = "cancelled"
        request.n_remaining = 0
        await session.execute(
            Generation.__table__.update()
            .where(Generation.request_id == request_id, Generation.state == "processing")
            .values(cancel_requested=True)
        )
    await maybe_finish(session, request)
    await session.flush()
    horde.notifier.on_commit(session, request_id, remote=request.waited)
