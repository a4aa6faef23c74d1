"""Admission's decision as pure functions of what admission read: free, funded, downgraded or
refused, what a downgrade applies and why a refusal refuses. No database, no clock, no metrics:
`admission.admit` reads (and locks) the facts, asks `judge`, then writes what it says. The unit
tests and `horde-lite whatif` run the same functions without a database.

Kept free of imports from the rest of horde_lite: the metrics module imports the outcomes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class AdmissionOutcome(StrEnum):
    """What admission made of a request. The values are stored (admission and candidate records)
    and shown (metrics labels, the dashboard, `whatif`, the dry run's answer): never change one."""

    FREE = "free"
    FUNDED = "funded"
    DOWNGRADED = "downgraded"
    REFUSED = "refused"


# The values in their order of display: free, funded, downgraded, refused.
ADMISSION_OUTCOMES: tuple[str, ...] = tuple(outcome.value for outcome in AdmissionOutcome)


class Refusal(StrEnum):
    """Why a refused request is refused, which decides what its error says."""

    NO_ELIGIBLE_WORKER = "no_eligible_worker"  # over the floor and no online worker can serve it
    SLOW_WORKERS = "slow_workers"  # it fits the allowance but refuses slow workers
    OVER_ALLOWANCE = "over_allowance"  # it asks more than the free output allowance


# A downgraded job keeps at least this many tokens (the smallest max_length a request may ask).
DOWNGRADE_LEAST = 16


def outcome_for(
    max_length: int,
    n: int,
    allowance: int,
    slow_workers: bool,
    downgrade_allowed: bool,
    can_fund: bool | None,
) -> AdmissionOutcome | None:
    """The admission decision for one allowance, so that a candidate curve and `horde-lite whatif`
    judge exactly like the curve in force: free when all n jobs' output fits the allowance and slow
    workers are allowed; else funded when the requester can pay (`can_fund`: spendable kudos and
    the shared key's budget); else downgraded when the request allows it (`downgrade_allowed`: a
    legacy request on the native route that asked) and each job keeps at least 16 tokens; else
    refused. None: not free, and `can_fund` is unknown."""
    over = max_length * n > allowance
    if not over and slow_workers:
        return AdmissionOutcome.FREE
    if can_fund is None:
        return None
    if can_fund:
        return AdmissionOutcome.FUNDED
    if over and downgrade_allowed and allowance // n >= DOWNGRADE_LEAST:
        return AdmissionOutcome.DOWNGRADED
    return AdmissionOutcome.REFUSED


@dataclass(frozen=True, slots=True)
class AdmissionFacts:
    """What admission read before deciding: the request, its requester and the horde."""

    max_length: int  # each job's, as asked (after a chat request's lowering)
    n: int
    slow_workers: bool
    allow_downgrade: bool
    native_route: bool
    is_chat: bool
    dry_run: bool
    cost: float  # the request's price as asked
    allowance: int  # the curve in force's free output allowance
    candidate_allowance: int | None  # a candidate curve's, judged in shadow (None: no candidate)
    eligible_workers: int  # the estimate's online workers that could serve it
    floor: int  # `[allowance] floor`: output every request may ask without an eligible worker
    anonymous: bool  # the shared anonymous account, which never holds kudos upfront
    has_shared_key: bool
    key_left: float | None  # what the shared key's budget has left (None: no key, or no budget)
    spendable: float | None = None  # the requester's spendable kudos (None: not read)

    @property
    def downgrade_allowed(self) -> bool:
        return self.allow_downgrade and self.native_route and not self.is_chat

    @property
    def asked(self) -> int:
        """The output the request asks, as the allowance counts it: all of its jobs."""
        return self.max_length * self.n


@dataclass(frozen=True, slots=True)
class Judgement:
    """What admission does with a request, and why."""

    outcome: AdmissionOutcome
    allowance: int
    max_length: int  # each job's, as queued: the allowance's share after a downgrade
    downgrade_allowed: bool
    can_pay: bool  # the spendable kudos cover the cost (False when not read)
    can_fund: bool | None  # ... and the shared key's budget too (None: not read)
    candidate: tuple[int, AdmissionOutcome] | None  # the candidate curve's, when its allowance differs
    refusal: Refusal | None  # why a refused request is refused (None: it is not)
    key_budget: bool  # refused, but the requester could pay: the shared key's budget cannot
    dry_run: bool

    @property
    def records(self) -> bool:
        """A decision is recorded (metrics, admission record) unless it is a dry run."""
        return not self.dry_run

    @property
    def writes(self) -> bool:
        """The request is queued: its row, entries and any hold."""
        return not self.dry_run and self.outcome is not AdmissionOutcome.REFUSED

    @property
    def reserves_user(self) -> bool:
        """A funded request holds its requester's kudos until its jobs are charged."""
        return self.outcome is AdmissionOutcome.FUNDED

    def holds(self, has_shared_key: bool) -> bool:
        """A hold is placed for a funded request, and for any request through a shared key (its
        budget is reserved, so concurrent requests cannot overspend it)."""
        return self.writes and (self.reserves_user or has_shared_key)


def _shadow_allowance(facts: AdmissionFacts) -> int | None:
    """The candidate curve's allowance when it differs from the curve in force's: only then is
    there a second decision to judge in shadow."""
    candidate = facts.candidate_allowance
    return None if candidate is None or candidate == facts.allowance else candidate


def _needs_funds(facts: AdmissionFacts) -> bool:
    """Whether the request is not free under the curve in force or the candidate, so that the
    decision turns on whether the requester can pay."""
    shadow = _shadow_allowance(facts)
    allowances = [facts.allowance] if shadow is None else [facts.allowance, shadow]
    return any(_outcome(facts, allowance, None) is None for allowance in allowances)


def needs_spendable(facts: AdmissionFacts) -> bool:
    """Whether the decision depends on the requester's spendable kudos, which cost a query: only
    when the request is not free under the curve in force or the candidate."""
    return facts.spendable is None and not facts.anonymous and _needs_funds(facts)


def judge(facts: AdmissionFacts) -> Judgement:
    """The decision. `facts.spendable` must be read when `needs_spendable(facts)` says so."""
    if needs_spendable(facts):
        raise ValueError("the decision needs the requester's spendable kudos")
    can_pay, can_fund = False, None
    if _needs_funds(facts):
        # The anonymous account is shared by everyone without a key: it never spends upfront, or one
        # anonymous caller could spend what the floor leaves for all of them.
        can_pay = not facts.anonymous and (facts.spendable or 0.0) >= facts.cost
        can_fund = can_pay and (facts.key_left is None or facts.key_left >= facts.cost)
    outcome = _outcome(facts, facts.allowance, can_fund)
    assert outcome is not None  # only an unread can_fund leaves it open
    pair = None
    shadow = _shadow_allowance(facts)
    if shadow is not None:
        judged = _outcome(facts, shadow, can_fund)
        assert judged is not None
        pair = (shadow, judged)
    return Judgement(
        outcome=outcome,
        allowance=facts.allowance,
        max_length=_applied(facts, outcome),
        downgrade_allowed=facts.downgrade_allowed,
        can_pay=can_pay,
        can_fund=can_fund,
        candidate=pair,
        refusal=_refusal(facts, outcome),
        key_budget=outcome is AdmissionOutcome.REFUSED and can_pay and facts.has_shared_key,
        dry_run=facts.dry_run,
    )


def _outcome(facts: AdmissionFacts, allowance: int, can_fund: bool | None) -> AdmissionOutcome | None:
    return outcome_for(
        facts.max_length, facts.n, allowance, facts.slow_workers, facts.downgrade_allowed, can_fund
    )


def _applied(facts: AdmissionFacts, outcome: AdmissionOutcome) -> int:
    if outcome is AdmissionOutcome.DOWNGRADED:
        return facts.allowance // facts.n  # each job's share of the request's allowance
    return facts.max_length


def _refusal(facts: AdmissionFacts, outcome: AdmissionOutcome) -> Refusal | None:
    if outcome is not AdmissionOutcome.REFUSED:
        return None
    if facts.asked > facts.floor and facts.eligible_workers == 0:
        return Refusal.NO_ELIGIBLE_WORKER
    if not facts.slow_workers and facts.asked <= facts.allowance:
        return Refusal.SLOW_WORKERS
    return Refusal.OVER_ALLOWANCE


def kudos_upfront_message(facts: AdmissionFacts, refusal: Refusal) -> str:
    """The KudosUpfront refusal's words, for a request refused for slow workers or its size."""
    if refusal is Refusal.SLOW_WORKERS:
        reason = "requests that disallow slow workers always need kudos upfront"
        advice = "or allow slow workers"
    else:
        asked = f"{facts.asked} ({facts.n} jobs x {facts.max_length})" if facts.n > 1 else str(facts.asked)
        reason = f"the free output allowance for this request is {facts.allowance} tokens and it asks {asked}"
        advice = f"or ask for at most {facts.allowance} tokens"
    return (
        f"This request needs {facts.cost:.2f} kudos upfront: {reason}. Register and earn kudos by running a "
        f"worker, {advice}."
    )


def downgrade_note(facts: AdmissionFacts, applied: int) -> tuple[dict[str, object], dict[str, str]]:
    """A downgrade's context adjustment (stored on the request) and its warning (to the client)."""
    adjustment: dict[str, object] = {
        "field": "max_length",
        "requested": facts.max_length,
        "applied": applied,
        "reason": "free output allowance",
    }
    each = f", {applied} for each of {facts.n} jobs." if facts.n > 1 else "."
    warning = {
        "code": "Downgraded",
        "message": f"max_length lowered from {facts.max_length} to the free output allowance "
        f"of {facts.allowance} tokens" + each,
    }
    return adjustment, warning
