"""What the operators' dashboard shows (docs/reference/dashboard.md), read from the tables and
returned as typed data; render.py turns it into panels, routes.py serves them.

Every read is bounded: time series are aggregated in SQL into at most `MAX_BINS` bins, lists are
limited, and the history tables are read through their `at` indexes over a fixed window.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Float, Integer, case, cast, distinct, func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ColumnElement

from horde_lite import whatif
from horde_lite.accounts.users import UserSummary, summaries
from horde_lite.core.context import Horde
from horde_lite.db.models import (
    AdmissionRecord,
    AssignmentRecord,
    CandidateRecord,
    Generation,
    QueueEntry,
    TextRequest,
    User,
    Worker,
)
from horde_lite.metrics import SIZE_BUCKETS, size_bucket
from horde_lite.operators import policy_state, usage
from horde_lite.policies.kinds import PolicyKind
from horde_lite.policies.protocols import AllowanceInputs
from horde_lite.policies.registry import CANDIDATES, PolicyError
from horde_lite.requests.admission_rule import ADMISSION_OUTCOMES

WINDOW_SECONDS = 24 * 3600.0  # the shadow and allowance panels: the last day
CANDIDATE_WINDOW_SECONDS = 7 * 86400.0  # the candidate comparison: the last week
MAX_BINS = 48
MAX_WORKERS = 200
MAX_USERS = 100  # the users panel's rows; its search narrows them
SERVICE_POINTS = 400  # the newest ended assignments drawn one dot each
RECENT_ADMISSIONS = 200
RECENT_CHANGES = 20
# Bin widths a time series may use: round numbers an operator reads at a glance.
BIN_WIDTHS = (10, 30, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 86400)
# The size buckets' upper edges (SQL), labelled by metrics.size_bucket itself so the two agree.
BUCKET_EDGES = (512, 1024, 2048, 4096)
BUCKETS = list(SIZE_BUCKETS)
OUTCOMES = ("completed", "faulted", "aborted", "cancelled", "running")


# --- the dashboard's signed sessions (a moderator's key is checked by api/guards.py) ---------------

SESSION_SECONDS = 12 * 3600
# What session_token writes, and nothing else: ASCII digits only (int() also reads other scripts'
# digits), bounded lengths (int() refuses strings beyond Python's digit limit), a hex SHA-256.
_SESSION = re.compile(r"([0-9]{1,10})\.([0-9]{1,12})\.([0-9a-f]{64})")


def _signature(user: User, expires: int) -> str:
    """HMAC-SHA256 keyed by the user's stored key hash: no server secret to configure or share
    between processes, and a new key (or a lost moderator flag, checked at every use) ends every
    session at once. The cookie never holds the key or its hash."""
    message = f"horde-lite-dashboard|{user.id}|{expires}".encode()
    return hmac.new(user.api_key_hash.encode(), message, hashlib.sha256).hexdigest()


def session_token(user: User, now: float) -> str:
    """`<user id>.<expiry>.<signature>`: what the dashboard's cookie holds after a login."""
    expires = int(now + SESSION_SECONDS)
    return f"{user.id}.{expires}.{_signature(user, expires)}"


async def session_moderator(horde: Horde, token: str | None) -> User | None:
    """The moderator a session token names, if it is well formed, unexpired, correctly signed
    with the user's current key hash, and the user is still a moderator; None otherwise."""
    parsed = _SESSION.fullmatch(token or "")
    if parsed is None:
        return None
    user_id, expires = min(int(parsed[1]), 2**31 - 1), int(parsed[2])
    if expires < horde.clock.now():
        return None
    async with horde.transaction() as session:
        user = await session.get(User, user_id)
    if user is None or not user.moderator or user.anonymous:
        return None
    return user if hmac.compare_digest(_signature(user, expires), parsed[3]) else None


# --- shared helpers ------------------------------------------------------------------------------


def bucket_sql(tokens: ColumnElement[int]) -> ColumnElement[str]:
    """size_bucket as SQL, so assignments are counted by bucket in the database."""
    whens = [(tokens <= edge, size_bucket(edge)) for edge in BUCKET_EDGES]
    return case(*whens, else_=BUCKETS[-1])


