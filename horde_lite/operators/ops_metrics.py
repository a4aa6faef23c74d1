"""What the scrape-time gauges of /metrics show, read when /metrics is served (two aggregate
queries in one short transaction, the same SQL on SQLite and PostgreSQL) rather than kept up to date
in the pop, submit and admission paths (docs/reference/metrics.md, "Operations").

- Waiting requests: the requests a pop may take a job from (`request_offered`: waiting, with jobs
  not yet handed out, not expired). A request whose jobs are all running is not waiting.
- Queued tokens: max_length x jobs not yet handed out, the output tokens still to be asked of a
  worker (the `queued` of GET /status/models). Running jobs are not in it.
- Online workers: the eligibility check's own `worker_online` (a deleted worker's check-in is
  zeroed, so it is never online); a paused or in-maintenance worker is online and counted.

A request naming several models counts under each of them, one naming none under no model (the
same for a worker's declared models); `metrics.ops_families` folds and caps the model labels.
"""

from __future__ import annotations

from sqlalchemy import func, select

from horde_lite.core.context import Horde
from horde_lite.db.models import RequestModel, TextRequest, Worker, WorkerModel
from horde_lite.metrics import OnlineCount, OpsSnapshot, WaitingCount
from horde_lite.queue.eligibility import request_offered, worker_online


async def read(horde: Horde) -> OpsSnapshot:
    """Waiting requests and queued tokens by model and chat flag, online workers by model and kind."""
    now = horde.clock.now()
    r, rm = TextRequest, RequestModel
    tokens = func.coalesce(func.sum(r.max_length * r.n_remaining), 0)
    waiting = (
        select(rm.model, r.is_chat, func.count(r.id), tokens)
        .select_from(r)
        .outerjoin(rm, rm.request_id == r.id)  # no row: the request names no model
        .where(*request_offered(r, now))
        .group_by(rm.model, r.is_chat)
    )
    chat = Worker.chat_max_completion_tokens.is_not(None)  # a chat block declared
    online = (
        select(WorkerModel.model, chat, func.count(Worker.id))
        .select_from(Worker)
        .outerjoin(WorkerModel, WorkerModel.worker_id == Worker.id)
        .where(worker_online(Worker, horde.rules(now)))
        .group_by(WorkerModel.model, chat)
    )
    async with horde.reading() as session:
        waiting_rows = (await session.execute(waiting)).all()
        online_rows = (await session.execute(online)).all()
    return OpsSnapshot(
        waiting=[
            WaitingCount(model=model, chat=bool(is_chat), requests=int(count), tokens=int(tokens))
            for model, is_chat, count, tokens in waiting_rows
        ],
        online=[
            OnlineCount(model=model, kind="chat" if is_chat else "legacy", workers=int(count))
            for model, is_chat, count in online_rows
        ],
    )
