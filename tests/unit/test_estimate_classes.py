"""The wait estimate over a process's copy of the queue and the fleet (queue/mirror.py) judges
classes of requests once, as masks of worker slots, and applies online status, maintenance and the
capable question at reading time. That is only sound if the answer is the one eligibility check's,
pair by pair: checked here against `is_eligible` for every worker and every queued request, under
every installed speed gate, for fleets and queues that change between two estimates."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from horde_lite.policies.registry import installed, load_policies
from horde_lite.queue.eligibility import (
    REQUEST_FACT_COLUMNS,
    WORKER_FACT_COLUMNS,
    RequestFacts,
    Rules,
    WorkerFacts,
    is_eligible,
    request_facts_of,
)
from horde_lite.queue.mirror import Queued, QueueMirror
from horde_lite.settings import PoliciesSettings, Settings

NOW = 1_000_000.0
MODELS = ["a", "b", "c"]
FEATURES = ["tools", "json_schema"]
LIMITS = st.sampled_from([64, 128, 512, 1024, 2048, 4096])
CONTEXTS = st.sampled_from([1024, 2048, 4096, 8192])
SETTINGS = msgspec.convert({"database": {"url": "sqlite+aiosqlite:///unused.db"}}, Settings)


@st.composite
def workers(draw: st.DrawFn) -> tuple[WorkerFacts, int]:
    chat = draw(st.booleans())
    speed = draw(st.sampled_from([None, 0.5, 3.0, 30.0]))
    facts = WorkerFacts(
        id=f"w{draw(st.integers(0, 6))}",
        owner_id=draw(st.integers(1, 3)),
        last_check_in=NOW - draw(st.sampled_from([0, 10, 1000])),
        models=frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=2))),
        max_length=draw(LIMITS),
        max_context_length=draw(CONTEXTS),
        capacity=draw(LIMITS),
        lease_speed=speed,
        trusted=draw(st.booleans()),
        nsfw=draw(st.booleans()),
        maintenance=draw(st.booleans()),
        paused=draw(st.sampled_from([False, False, True])),
        chat_max_completion_tokens=draw(LIMITS) if chat else None,
        chat_max_context_tokens=draw(CONTEXTS) if chat else None,
        chat_features=frozenset(draw(st.sets(st.sampled_from(FEATURES)))) if chat else frozenset(),
    )
    return facts, draw(st.integers(1, 3))


@st.composite
def changes(draw: st.DrawFn) -> tuple[int, dict[str, Any]]:
    """A change to the i-th worker that keeps its context limits (so the classes stay drawn as
    they were and only the changed workers are judged again)."""
    return draw(st.integers(0, 7)), {
        "capacity": draw(LIMITS),
        "lease_speed": draw(st.sampled_from([None, 0.5, 3.0, 30.0])),
        "maintenance": draw(st.booleans()),
        "paused": draw(st.sampled_from([False, False, True])),
        "trusted": draw(st.booleans()),
        "models": frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=2))),
        "last_check_in": NOW - draw(st.sampled_from([0, 10, 1000])),
    }


@st.composite
def requests(draw: st.DrawFn) -> tuple[float, float, int, float, list[Any]]:
    """(effective_start, created_at, n_remaining, expires_at, facts as REQUEST_FACT_COLUMNS' values)."""
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
        "failed_owners": json.dumps(sorted(draw(st.sets(st.sampled_from(["1", "2"]))))),
    }
    assert list(facts) == list(REQUEST_FACT_COLUMNS)
    start = float(draw(st.integers(0, 5)))
    return start, start, draw(st.integers(1, 3)), NOW + draw(st.sampled_from([-1, 100])), list(facts.values())


def _worker_row(facts: WorkerFacts, threads: int) -> list[Any]:
    values = [getattr(facts, c) for c in WORKER_FACT_COLUMNS]
    return [None, threads, *[sorted(v) if isinstance(v, frozenset) else v for v in values]]


def _fill(mirror: QueueMirror, fleet: list[tuple[WorkerFacts, int]], queue: list[Any]) -> None:
    for facts, threads in fleet:
        mirror.fleet.apply(facts.id, _worker_row(facts, threads))
    for i, (start, created, left, expires, facts) in enumerate(queue):
        mirror._put(f"q{i}", ["waiting", left, expires, start, created, *facts], sort=True)


