"""A waiting pop: with `wait_seconds`, a pop that finds no job waits for one, holding no database
connection or transaction, and tries again when woken (jobs/pop_waiters.py) until its bound.

It enters the registry before its first try, so a job that arrives while that try runs wakes it
too. Before each new try it checks that its client is still there: a job claimed for a client
that has gone would be lost until its lease lapsed. A try is never started once the handler is
cancelled (the cancellation ends the wait itself)."""

from __future__ import annotations

import asyncio

from horde_lite.accounts.workers import declared_models
from horde_lite.core.context import Caller, Horde
from horde_lite.inputs import PopInput
from horde_lite.jobs import dispatch
from horde_lite.settings import Settings


def bound(settings: Settings, body: PopInput) -> int:
    """The wait applied to this pop: what it asks, at most `[pops] wait_max_seconds` (0: none)."""
    return min(body.wait_seconds, settings.pops.wait_max_seconds)


async def pop_job(horde: Horde, caller: Caller, body: PopInput, gone: asyncio.Event) -> dispatch.Popped:
    """POST /generate/text/pop with a wait: the pop's answer, with a job if one came within the
    bound, else its last empty answer (its `skipped` and messages). `gone`: set when the client
    leaves."""
    seconds = bound(horde.settings, body)
    if seconds <= 0:
        return await dispatch.pop_job(horde, caller, body)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    waiters = horde.pop_waiters
    waiter = waiters.enter(declared_models(body))
    try:
        await waiters.watching()
        popped = await dispatch.pop_job(horde, caller, body)
        while popped.offer is None:
            waiters.waits(waiter)
            if not await waiter.wait(deadline - loop.time(), gone):
                break
            popped = await dispatch.pop_job(horde, caller, body)
            pending = waiters.tried(waiter, len(popped.offer.ids) if popped.offer is not None else 0)
            if pending:  # another process's worker may have taken the job: hand on only if not
                waiters.hand_on_open(pending, await waiters.still_open(horde.reading, pending))
        return popped
    finally:
        waiters.leave(waiter)