@dataclass(frozen=True, slots=True)
class Bins:
    """A time axis: `count` bins of `width` seconds from `start` (epoch seconds) up to now."""

    start: float
    width: float
    count: int

    def starts(self, now: float) -> list[float]:
        """Each bin's start relative to now (seconds, negative)."""
        return [self.start + i * self.width - now for i in range(self.count)]


def bins_for(first: float | None, now: float, window: float) -> Bins:
    """The narrowest round width whose bins, aligned on it, cover [first, now] in at most MAX_BINS
    (a young horde's minutes are not drawn as one bar of a day); the first bin holds `first`."""
    since = max(first if first is not None else now, now - window)
    for width in BIN_WIDTHS:
        start = math.floor(since / width) * width
        count = math.floor((now - start) / width) + 1
        if count <= MAX_BINS:
            return Bins(start=float(start), width=float(width), count=count)
    width = BIN_WIDTHS[-1]
    return Bins(
        start=float(math.floor(now / width) * width - (MAX_BINS - 1) * width), width=width, count=MAX_BINS
    )


def bin_sql(dialect: str, at: ColumnElement[float], bins: Bins) -> ColumnElement[int]:
    """The bin index of `at`: floor((at - start) / width). PostgreSQL rounds a float cast to an
    integer, SQLite truncates; both are floor here since `at >= start` is filtered first."""
    ratio = (at - bins.start) / bins.width
    if dialect == "postgresql":
        return cast(func.floor(ratio), Integer)
    return cast(ratio, Integer)


def _series(rows: Sequence[Any], bins: Bins, keys: Sequence[str]) -> dict[str, list[int]]:
    """(bin, key, count) rows -> a list of counts per key, one per bin."""
    out = {key: [0] * bins.count for key in keys}
    for index, key, count in rows:
        if key in out and 0 <= int(index) < bins.count:
            out[key][int(index)] += int(count)
    return out


# --- fleet --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FleetRow:
    id: str
    name: str
    models: list[str]
    state: str  # online | offline | maintenance | paused
    seen_ago: float
    lease_speed: float | None  # None: unmeasured (capacity uses the assumed speed)
    capacity: int
    threads: int
    max_length: int
    max_context_length: int
    chat: str  # the chat declarations, "" for a legacy-only worker
    completed: int
    aborted: int
    faulted: int
    trusted: bool


def _chat(worker: Worker) -> str:
    if worker.chat_max_completion_tokens is None:
        return ""
    parts = [f"{worker.chat_max_completion_tokens} out / {worker.chat_max_context_tokens} ctx"]
    if worker.chat_features:
        parts.append(", ".join(worker.chat_features))
    if worker.chat_image_transports:
        parts.append("images: " + ", ".join(worker.chat_image_transports))
    return "; ".join(parts)


async def fleet(horde: Horde) -> list[FleetRow]:
    """Every worker not deleted, online ones first, then by name."""
    now = horde.clock.now()
    online_since = horde.rules(now).online_since  # the eligibility check's own "online"
    query = (
        select(Worker)
        .where(Worker.deleted_at.is_(None))
        .order_by((Worker.last_check_in >= online_since).desc(), Worker.name)
        .limit(MAX_WORKERS)
    )
    async with horde.transaction() as session:
        workers = list((await session.execute(query)).scalars())
    rows = []
    for w in workers:
        online = w.last_check_in >= online_since
        state = (
            "offline"
            if not online
            else "paused"
            if w.paused
            else "maintenance"
            if w.maintenance
            else "online"
        )
        rows.append(
            FleetRow(
                id=w.id,
                name=w.name,
                models=list(w.models or []),
                state=state,
                seen_ago=now - w.last_check_in,
                lease_speed=w.lease_speed,
                capacity=w.capacity,
                threads=w.threads,
                max_length=w.max_length,
                max_context_length=w.max_context_length,
                chat=_chat(w),
                completed=w.completed_jobs,
                aborted=w.aborted_jobs,
                faulted=w.faulted_jobs,
                trusted=w.trusted,
            )
        )
    return rows


# --- queue and the allowance curve --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueCell:
    model: str  # "" : any model
    bucket: str
    requests: int
    oldest_wait: float


