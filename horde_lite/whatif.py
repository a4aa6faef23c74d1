"""`horde-lite whatif`: what a policy would have decided over the stored history.

Every real assignment leaves an assignment record (its sizes, the worker's capacity and trust,
whether a capable worker was online when it was over capacity, and how the job ended) and every
admission decision an admission record (what the allowance curve read and what the outcome rule
read). Those records outlive their requests, so any installed speed gate or allowance curve can be
judged over them: the gate by its Python half, the curve by its `allowance`, the outcome by the
same pure function admission uses (`admission_rule.outcome_for`). The report functions are pure over
the records and return typed reports; `render_*` turns them into the command's text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.db.models import AdmissionRecord, AssignmentRecord
from horde_lite.metrics import SIZE_BUCKETS, size_bucket
from horde_lite.policies.kinds import PolicyKind
from horde_lite.policies.protocols import AllowanceCurve, AllowanceInputs, GateInputs, SpeedGate
from horde_lite.policies.registry import build
from horde_lite.requests.admission_rule import ADMISSION_OUTCOMES, outcome_for
from horde_lite.settings import AllowanceSettings

# --- time ------------------------------------------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(text: str, now: float) -> float:
    """`7d`, `24h`, `90m`, `30s`, `2w` (that long before `now`), an ISO date or date-time (UTC
    unless it names a zone), or epoch seconds."""
    found = _DURATION.match(text)
    if found:
        return now - float(found.group(1)) * _UNIT_SECONDS[found.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError as e:
        raise ValueError(f"{text!r} is neither a duration (7d, 24h, 90m) nor a date or time") from e
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def day_of(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).date().isoformat()


def _stamp(at: float | None) -> str:
    if at is None:
        return "now"
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


# --- the speed gate --------------------------------------------------------------------------------


@dataclass(slots=True)
class GateCell:
    """One day, size bucket (of max_length) and worker trust."""

    day: str
    size_bucket: str
    trusted: bool
    assignments: int = 0  # real assignments recorded
    over_capacity: int = 0
    refused: int = 0  # jobs the gate would have refused to the worker that took them
    moved: int = 0  # ... of which a capable worker for the request was online
    no_eligible_worker: int = 0  # ... of which none was
    capable_unknown: int = 0  # ... of which the record does not say (refused within capacity)
    undecided: int = 0  # the gate's answer depends on a capable worker, not recorded (within capacity)
    aborts_avoided: int = 0  # refused jobs that ended aborted (their lease lapsed)
    faulted: int = 0  # refused jobs that faulted
    completed: int = 0  # refused jobs that completed
    running: int = 0  # refused jobs with no outcome yet
    service_seconds: float = 0.0  # pop to submit of the refused jobs that completed, summed
    aborted_lease_seconds: float = 0.0  # pop to lapse of the refused jobs that were aborted, summed

    def add(self, other: GateCell) -> None:
        for name in _GATE_COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))


_GATE_COUNTS = (
    "assignments", "over_capacity", "refused", "moved", "no_eligible_worker", "capable_unknown",
    "undecided", "aborts_avoided", "faulted", "completed", "running", "service_seconds",
    "aborted_lease_seconds",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class SpeedGateReport:
    gate: str
    options: dict[str, Any]
    since: float
    until: float | None
    in_force: list[str]  # the gates in force over the records
    cells: list[GateCell]  # by day, size bucket, trust; only cells with assignments
    total: GateCell
    unknowns: list[str] = field(default_factory=list)  # what the history cannot say, plainly


def _gate_verdict(gate: SpeedGate, record: AssignmentRecord) -> bool | None:
    """True: the gate would have refused this job to this worker; None: it cannot be told."""

    def allows(online: bool) -> bool:
        inputs = GateInputs(record.is_chat, record.max_length, record.capacity, online)
        return gate.admits(inputs)

    if record.capable_online is not None:
        return not allows(record.capable_online)
    # Not asked at the pop (the job was within capacity): the answer is known when it does not
    # depend on it.
    without, with_ = allows(False), allows(True)
    return not without if without == with_ else None


def speed_gate_report(
    gate_name: str,
    gate: SpeedGate,
    records: Iterable[AssignmentRecord],
    since: float,
    until: float | None,
    options: dict[str, Any] | None = None,
) -> SpeedGateReport:
    """Judge `gate` over assignment records (pure: no database)."""
    cells: dict[tuple[str, str, bool], GateCell] = {}
    in_force: set[str] = set()
    for record in records:
        in_force.add(record.speed_gate)
        key = (day_of(record.at), size_bucket(record.max_length), record.worker_trusted)
        cell = cells.setdefault(key, GateCell(*key))
        cell.assignments += 1
        cell.over_capacity += record.over_capacity
        verdict = _gate_verdict(gate, record)
        if verdict is None:
            cell.undecided += 1
            continue
        if not verdict:
            continue
        _count_refused(cell, record)
    order = {bucket: i for i, bucket in enumerate(SIZE_BUCKETS)}
    ordered = sorted(cells.values(), key=lambda c: (c.day, order[c.size_bucket], c.trusted))
    total = GateCell("total", "all", False)
    for cell in ordered:
        total.add(cell)
    unknowns = [
        "the wait a moved job would have had: a capable worker was online, but how busy it was is "
        "not recorded",
        "how long a job with no eligible worker would have waited for one to come online (under this gate "
        "it waits; a /v1 chat client is answered 503 after its grace)",
    ]
    if total.undecided:
        unknowns.append(
            f"{total.undecided} job(s) within capacity where this gate asks whether a capable worker was "
            "online: that is recorded only for over-capacity jobs"
        )
    return SpeedGateReport(
        gate=gate_name,
        options=dict(options or {}),
        since=since,
        until=until,
        in_force=sorted(in_force),
        cells=ordered,
        total=total,
        unknowns=unknowns,
    )


def _count_refused(cell: GateCell, record: AssignmentRecord) -> None:
    """Count in `cell` an assignment the gate would have refused: where it would have gone and
    what its job cost."""
    cell.refused += 1
    if record.capable_online is None:
        cell.capable_unknown += 1
    elif record.capable_online:
        cell.moved += 1
    else:
        cell.no_eligible_worker += 1
    ran = (record.ended_at - record.at) if record.ended_at is not None else 0.0
    if record.outcome == "aborted":
        cell.aborts_avoided += 1
        cell.aborted_lease_seconds += ran
    elif record.outcome == "faulted":
        cell.faulted += 1
    elif record.outcome == "completed":
        cell.completed += 1
        cell.service_seconds += ran
    else:
        cell.running += 1


async def speed_gate_whatif(
    session: AsyncSession,
    gate_name: str,
    since: float,
    until: float | None,
    options: dict[str, Any] | None = None,
) -> SpeedGateReport:
    """What the installed gate `gate_name` would have refused over the assignments recorded in
    [since, until) (until None: no upper bound). An unknown name raises PolicyError listing the
    installed gates."""
    gate = build(PolicyKind.SPEED_GATE, gate_name, dict(options or {}))
    query = select(AssignmentRecord).where(AssignmentRecord.at >= since).order_by(AssignmentRecord.at)
    if until is not None:
        query = query.where(AssignmentRecord.at < until)
    records = (await session.execute(query)).scalars()
    return speed_gate_report(gate_name, gate, records, since, until, options)


def _seconds(total: float, count: int) -> str:
    """A total and its mean over `count` (> 0: the sentences that use it say so when there is none)."""
    return f"{total:.1f} s (mean {total / count:.1f} s)"


def _names_in_force(names: list[str], records: str) -> str:
    """The policies in force over the records, or in words why there is none to name."""
    return ", ".join(names) or f"none known (no {records} recorded in this window)"


def render_speed_gate(report: SpeedGateReport) -> str:
    options = ", ".join(f"{k}={v}" for k, v in sorted(report.options.items())) or "default options"
    t = report.total
    lines = [
        f"What if the speed gate were {report.gate} ({options})",
        f"assignments recorded {_stamp(report.since)} to {_stamp(report.until)}: {t.assignments}; "
        f"gate in force: {_names_in_force(report.in_force, 'assignment')}",
        "",
        f"{'day':10}  {'size':9}  {'trust':9}  {'assigned':>8}  {'over cap':>8}  {'refused':>7}  "
        f"{'moved':>5}  {'no worker':>9}  {'unknown':>7}  {'aborts avoided':>14}  {'completed':>9}",
    ]
    for c in [*report.cells, t]:
        trust = "" if c is t else ("trusted" if c.trusted else "untrusted")
        bucket = "" if c is t else c.size_bucket
        lines.append(
            f"{c.day:10}  {bucket:9}  {trust:9}  {c.assignments:>8}  {c.over_capacity:>8}  {c.refused:>7}  "
            f"{c.moved:>5}  {c.no_eligible_worker:>9}  {c.capable_unknown:>7}  {c.aborts_avoided:>14}  "
            f"{c.completed:>9}"
        )
    lines += [
        "",
        f"Jobs this gate would have refused: {t.refused}. Moved to other workers (a capable worker was "
        f"online): {t.moved}. Would have found no eligible worker: {t.no_eligible_worker}."
        + (
            f" Not recorded whether a capable worker was online: {t.capable_unknown}."
            if t.capable_unknown
            else ""
        ),
        f"Aborts avoided: {t.aborts_avoided} (those jobs held their lease "
        f"{_seconds(t.aborted_lease_seconds, t.aborts_avoided)} before going back to the queue)."
        if t.aborts_avoided
        else "Aborts avoided: none (no job this gate would have refused was aborted).",
        "Extra waiting:",
        f"- known: the {t.completed} refused job(s) that completed took "
        f"{_seconds(t.service_seconds, t.completed)} of service on the slower workers, pop to "
        "submit; a moved job would instead have waited for, and run on, a capable worker."
        if t.completed
        else "- known: no job this gate would have refused completed, so there is no service time on "
        "slower workers to compare.",
        *(f"- not known: {u}." for u in report.unknowns),
    ]
    if t.faulted or t.running:
        lines.append(f"Refused jobs that faulted: {t.faulted}; still running: {t.running}.")
    return "\n".join(lines)


# --- the allowance curve ---------------------------------------------------------------------------


@dataclass(slots=True)
class AllowanceDay:
    day: str
    decisions: int = 0
    in_force: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ADMISSION_OUTCOMES, 0))
    # The candidate's outcomes of the decisions it could recompute (the others are `unknown`).
    would_be: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ADMISSION_OUTCOMES, 0))
    unknown: int = 0
    unknown_totals: int = 0  # the curve reads horde-wide totals, which were not read then
    unknown_funds: int = 0  # not free under the curve, and whether the requester could pay was not read
    changed: int = 0  # decisions whose outcome would differ
    allowance_lower: int = 0
    allowance_higher: int = 0
    transitions: dict[str, int] = field(default_factory=dict)  # "free -> refused": count

    def add(self, other: AllowanceDay) -> None:
        for name in ("decisions", "unknown", "unknown_totals", "unknown_funds", "changed",
                     "allowance_lower", "allowance_higher"):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for mine, theirs in ((self.in_force, other.in_force), (self.would_be, other.would_be),
                             (self.transitions, other.transitions)):  # fmt: skip
            for key, count in theirs.items():
                mine[key] = mine.get(key, 0) + count


@dataclass(frozen=True, slots=True)
class AllowanceReport:
    curve: str
    options: dict[str, Any]
    since: float
    until: float | None
    in_force: list[str]  # the curves in force over the records
    days: list[AllowanceDay]
    total: AllowanceDay


def allowance_report(
    curve_name: str,
    curve: AllowanceCurve,
    records: Iterable[AdmissionRecord],
    since: float,
    until: float | None,
    settings: AllowanceSettings,
    options: dict[str, Any] | None = None,
) -> AllowanceReport:
    """Recompute each admission decision's allowance with `curve` and its outcome with admission's
    own rule (pure: no database)."""
    reads_totals = getattr(curve, "reads_horde_totals", True)
    days: dict[str, AllowanceDay] = {}
    in_force: set[str] = set()
    for record in records:
        in_force.add(record.allowance_curve)
        day = days.setdefault(day_of(record.at), AllowanceDay(day_of(record.at)))
        _rejudge(day, record, curve, reads_totals, settings)
    ordered = [days[d] for d in sorted(days)]
    total = AllowanceDay("total")
    for day in ordered:
        total.add(day)
    return AllowanceReport(
        curve=curve_name,
        options=dict(options or {}),
        since=since,
        until=until,
        in_force=sorted(in_force),
        days=ordered,
        total=total,
    )


def _rejudge(
    day: AllowanceDay,
    record: AdmissionRecord,
    curve: AllowanceCurve,
    reads_totals: bool,
    settings: AllowanceSettings,
) -> None:
    """Count one admission decision in `day`, as decided and as `curve` would have decided it."""
    day.decisions += 1
    day.in_force[record.outcome] = day.in_force.get(record.outcome, 0) + 1
    totals_missing = record.online_text_threads is None or record.queued_text_requests is None
    if reads_totals and totals_missing:
        day.unknown += 1
        day.unknown_totals += 1
        return
    allowance = curve.allowance(
        AllowanceInputs(
            estimated_wait_seconds=record.estimated_wait,
            competing_jobs=record.competing_jobs,
            eligible_threads=record.eligible_threads,
            online_text_threads=record.online_text_threads or 0,
            queued_text_requests=record.queued_text_requests or 0,
            settings=settings,
        )
    )
    outcome = outcome_for(
        record.requested_max_length,
        record.n,
        allowance,
        record.slow_workers,
        record.downgrade_allowed,
        record.can_fund,
    )
    if outcome is None:
        day.unknown += 1
        day.unknown_funds += 1
        return
    day.would_be[outcome] += 1
    day.allowance_lower += allowance < record.allowance
    day.allowance_higher += allowance > record.allowance
    if outcome != record.outcome:
        day.changed += 1
        move = f"{record.outcome} -> {outcome}"
        day.transitions[move] = day.transitions.get(move, 0) + 1


async def allowance_whatif(
    session: AsyncSession,
    curve_name: str,
    since: float,
    until: float | None,
    options: dict[str, Any] | None = None,
    *,
    settings: AllowanceSettings | None = None,
) -> AllowanceReport:
    """How free, funded, downgraded and refused would have changed under the installed curve
    `curve_name` over the admissions recorded in [since, until) (until None: no upper bound).
    `settings`: the [allowance] table the curve reads (default: the defaults)."""
    curve = build(PolicyKind.ALLOWANCE_CURVE, curve_name, dict(options or {}))
    query = select(AdmissionRecord).where(AdmissionRecord.at >= since).order_by(AdmissionRecord.at)
    if until is not None:
        query = query.where(AdmissionRecord.at < until)
    records = (await session.execute(query)).scalars()
    return allowance_report(
        curve_name, curve, records, since, until, settings or AllowanceSettings(), options
    )


def render_allowance(report: AllowanceReport) -> str:
    options = ", ".join(f"{k}={v}" for k, v in sorted(report.options.items())) or "default options"
    lines = [
        f"What if the allowance curve were {report.curve} ({options})",
        f"admission decisions recorded {_stamp(report.since)} to {_stamp(report.until)}: "
        f"{report.total.decisions}; curve in force: {_names_in_force(report.in_force, 'admission')}",
        "(in force -> would be; 'would be' counts the decisions the curve could recompute)",
        "",
        f"{'day':10}  "
        + "  ".join(f"{o:>14}" for o in ADMISSION_OUTCOMES)
        + f"  {'unknown':>7}  {'changed':>7}",
    ]
    for d in [*report.days, report.total]:
        cells = "  ".join(f"{f'{d.in_force[o]} -> {d.would_be[o]}':>14}" for o in ADMISSION_OUTCOMES)
        lines.append(f"{d.day:10}  {cells}  {d.unknown:>7}  {d.changed:>7}")
    t = report.total
    lines += [
        "",
        f"Allowance lower for {t.allowance_lower} decision(s), higher for {t.allowance_higher}.",
    ]
    if t.transitions:
        lines.append("Changed: " + ", ".join(f"{move} {n}" for move, n in sorted(t.transitions.items())))
    if t.unknown_totals:
        lines.append(
            f"Unknown: {t.unknown_totals} decision(s) where this curve needs the horde-wide totals "
            "(online text threads, queued text requests), which the curve then in force did not read."
        )
    if t.unknown_funds:
        lines.append(
            f"Unknown: {t.unknown_funds} decision(s) not free under this curve, where whether the "
            "requester could pay was not read (they were free)."
        )
    return "\n".join(lines)


def parse_options(pairs: Sequence[str]) -> dict[str, Any]:
    """`key=value` pairs, each value read as a TOML value (`5`, `0.9`, `true`) or else a string."""
    import tomllib

    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--option {pair!r}: expected key=value")
        try:
            options[key.strip()] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            options[key.strip()] = value
    return options