def _expected(
    fleet: list[WorkerFacts], queue: dict[str, Any], r: Queued, rules: Rules
) -> tuple[set[str], int, int]:
    """R's eligible workers, the work and the requests ahead that one of them could take, pair by pair."""
    eligible = {w.id for w in fleet if is_eligible(w, r.facts, fleet, rules)}
    work = requests_ahead = 0
    for start, created, left, expires, facts in queue.values():
        if (start, created) >= (r.effective_start, r.created_at) or expires <= rules.now:
            continue
        q = request_facts_of(facts)
        if any(is_eligible(w, q, fleet, rules) for w in fleet if w.id in eligible):
            work += q.max_length * left
            requests_ahead += 1
    return eligible, work, requests_ahead


@pytest.mark.parametrize("gate", sorted(installed("speed_gate")))
@settings(max_examples=120, deadline=None)
@given(
    fleet=st.lists(workers(), min_size=1, max_size=8),
    queue=st.lists(requests(), max_size=30),
    changed=st.lists(changes(), max_size=3),
    gone=st.lists(st.integers(0, 29), max_size=5),
    mine=requests(),
)
@pytest.mark.slow
def test_the_estimate_is_the_eligibility_check_pair_by_pair(
    gate: str,
    fleet: list[tuple[WorkerFacts, int]],
    queue: list[Any],
    changed: list[tuple[int, dict[str, Any]]],
    gone: list[int],
    mine: Any,
) -> None:
    policies = load_policies(msgspec.convert({"speed_gate": gate}, PoliciesSettings))
    rules = replace(Rules.from_settings(SETTINGS, policies.speed_gate, NOW), horizon_seconds=10**9)
    mirror = QueueMirror(SETTINGS)
    _fill(mirror, fleet, queue)
    start, created, _left, _expires, facts = mine
    r = Queued("mine", start, created, 0, request_facts_of(facts))
    mirror.estimate(r, rules)  # judged once, so the changes below are re-judged, not judged afresh
    # Workers change and requests leave between two estimates.
    final = {f.id: (f, threads) for f, threads in fleet}  # the last facts of each id
    for i, change in changed:
        facts_, threads = list(final.values())[i % len(final)]
        final[facts_.id] = (replace(facts_, **change), threads)
        mirror.fleet.apply(facts_.id, _worker_row(*final[facts_.id]))
    rows = {f"q{i}": row for i, row in enumerate(queue)}
    for i in gone:
        if f"q{i}" in rows:
            mirror._put(f"q{i}", None, sort=True)
            del rows[f"q{i}"]
    found = mirror.estimate(r, rules)
    eligible, work, ahead = _expected([f for f, _ in final.values()], rows, r, rules)
    assert found.eligible_workers == len(eligible)
    assert found.competing_work == (work if eligible else 0)
    assert found.competing_requests == (ahead if eligible else 0)


def test_a_request_for_no_model_is_anyones() -> None:
    """A request that names no model competes for every worker; a worker that serves no model takes
    only such requests."""
    policies = load_policies(msgspec.convert({}, PoliciesSettings))
    rules = Rules.from_settings(SETTINGS, policies.speed_gate, NOW)
    mirror = QueueMirror(SETTINGS)
    worker = WorkerFacts(id="w", owner_id=1, last_check_in=NOW, models=frozenset(), max_length=512,
                         max_context_length=4096, capacity=1200)  # fmt: skip
    mirror.fleet.apply("w", _worker_row(worker, 1))
    anyone = RequestFacts(user_id=2, is_chat=False, max_length=100, max_context_length=1024)
    named = replace(anyone, models=frozenset({"a"}))
    values = [getattr(anyone, c) if hasattr(anyone, c) else None for c in REQUEST_FACT_COLUMNS]
    row = dict(zip(REQUEST_FACT_COLUMNS, values, strict=True))
    row.update(models="[]", any_model=True, required_features="[]", required_transports="[]", targeted=False,
               worker_allow="[]", worker_deny="[]", failed_workers="[]", failed_owners="[]")  # fmt: skip
    mirror._put("q", ["waiting", 2, NOW + 100, 0.0, 0.0, *row.values()], sort=True)
    found = mirror.estimate(Queued("mine", 10.0, 10.0, 100, anyone), rules)
    assert (found.eligible_workers, found.competing_work, found.competing_jobs) == (1, 200, 2)
    assert mirror.estimate(Queued("mine", 10.0, 10.0, 100, named), rules).eligible_workers == 0