@dataclass(frozen=True, slots=True)
class LatestAdmission:
    """The newest admission decision: its estimated wait is what sized the free allowance last."""

    age: float
    estimated_wait: float | None  # None: no eligible worker
    allowance: int
    outcome: str
    curve: str


@dataclass(frozen=True, slots=True)
class QueueView:
    waiting: int
    running_jobs: int
    oldest_wait: float | None
    cells: list[QueueCell]
    latest: LatestAdmission | None
    curve_name: str
    curve: list[tuple[float, int]]  # (estimated wait, allowance) under the curve in force
    curve_reads_wait: bool
    recent: list[tuple[float, int]]  # recent admissions' (estimated wait, allowance)
    wait_full_seconds: float
    wait_floor_seconds: float
    ceiling: int
    floor: int


def curve_points(horde: Horde, latest: AdmissionRecord | None, top: float) -> list[tuple[float, int]]:
    """The curve in force sampled over estimated waits 0..top; the inputs other than the wait are
    the latest admission's (a curve that reads them, not the wait, draws flat)."""
    policy = horde.policies.allowance_curve
    points = []
    for i in range(61):
        wait = top * i / 60
        inputs = AllowanceInputs(
            estimated_wait_seconds=wait,
            competing_jobs=latest.competing_jobs if latest else 0,
            eligible_threads=max(latest.eligible_threads if latest else 1, 1),
            online_text_threads=(latest.online_text_threads or 0) if latest else 0,
            queued_text_requests=(latest.queued_text_requests or 0) if latest else 0,
            settings=horde.settings.allowance,
        )
        points.append((wait, int(policy.allowance(inputs))))
    return points


async def _admissions(session: AsyncSession, now: float) -> tuple[AdmissionRecord | None, list[Any]]:
    """The latest admission record, and the recent ones' (estimated wait, allowance)."""
    latest = (
        await session.execute(select(AdmissionRecord).order_by(AdmissionRecord.at.desc()).limit(1))
    ).scalar_one_or_none()
    recent = (
        await session.execute(
            select(AdmissionRecord.estimated_wait, AdmissionRecord.allowance)
            .where(AdmissionRecord.estimated_wait.is_not(None), AdmissionRecord.at >= now - WINDOW_SECONDS)
            .order_by(AdmissionRecord.at.desc())
            .limit(RECENT_ADMISSIONS)
        )
    ).all()
    return latest, list(recent)


def _latest(latest: AdmissionRecord, now: float) -> LatestAdmission:
    return LatestAdmission(
        age=now - latest.at,
        estimated_wait=latest.estimated_wait,
        allowance=latest.allowance,
        outcome=latest.outcome,
        curve=latest.allowance_curve,
    )


async def queue(horde: Horde) -> QueueView:
    now = horde.clock.now()
    bucket = bucket_sql(QueueEntry.need_length)
    by_cell = (
        # A targeted request has an entry per worker it names: counted once.
        select(
            QueueEntry.model,
            bucket,
            func.count(distinct(QueueEntry.request_id)),
            func.min(QueueEntry.created_at),
        )
        .group_by(QueueEntry.model, bucket)
        .order_by(QueueEntry.model, bucket)
    )
    async with horde.transaction() as session:
        cells = [
            QueueCell(model=m, bucket=b, requests=int(n), oldest_wait=now - float(oldest))
            for m, b, n, oldest in (await session.execute(by_cell)).all()
        ]
        waiting, oldest = (
            await session.execute(
                select(func.count(), func.min(TextRequest.created_at)).where(TextRequest.state == "waiting")
            )
        ).one()
        running = (
            await session.execute(
                select(func.count()).select_from(Generation).where(Generation.state == "processing")
            )
        ).scalar_one()
        latest, recent = await _admissions(session, now)
    s = horde.settings.allowance
    waits = [float(w) for w, _ in recent] + (
        [latest.estimated_wait] if latest and latest.estimated_wait else []
    )
    top = max([s.wait_floor_seconds * 1.25, *(w * 1.1 for w in waits)])
    curve = curve_points(horde, latest, top)
    return QueueView(
        waiting=int(waiting),
        running_jobs=int(running),
        oldest_wait=None if oldest is None else now - float(oldest),
        cells=cells,
        latest=None if latest is None else _latest(latest, now),
        curve_name=horde.policies.names[PolicyKind.ALLOWANCE_CURVE],
        curve=curve,
        curve_reads_wait=len({a for _, a in curve}) > 1,
        recent=[(float(w), int(a)) for w, a in recent],
        wait_full_seconds=s.wait_full_seconds,
        wait_floor_seconds=s.wait_floor_seconds,
        ceiling=s.ceiling,
        floor=s.floor,
    )


