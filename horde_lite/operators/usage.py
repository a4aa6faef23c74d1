"""Durable usage history (docs/reference/usage.md): one `usage_records` row per clock hour (UTC),
requester, worker, model and shared key, added to by every settlement in its own transaction and
kept after the requests and jobs it describes expire.

The write is one INSERT ... ON CONFLICT DO UPDATE that adds to the row (`rows.Write` with `adds`,
sent with the settlement's other writes), so concurrent settlements of one row add up exactly on
PostgreSQL; the kudos it adds are the ledger's own amounts (the charge and the reward
`kudos.charge_job` recorded), so the history and the ledger cannot disagree.
The reads serve the statistics routes, user records, team statistics, the CLI and the dashboard.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.accounts.users import display_name
from horde_lite.db.models import UsageRecord, User, Worker
from horde_lite.db.rows import Write

HOUR = 3600
DAY = 86400
NO_SHARED_KEY = ""  # the key column's sentinel: a NULL would never conflict, and so never add up

_usage = UsageRecord.__table__
# What a settlement adds to its row (the rest of the row is its key and the worker's owner).
_SUMS = ("requests", "jobs", "tokens", "kudos_spent", "kudos_earned")


def hour_of(at: float) -> int:
    """The start (epoch seconds, UTC) of the clock hour `at` falls in."""
    return int(at // HOUR) * HOUR


def settlement(
    *,
    at: float,
    requester_id: int,
    shared_key_hash: str | None,
    worker_id: str,
    owner_id: int,
    model: str,
    first_of_request: bool,
    tokens: int,
    charged: float,
    rewarded: float,
) -> Write:
    """One settled job's addition to its hour's row, for the caller to write with the settlement's
    other writes (`rows.write_rows`): the charge its requester paid, the reward its worker's owner
    earned, its tokens, and the request itself when this is its first settled job (a request is
    counted once, by the job that first served it)."""
    values = {
        "hour": hour_of(at),
        "user_id": requester_id,
        "worker_id": worker_id,
        "model": model,
        "shared_key_hash": shared_key_hash or NO_SHARED_KEY,
        "owner_id": owner_id,
        "requests": 1 if first_of_request else 0,
        "jobs": 1,
        "tokens": tokens,
        "kudos_spent": charged,
        "kudos_earned": rewarded,
    }
    return Write(_usage, values, adds=_SUMS)  # type: ignore[arg-type]


async def trim(session: AsyncSession, now: float, keep_days: int) -> int:
    """Delete the hours older than `keep_days` days (0 keeps everything); the rows deleted."""
    if keep_days <= 0:
        return 0
    cutoff = hour_of(now - keep_days * DAY)
    result = await session.execute(delete(UsageRecord).where(UsageRecord.hour < cutoff))
    return int(getattr(result, "rowcount", 0) or 0)


# --- reads ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Totals:
    requests: int = 0
    jobs: int = 0
    tokens: int = 0
    kudos_spent: float = 0.0
    kudos_earned: float = 0.0


_TOTALS = (
    func.coalesce(func.sum(UsageRecord.requests), 0),
    func.coalesce(func.sum(UsageRecord.jobs), 0),
    func.coalesce(func.sum(UsageRecord.tokens), 0),
    func.coalesce(func.sum(UsageRecord.kudos_spent), 0.0),
    func.coalesce(func.sum(UsageRecord.kudos_earned), 0.0),
)


def _totals(row: Sequence[Any]) -> Totals:
    requests, jobs, tokens, spent, earned = row
    return Totals(int(requests), int(jobs), int(tokens), round(float(spent), 2), round(float(earned), 2))


def _window(since: float | None, until: float | None = None) -> list[ColumnElement[bool]]:
    """The hours that began at or after `since` and before `until`."""
    where = []
    if since is not None:
        where.append(UsageRecord.hour >= since)
    if until is not None:
        where.append(UsageRecord.hour < until)
    return where


async def worker_totals(
    session: AsyncSession, worker_ids: Iterable[str], since: float | None = None
) -> dict[str, Totals]:
    """Each worker's settled jobs, tokens and the kudos its owner earned by them (and the kudos its
    requesters paid), over the hours that began at or after `since` (None: all the history kept).
    A worker with no history has no entry."""
    ids = sorted(set(worker_ids))
    if not ids:
        return {}
    rows = await session.execute(
        select(UsageRecord.worker_id, *_TOTALS)
        .where(UsageRecord.worker_id.in_(ids), *_window(since))
        .group_by(UsageRecord.worker_id)
    )
    return {worker_id: _totals(rest) for worker_id, *rest in rows}


@dataclass(frozen=True, slots=True)
class UserUsage:
    """What upstream's UserRecords count for text: as a requester (`requests`, `usage_tokens`) and
    as the owner of workers (`fulfilled`, `contributed_tokens`)."""

    requests: int = 0
    usage_tokens: int = 0
    fulfilled: int = 0
    contributed_tokens: int = 0


async def user_usage(session: AsyncSession, user_ids: Iterable[int]) -> dict[int, UserUsage]:
    """The records of `user_ids` from the history kept, in two grouped queries."""
    ids = sorted(set(user_ids))
    if not ids:
        return {}
    asked: dict[int, tuple[int, int]] = {}
    rows = await session.execute(
        select(UsageRecord.user_id, func.sum(UsageRecord.requests), func.sum(UsageRecord.tokens))
        .where(UsageRecord.user_id.in_(ids))
        .group_by(UsageRecord.user_id)
    )
    for user_id, requests, tokens in rows:
        asked[user_id] = (int(requests), int(tokens))
    served: dict[int, tuple[int, int]] = {}
    rows = await session.execute(
        select(UsageRecord.owner_id, func.sum(UsageRecord.jobs), func.sum(UsageRecord.tokens))
        .where(UsageRecord.owner_id.in_(ids))
        .group_by(UsageRecord.owner_id)
    )
    for owner_id, jobs, tokens in rows:
        served[owner_id] = (int(jobs), int(tokens))
    return {
        i: UserUsage(*asked.get(i, (0, 0)), *served.get(i, (0, 0))) for i in ids if i in asked or i in served
    }


async def window_totals(session: AsyncSession, since: float | None) -> Totals:
    """Everything settled in the hours that began at or after `since` (None: all kept)."""
    return _totals((await session.execute(select(*_TOTALS).where(*_window(since)))).one())


async def model_jobs(session: AsyncSession, since: float | None) -> dict[str, int]:
    """Settled jobs per model in the hours that began at or after `since` (None: all kept)."""
    rows = await session.execute(
        select(UsageRecord.model, func.sum(UsageRecord.jobs))
        .where(*_window(since))
        .group_by(UsageRecord.model)
        .order_by(UsageRecord.model)
    )
    return {model: int(jobs) for model, jobs in rows}


class By(StrEnum):
    """What a usage report groups by."""

    user = "user"
    model = "model"
    worker = "worker"
    day = "day"


@dataclass(frozen=True, slots=True)
class ReportRow:
    key: str  # the user's name#id, the model, the worker's name, or the day (YYYY-MM-DD, UTC)
    totals: Totals


def day_label(hour: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(hour - hour % DAY, UTC).strftime("%Y-%m-%d")


async def report(
    session: AsyncSession,
    by: By,
    since: float | None,
    until: float | None = None,
    *,
    limit: int | None = None,
) -> list[ReportRow]:
    """The history between `since` and `until` (hours that began in [since, until)) grouped `by`:
    days in order, the others by tokens (most first), at most `limit` rows."""
    window = _window(since, until)
    if by is By.day:
        days: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0, 0.0, 0.0])
        rows = await session.execute(
            select(UsageRecord.hour, *_TOTALS)
            .where(*window)
            .group_by(UsageRecord.hour)
            .order_by(UsageRecord.hour)
        )
        for hour, *sums in rows:
            day = days[day_label(hour)]
            for i, value in enumerate(sums):
                day[i] += value
        out = [ReportRow(key, _totals(sums)) for key, sums in days.items()]
        return out[-limit:] if limit else out
    if by is By.user:
        key_of: Any = UsageRecord.user_id
        named = select(User)
    elif by is By.worker:
        key_of = UsageRecord.worker_id
        named = select(Worker.id, Worker.name)
    else:
        key_of = UsageRecord.model
        named = None
    query = select(key_of, *_TOTALS).where(*window).group_by(key_of).order_by(_TOTALS[2].desc(), key_of)
    if limit:
        query = query.limit(limit)
    grouped = [(key, _totals(rest)) for key, *rest in await session.execute(query)]
    names: dict[Any, str] = {}
    if named is not None and grouped:
        ids = [key for key, _ in grouped]
        column = User.id if by is By.user else Worker.id
        for row in await session.execute(named.where(column.in_(ids))):
            if by is By.user:
                names[row[0].id] = display_name(row[0])
            else:
                names[row[0]] = row[1]
    return [ReportRow(names.get(key, str(key)) if named is not None else key, t) for key, t in grouped]
