"""Admission's decision as pure functions (requests/admission_rule.py), without a database: what
admission does with a request given what it read. The reads, locks and writes around it are
exercised through HTTP in tests/integration/test_horde_requests.py and test_horde_kudos.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from horde_lite.metrics import ALLOWANCE_OUTCOMES
from horde_lite.requests.admission_rule import (
    ADMISSION_OUTCOMES,
    AdmissionFacts,
    AdmissionOutcome,
    Judgement,
    Refusal,
    downgrade_note,
    judge,
    kudos_upfront_message,
    needs_spendable,
    outcome_for,
)

FREE, FUNDED, DOWNGRADED, REFUSED = (
    AdmissionOutcome.FREE,
    AdmissionOutcome.FUNDED,
    AdmissionOutcome.DOWNGRADED,
    AdmissionOutcome.REFUSED,
)


def facts(**changes: object) -> AdmissionFacts:
    base = AdmissionFacts(
        max_length=200,
        n=1,
        slow_workers=True,
        allow_downgrade=False,
        native_route=True,
        is_chat=False,
        dry_run=False,
        cost=5.0,
        allowance=100,
        candidate_allowance=None,
        eligible_workers=1,
        floor=64,
        anonymous=False,
        has_shared_key=False,
        key_left=None,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_the_outcomes_keep_their_stored_values_and_order() -> None:
    # Stored in admission and candidate records, shown on the dashboard and in metrics labels.
    assert ADMISSION_OUTCOMES == ("free", "funded", "downgraded", "refused")
    assert frozenset(ADMISSION_OUTCOMES) == ALLOWANCE_OUTCOMES
    assert FREE == "free"
    assert f"{REFUSED}" == "refused"


def test_a_request_within_the_allowance_is_free_without_reading_kudos() -> None:
    free = facts(max_length=80)
    assert not needs_spendable(free)
    judged = judge(free)
    assert judged.outcome is FREE
    assert judged.can_fund is None
    assert judged.max_length == 80
    assert judged.writes
    assert not judged.holds(has_shared_key=False)


def test_a_request_over_the_allowance_needs_the_kudos_read() -> None:
    over = facts()
    assert needs_spendable(over)
    with pytest.raises(ValueError, match="spendable kudos"):
        judge(over)
    assert judge(replace(over, spendable=5.0)).outcome is FUNDED
    assert judge(replace(over, spendable=4.99)).outcome is REFUSED


def test_the_anonymous_account_never_funds_and_is_never_read() -> None:
    anonymous = facts(anonymous=True, spendable=None)
    assert not needs_spendable(anonymous)
    judged = judge(anonymous)
    assert judged.outcome is REFUSED
    assert judged.can_fund is False
    assert not judged.can_pay


def test_a_shared_keys_budget_refuses_what_its_owner_could_pay() -> None:
    judged = judge(facts(has_shared_key=True, key_left=1.0, spendable=100.0))
    assert judged.outcome is REFUSED
    assert judged.key_budget
    assert judged.can_pay


def test_a_free_request_through_a_key_holds_the_keys_budget() -> None:
    judged = judge(facts(max_length=80, has_shared_key=True, key_left=100.0))
    assert judged.outcome is FREE
    assert judged.holds(has_shared_key=True)
    assert not judged.reserves_user


def test_a_downgrade_gives_each_job_its_share_of_the_allowance() -> None:
    judged = judge(facts(n=3, max_length=100, allowance=200, allow_downgrade=True, spendable=0.0))
    assert judged.outcome is DOWNGRADED
    assert judged.max_length == 66
    adjustment, warning = downgrade_note(facts(n=3, max_length=100, allowance=200), 66)
    assert adjustment == {
        "field": "max_length",
        "requested": 100,
        "applied": 66,
        "reason": "free output allowance",
    }
    assert warning["message"].endswith("allowance of 200 tokens, 66 for each of 3 jobs.")


@pytest.mark.parametrize(
    ("changes", "downgraded"),
    [({}, True), ({"native_route": False}, False), ({"is_chat": True}, False), ({"allowance": 15}, False)],
)
def test_only_a_legacy_native_request_that_asks_is_downgraded(
    changes: dict[str, object], downgraded: bool
) -> None:
    judged = judge(facts(allow_downgrade=True, spendable=0.0, **changes))  # type: ignore[arg-type]
    assert (judged.outcome is DOWNGRADED) is downgraded


def test_the_refusals_reasons() -> None:
    assert judge(facts(eligible_workers=0, spendable=0.0)).refusal is Refusal.NO_ELIGIBLE_WORKER
    assert judge(facts(eligible_workers=0, max_length=64, slow_workers=False, spendable=0.0)).refusal is (
        Refusal.SLOW_WORKERS
    )
    assert judge(facts(spendable=0.0)).refusal is Refusal.OVER_ALLOWANCE
    slow = facts(max_length=80, slow_workers=False, spendable=0.0)
    assert judge(slow).refusal is Refusal.SLOW_WORKERS
    assert "or allow slow workers" in kudos_upfront_message(slow, Refusal.SLOW_WORKERS)
    many = facts(n=2, max_length=100, spendable=0.0)
    message = kudos_upfront_message(many, Refusal.OVER_ALLOWANCE)
    assert message == (
        "This request needs 5.00 kudos upfront: the free output allowance for this request is 100 tokens "
        "and it asks 200 (2 jobs x 100). Register and earn kudos by running a worker, or ask for at most "
        "100 tokens."
    )


def test_a_candidate_curve_is_judged_beside_the_one_in_force() -> None:
    shadowed = facts(max_length=80, candidate_allowance=50)
    assert needs_spendable(shadowed)  # free in force, but not under the candidate
    judged = judge(replace(shadowed, spendable=0.0))
    assert judged.outcome is FREE
    assert judged.candidate == (50, REFUSED)
    assert judged.can_fund is False
    assert judge(facts(max_length=80, candidate_allowance=100)).candidate is None  # same allowance


def test_a_dry_run_is_judged_like_the_request_and_writes_nothing() -> None:
    judged = judge(facts(max_length=80, dry_run=True, has_shared_key=True, key_left=10.0))
    assert judged.outcome is FREE
    assert not judged.writes
    assert not judged.records
    assert not judged.holds(has_shared_key=True)


# --- properties ----------------------------------------------------------------------------------

facts_strategy = st.builds(
    AdmissionFacts,
    max_length=st.integers(16, 4096),
    n=st.integers(1, 8),
    slow_workers=st.booleans(),
    allow_downgrade=st.booleans(),
    native_route=st.booleans(),
    is_chat=st.booleans(),
    dry_run=st.booleans(),
    cost=st.floats(0, 1000, allow_nan=False),
    allowance=st.integers(0, 8192),
    candidate_allowance=st.none() | st.integers(0, 8192),
    eligible_workers=st.integers(0, 3),
    floor=st.integers(0, 512),
    anonymous=st.booleans(),
    has_shared_key=st.booleans(),
    key_left=st.none() | st.floats(-10, 1000, allow_nan=False),
    spendable=st.none() | st.floats(-10, 1000, allow_nan=False),
)


def judged_of(f: AdmissionFacts) -> tuple[AdmissionFacts, Judgement]:
    if needs_spendable(f):
        f = replace(f, spendable=0.0)
    return f, judge(f)


@given(facts_strategy)
def test_a_downgraded_request_never_asks_more_than_the_allowance(f: AdmissionFacts) -> None:
    f, judged = judged_of(f)
    if judged.outcome is DOWNGRADED:
        assert judged.max_length * f.n <= f.allowance
        assert 16 <= judged.max_length < f.max_length
    else:
        assert judged.max_length == f.max_length


@given(facts_strategy)
def test_a_refused_outcome_writes_nothing_and_says_why(f: AdmissionFacts) -> None:
    f, judged = judged_of(f)
    refused = judged.outcome is REFUSED
    assert (judged.refusal is not None) is refused
    if refused or f.dry_run:
        assert not judged.writes
        assert not judged.holds(f.has_shared_key)
    assert judged.records is (not f.dry_run)


@given(facts_strategy)
def test_the_judgement_agrees_with_outcome_for(f: AdmissionFacts) -> None:
    f, judged = judged_of(f)
    again = outcome_for(f.max_length, f.n, f.allowance, f.slow_workers, f.downgrade_allowed, judged.can_fund)
    assert again is judged.outcome
    if judged.outcome is FREE:
        assert f.max_length * f.n <= f.allowance
        assert f.slow_workers
    if judged.outcome is FUNDED:
        assert not f.anonymous
        assert judged.can_fund
        assert f.key_left is None or f.key_left >= f.cost


@given(facts_strategy)
def test_kudos_are_read_only_when_some_curve_finds_the_request_not_free(f: AdmissionFacts) -> None:
    f = replace(f, spendable=None)
    allowances = {f.allowance} | ({f.candidate_allowance} if f.candidate_allowance is not None else set())
    not_free = any(f.max_length * f.n > a or not f.slow_workers for a in allowances)
    assert needs_spendable(f) is (not_free and not f.anonymous)