# --- policies -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PolicyRow:
    kind: str
    name: str  # the database's policy in force (this process's while no row exists yet)
    options: dict[str, Any]
    version: int
    ago: float | None  # seconds since it was put in force (None: no row yet)
    applied_name: str  # what this process runs
    in_sync: bool


@dataclass(frozen=True, slots=True)
class ChangeRow:
    ago: float
    kind: str
    old_name: str | None
    new_name: str
    options: dict[str, Any]
    source: str


@dataclass(frozen=True, slots=True)
class PoliciesView:
    in_force: list[PolicyRow]
    candidates: list[tuple[str, str, dict[str, Any]]]  # (kind, name, options)
    changes: list[ChangeRow]
    reload_seconds: float


def candidates(horde: Horde) -> list[tuple[str, str, dict[str, Any]]]:
    """The candidates the settings name ([policies] candidate_speed_gate, candidate_allowance_curve)
    with their options ([policies.candidate_<kind>.options])."""
    settings = horde.settings.policies
    out = []
    for setting, kind in CANDIDATES.items():
        name = getattr(settings, setting)
        if name:
            out.append((kind, name, dict(settings.options.get(setting, {}))))
    return out


async def policies(horde: Horde) -> PoliciesView:
    now = horde.clock.now()
    view = await policy_state.policies_view(horde)
    changes = await policy_state.history(horde, RECENT_CHANGES)
    return PoliciesView(
        in_force=[
            PolicyRow(
                kind=k.kind,
                name=k.name if k.name is not None else k.applied_name,
                options=k.options if k.name is not None else k.applied_options,
                version=k.version,
                ago=None if k.changed_at is None else now - k.changed_at,
                applied_name=k.applied_name,
                in_sync=k.in_sync,
            )
            for k in view.kinds
        ],
        candidates=candidates(horde),
        changes=[ChangeRow(now - c.at, c.kind, c.old_name, c.new_name, c.options, c.source) for c in changes],
        reload_seconds=view.reload_seconds,
    )


# --- shadow records -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShadowCell:
    bucket: str
    trusted: bool
    outcome: str  # completed | faulted | aborted | cancelled | running
    count: int


@dataclass(frozen=True, slots=True)
class ShadowView:
    since: float  # seconds ago the window starts
    assignments: int
    over_capacity: int
    cells: list[ShadowCell]
    bins: Bins
    bin_starts: list[float]  # seconds ago each bin starts (negative)
    over_by_outcome: dict[str, list[int]]  # over-capacity assignments per bin, by outcome
    service: list[tuple[float, float, bool]]  # (seconds ago, service seconds, over capacity)
    lease_base: float
    lease_max: float


def _outcome_sql() -> ColumnElement[str]:
    """The outcome, "running" while there is none. Build it once per statement: the same object
    in SELECT and GROUP BY shares its bound parameter, which PostgreSQL needs to match them."""
    return func.coalesce(AssignmentRecord.outcome, "running")


async def _service_points(session: AsyncSession, window: ColumnElement[bool]) -> list[Any]:
    """The latest ended jobs' (popped at, service seconds, over capacity), at most SERVICE_POINTS."""
    found = await session.execute(
        select(
            AssignmentRecord.at,
            cast(AssignmentRecord.ended_at - AssignmentRecord.at, Float),
            AssignmentRecord.over_capacity,
        )
        .where(window, AssignmentRecord.ended_at.is_not(None))
        .order_by(AssignmentRecord.at.desc())
        .limit(SERVICE_POINTS)
    )
    return list(found.all())


