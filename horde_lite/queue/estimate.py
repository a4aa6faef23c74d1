"""The wait estimate (docs/explanation/dispatch.md), read by admission and the status route.

Eligible workers of R: online workers passing the eligibility check for R. Competing work: the
queued output of requests ahead of R that at least one of them could take. Estimated wait:
competing work / the eligible workers' combined lease speed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.core.context import Horde
from horde_lite.db.models import TextRequest, Worker
from horde_lite.queue.eligibility import (
    REQUEST_FACT_COLUMNS,
    REQUEST_FACT_JSON,
    Rules,
    fact_columns,
    request_facts,
    request_facts_of,
    request_offered,
)
from horde_lite.queue.mirror import Estimate, Queued

__all__ = ["Estimate", "estimate", "estimate_request", "head_columns", "horde_totals", "queued", "queued_row"]


def head_columns(r: Any) -> tuple[Any, ...]:
    """What the estimate reads of R: its own remaining output, its queue key and its facts (a
    reader of R's row selects them with it; `queued` takes their values)."""
    facts = fact_columns(r, REQUEST_FACT_COLUMNS, REQUEST_FACT_JSON)
    return (r.max_length * r.n_remaining, r.effective_start, r.created_at, *facts)


HEAD_WIDTH = 3 + len(REQUEST_FACT_COLUMNS)


def queued(request_id: str, head: Sequence[Any]) -> Queued:
    """R as the estimate reads it, from the values of `head_columns`."""
    own, start, created, *facts = head
    return Queued(request_id, start, created, int(own or 0), request_facts_of(facts))


def queued_row(row: TextRequest) -> Queued:
    """R from its object (a request being admitted, not yet committed)."""
    return Queued(
        row.id, row.effective_start, row.created_at, row.max_length * row.n_remaining, request_facts(row)
    )


async def estimate(
    horde: Horde, r: Queued, rules: Rules, started: asyncio.Task[None] | None = None
) -> Estimate:
    """R's eligible workers and the competing work ahead of R, read from this process's copy of the
    queue and the fleet (queue/mirror.py) once it has caught up with every commit made before
    this call (or since `started`, a catch-up the caller began earlier: `horde.mirror.catch_up`).
    The walk stops at R, or once the work counted would keep R's eligible workers busy
    for the horizon (`[allowance] estimate_horizon_seconds`): a longer wait changes no allowance,
    and past it the figures are lower bounds."""
    return (await horde.mirror.current(rules.now, started)).estimate(r, rules)


async def estimate_request(horde: Horde, session: AsyncSession, request_id: str, rules: Rules) -> Estimate:
    """The estimate of a request by id (its row read in `session`); all zeros when there is none."""
    head = (await session.execute(_HEAD, {"request_id": request_id})).one_or_none()
    if head is None:
        return Estimate(0, 0, 0.0, 0, 0, 0, 0)
    return await estimate(horde, queued(request_id, head), rules)


_HEAD = select(*head_columns(TextRequest)).where(TextRequest.id == bindparam("request_id"))


async def horde_totals(session: AsyncSession, rules: Rules) -> tuple[int, int]:
    """(online text threads, queued text requests) horde-wide, for the horde_queue curve."""
    threads = (
        await session.execute(
            select(func.coalesce(func.sum(Worker.threads), 0)).where(
                Worker.last_check_in >= rules.online_since, Worker.paused.is_(False)
            )
        )
    ).scalar_one()
    queued = (
        await session.execute(
            select(func.count(TextRequest.id)).where(*request_offered(TextRequest, rules.now))
        )
    ).scalar_one()
    return int(threads), int(queued)
