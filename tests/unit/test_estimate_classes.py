"""The wait estimate judges each class of queued requests once (lifecycle/estimate.py, `_Judge`):
requests with the same facts but for the context they need and the requester, whose context falls
between the same two context limits of the eligible workers, get one verdict. That is only sound
if the verdict of the class is the verdict of each of its members: checked here against judging
every request on its own, under every installed speed gate."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from horde_lite.lifecycle.eligibility import REQUEST_FACT_COLUMNS, Rules, WorkerFacts, request_facts_of
from horde_lite.lifecycle.estimate import _Judge
from horde_lite.policies.registry import installed, load_policies
from horde_lite.settings import PoliciesSettings, Settings

NOW = 1_000_000.0
MODELS = ["a", "b", "c"]
FEATURES = ["tools", "json_schema"]
LIMITS = st.sampled_from([64, 128, 512, 1024, 2048, 4096])
CONTEXTS = st.sampled_from([1024, 2048, 4096, 8192])


@st.composite
def workers(draw: st.DrawFn) -> WorkerFacts:
    chat = draw(st.booleans())
    return WorkerFacts(
        id=f"w{draw(st.integers(0, 6))}",
        owner_id=draw(st.integers(1, 3)),
        last_check_in=NOW - draw(st.sampled_from([0, 10, 1000])),
        models=frozenset(draw(st.sets(st.sampled_from(MODELS), min_size=1))),
        max_length=draw(LIMITS),
        max_context_length=draw(CONTEXTS),
        capacity=draw(LIMITS),
        lease_speed=draw(st.sampled_from([None, 0.5, 3.0, 30.0])),
        trusted=draw(st.booleans()),
        nsfw=draw(st.booleans()),
        maintenance=draw(st.booleans()),
        chat_max_completion_tokens=draw(LIMITS) if chat else None,
        chat_max_context_tokens=draw(CONTEXTS) if chat else None,
        chat_features=frozenset(draw(st.sets(st.sampled_from(FEATURES)))) if chat else frozenset(),
    )


@st.composite
def queued(draw: st.DrawFn) -> tuple[Any, ...]:
    """A row as the walk reads it: (id, effective_start, created_at, offered, n_remaining, *facts),
    the JSON lists as text."""
    facts = {
        "user_id": draw(st.integers(1, 3)),
        "is_chat": draw(st.booleans()),
        "max_length": draw(LIMITS),
        "max_context_length": draw(st.integers(256, 9000)),
        "prompt_tokens": draw(st.integers(0, 8000)),
        "models": json.dumps(sorted(draw(st.sets(st.sampled_from(MODELS), max_size=2)))),
        "any_model": draw(st.booleans()),
        "required_features": json.dumps(sorted(draw(st.sets(st.sampled_from(FEATURES))))),
        "required_transports": "[]",
        "targeted": draw(st.booleans()),
        "worker_allow": json.dumps(sorted(draw(st.sets(st.sampled_from(["w0", "w1", "w2"]))))),
        "worker_deny": json.dumps(sorted(draw(st.sets(st.sampled_from(["w3", "w4"]))))),
        "trusted_workers": draw(st.booleans()),
        "slow_workers": draw(st.booleans()),
        "nsfw": draw(st.booleans()),
        "failed_workers": json.dumps(sorted(draw(st.sets(st.sampled_from(["w5", "w6"]))))),
    }
    assert list(facts) == list(REQUEST_FACT_COLUMNS)
    return ("q", 0.0, 0.0, True, 1, *facts.values())


@pytest.mark.parametrize("gate", sorted(installed("speed_gate")))
@settings(max_examples=150, deadline=None)
@given(fleet=st.lists(workers(), min_size=1, max_size=8), rows=st.lists(queued(), min_size=1, max_size=40))
def test_a_class_verdict_is_each_members_verdict(
    gate: str, fleet: list[WorkerFacts], rows: list[Any]
) -> None:
    policies = load_policies(msgspec.convert({"speed_gate": gate}, PoliciesSettings))
    rules = Rules.from_settings(msgspec.convert({}, Settings), policies.speed_gate, NOW)
    judge = _Judge(rules, fleet)
    for row in rows:  # in order, so later members of a class get the verdict of the first
        alone = _Judge(rules, fleet).takeable(request_facts_of(row[5:]))
        assert judge.verdict(row) == alone