async def shadow(horde: Horde) -> ShadowView:
    now = horde.clock.now()
    since = now - WINDOW_SECONDS
    dialect = horde.engine.dialect.name
    window = AssignmentRecord.at >= since
    outcome = _outcome_sql()
    async with horde.transaction() as session:
        total, over, first = (
            await session.execute(
                select(
                    func.count(),
                    func.coalesce(func.sum(case((AssignmentRecord.over_capacity, 1), else_=0)), 0),
                    func.min(AssignmentRecord.at),
                ).where(window)
            )
        ).one()
        bucket = bucket_sql(AssignmentRecord.max_length)
        cells = (
            await session.execute(
                select(bucket, AssignmentRecord.worker_trusted, outcome, func.count())
                .where(window, AssignmentRecord.over_capacity)
                .group_by(bucket, AssignmentRecord.worker_trusted, outcome)
            )
        ).all()
        bins = bins_for(None if first is None else float(first), now, WINDOW_SECONDS)
        index = bin_sql(dialect, AssignmentRecord.at, bins)
        series = (
            await session.execute(
                select(index, outcome, func.count())
                .where(AssignmentRecord.at >= bins.start, AssignmentRecord.over_capacity)
                .group_by(index, outcome)
            )
        ).all()
        service = await _service_points(session, window)
    order = {b: i for i, b in enumerate(BUCKETS)}
    return ShadowView(
        since=now - since,
        assignments=int(total),
        over_capacity=int(over),
        cells=sorted(
            (ShadowCell(str(b), bool(t), str(o), int(n)) for b, t, o, n in cells),
            key=lambda c: (
                order.get(c.bucket, 99),
                c.trusted,
                OUTCOMES.index(c.outcome) if c.outcome in OUTCOMES else 99,
            ),
        ),
        bins=bins,
        bin_starts=bins.starts(now),
        over_by_outcome=_series(series, bins, OUTCOMES),
        service=[(float(at) - now, float(seconds), bool(oc)) for at, seconds, oc in service],
        lease_base=horde.settings.lease.base_seconds,
        lease_max=horde.settings.lease.max_seconds,
    )


# --- allowance decisions ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AllowanceView:
    totals: dict[str, int]  # by outcome, over the window
    by_requester: list[tuple[str, str, int]]  # (requester kind, outcome, count)
    bins: Bins
    bin_starts: list[float]  # seconds ago each bin starts (negative)
    by_outcome: dict[str, list[int]]


async def allowance(horde: Horde) -> AllowanceView:
    now = horde.clock.now()
    since = now - WINDOW_SECONDS
    dialect = horde.engine.dialect.name
    async with horde.transaction() as session:
        first = (
            await session.execute(select(func.min(AdmissionRecord.at)).where(AdmissionRecord.at >= since))
        ).scalar_one()
        bins = bins_for(None if first is None else float(first), now, WINDOW_SECONDS)
        index = bin_sql(dialect, AdmissionRecord.at, bins)
        series = (
            await session.execute(
                select(index, AdmissionRecord.outcome, func.count())
                .where(AdmissionRecord.at >= bins.start)
                .group_by(index, AdmissionRecord.outcome)
            )
        ).all()
        kinds = (
            await session.execute(
                select(AdmissionRecord.requester_kind, AdmissionRecord.outcome, func.count())
                .where(AdmissionRecord.at >= since)
                .group_by(AdmissionRecord.requester_kind, AdmissionRecord.outcome)
                .order_by(AdmissionRecord.requester_kind, AdmissionRecord.outcome)
            )
        ).all()
    totals = {o: 0 for o in ADMISSION_OUTCOMES}
    for _, outcome, count in kinds:
        totals[str(outcome)] = totals.get(str(outcome), 0) + int(count)
    return AllowanceView(
        totals=totals,
        by_requester=[(str(k), str(o), int(n)) for k, o, n in kinds],
        bins=bins,
        bin_starts=bins.starts(now),
        by_outcome=_series(series, bins, ADMISSION_OUTCOMES),
    )


# --- usage (operators/usage.py) ---------------------------------------------------------------------

USAGE_DAYS = 30
USAGE_TOP = 10


@dataclass(frozen=True, slots=True)
class UsageView:
    days: list[str]  # the last USAGE_DAYS days (UTC), oldest first, today last
    tokens: list[int]
    requests: list[int]
    top_users: list[usage.ReportRow]
    top_models: list[usage.ReportRow]


