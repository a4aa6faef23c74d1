"""A request's allow-list (`workers`) and deny-list (`worker_blacklist`): bounded in length, and
reduced to workers that exist.

Both lists name workers by id (eligibility compares them with `workers.id`; a name is never
matched). An id is compared in its canonical form (a UUID in lowercase with dashes, as upstream
parses it). A deleted worker, whose id answers WorkerNotFound, counts as not existing.

- Longer than `[request] max_worker_list`: refused with BadRequest, before any statement.
- A deny-list entry naming no existing worker is dropped: such an id can never pop (new workers get
  new ids), so refusing it would protect nothing, and storing it would let one request write as many
  rows to queue_refusals as its body holds.
- An allow-list naming a worker that does not exist is refused with WorkerNotFound, as upstream
  refuses it: the request could otherwise wait for a worker that can never come.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from sqlalchemy import bindparam, select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.core.errors import HordeError
from horde_lite.db.models import Worker
from horde_lite.inputs import TextRequestInput
from horde_lite.rc import Rc

_EXISTING = select(Worker.id).where(
    Worker.id.in_(bindparam("ids", expanding=True)), Worker.deleted_at.is_(None)
)


def check_lengths(body: TextRequestInput, most: int) -> None:
    """Refuse a `workers` or `worker_blacklist` list naming more than `most` workers."""
    lists = {"workers": body.workers}
    if isinstance(body.worker_blacklist, list):
        lists["worker_blacklist"] = body.worker_blacklist
    for field, names in lists.items():
        if len(names) > most:
            message = f"{field} may name at most {most} workers; it names {len(names)}."
            raise HordeError(Rc.BadRequest, message, param=field, errors={field: message})


def canonical(worker_id: str) -> str | None:
    """The id as workers.id holds it, or None when it is no worker id at all."""
    try:
        return str(uuid.UUID(worker_id))
    except ValueError:
        return None


async def existing(session: AsyncSession, ids: Iterable[str]) -> set[str]:
    """Those of `ids` (canonical) that name a worker that exists."""
    wanted = sorted(set(ids))
    if not wanted:
        return set()
    return set((await session.execute(_EXISTING, {"ids": wanted})).scalars())


async def resolve(session: AsyncSession, allow: list[str], deny: list[str]) -> tuple[list[str], list[str]]:
    """The allow-list and deny-list a request keeps: canonical ids of existing workers, in the
    order given, each once. Raises WorkerNotFound for an allow-list entry naming no worker."""
    allow_ids = {name: canonical(name) for name in allow}
    deny_ids = {name: canonical(name) for name in deny}
    found = await existing(session, [i for i in (*allow_ids.values(), *deny_ids.values()) if i is not None])
    for name, worker_id in allow_ids.items():
        if worker_id not in found:
            raise HordeError(Rc.WorkerNotFound, f"Worker with ID {name[:100]!r} not found.", param="workers")
    kept_allow = list(dict.fromkeys(i for i in allow_ids.values() if i is not None))
    kept_deny = list(dict.fromkeys(i for i in deny_ids.values() if i in found))
    return kept_allow, kept_deny