async def usage_history(horde: Horde) -> UsageView:
    """Daily tokens and requests over the last 30 days (today so far included), and the users and
    models that used the most tokens over them, from the usage history."""
    now = horde.clock.now()
    today = now - now % usage.DAY
    since = today - (USAGE_DAYS - 1) * usage.DAY
    async with horde.reading() as session:
        daily = {r.key: r.totals for r in await usage.report(session, usage.By.day, since)}
        users = await usage.report(session, usage.By.user, since, limit=USAGE_TOP)
        models = await usage.report(session, usage.By.model, since, limit=USAGE_TOP)
    days = [usage.day_label(int(since + i * usage.DAY)) for i in range(USAGE_DAYS)]
    empty = usage.Totals()
    return UsageView(
        days=days,
        tokens=[daily.get(d, empty).tokens for d in days],
        requests=[daily.get(d, empty).requests for d in days],
        top_users=users,
        top_models=models,
    )


# --- the candidate comparison ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DecisionCount:
    kind: str
    candidate: str
    in_force: str
    decision: str
    candidate_decision: str
    count: int


@dataclass(frozen=True, slots=True)
class CandidateView:
    candidates: list[tuple[str, str, dict[str, Any]]]
    days: float
    gate: whatif.SpeedGateReport | None  # the speed gate candidate's what-if report
    curve: whatif.AllowanceReport | None  # the allowance curve candidate's
    errors: list[str]  # a report that could not be made, and why
    counts: list[DecisionCount]  # the candidates' live shadow decisions (candidate_records)


async def candidate_comparison(horde: Horde) -> CandidateView:
    """horde_lite.whatif's reports for the configured candidates over the last 7 days, and the
    shadow decisions the candidates made beside the policies in force."""
    now = horde.clock.now()
    since = now - CANDIDATE_WINDOW_SECONDS
    chosen = candidates(horde)
    gate: whatif.SpeedGateReport | None = None
    curve: whatif.AllowanceReport | None = None
    errors: list[str] = []
    async with horde.transaction() as session:
        for kind, name, options in chosen:
            try:
                if kind == PolicyKind.SPEED_GATE:
                    gate = await whatif.speed_gate_whatif(session, name, since, None, options)
                else:
                    curve = await whatif.allowance_whatif(
                        session, name, since, None, options, settings=horde.settings.allowance
                    )
            except PolicyError as exc:  # shown in the panel; the other panels still work
                errors.append(f"{kind} {name}: {exc}")
        rows = (
            await session.execute(
                select(
                    CandidateRecord.kind, CandidateRecord.candidate, CandidateRecord.in_force,
                    CandidateRecord.decision, CandidateRecord.candidate_decision, func.count(),
                )
                .where(CandidateRecord.at >= since)
                .group_by(
                    CandidateRecord.kind, CandidateRecord.candidate, CandidateRecord.in_force,
                    CandidateRecord.decision, CandidateRecord.candidate_decision,
                )
                .order_by(CandidateRecord.kind, CandidateRecord.candidate, func.count().desc())
            )
        ).all()  # fmt: skip
    return CandidateView(
        candidates=chosen,
        days=CANDIDATE_WINDOW_SECONDS / 86400,
        gate=gate,
        curve=curve,
        errors=errors,
        counts=[DecisionCount(str(k), str(c), str(f), str(d), str(cd), int(n)) for k, c, f, d, cd, n in rows],
    )


# --- users (the panel's actions: routes.py, through accounts/profiles.py) ------------------------------


@dataclass(frozen=True, slots=True)
class UsersView:
    rows: list[UserSummary]
    search: str
    more: bool  # more users match than the panel shows


async def users(horde: Horde, search: str = "") -> UsersView:
    """The users whose names hold `search` (all when empty), oldest first, at most MAX_USERS."""
    search = search.strip()[:100]
    async with horde.transaction() as session:
        rows = await summaries(session, search=search, limit=MAX_USERS + 1)
    return UsersView(rows=rows[:MAX_USERS], search=search, more=len(rows) > MAX_USERS)
