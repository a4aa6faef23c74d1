"""The pop's choices as pure functions (jobs/pop_rule.py), without a database: how a pop goes
on after its reads outside any transaction, and what it does with the request its claim found.
The statements around them are counted in tests/integration/test_queue_index.py and
tests/integration/test_horde_jobs.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from horde_lite.jobs.pop_rule import PopPath, Seen, counts_pop, path, take


def test_a_key_or_name_not_found_goes_the_whole_way_in_the_transaction() -> None:
    assert path(Seen(known=False)) is PopPath.WHOLE


@pytest.mark.parametrize(
    "seen",
    [
        Seen(known=True, need="all"),
        Seen(known=True, need="nothing", paused=True),
        Seen(known=True, need="time", maintenance=True),
        Seen(known=True, need="all", page_rows=3),
    ],
)
def test_changed_declarations_paused_and_maintenance_workers_go_the_whole_way(seen: Seen) -> None:
    assert path(seen) is PopPath.WHOLE


def test_the_page_is_read_only_when_the_pop_may_be_answered_from_it() -> None:
    assert path(Seen(known=True, need="nothing")) is None
    assert path(Seen(known=True, need="time")) is None


@pytest.mark.parametrize(
    ("need", "rows", "expected"),
    [
        ("nothing", 0, PopPath.IDLE),
        ("time", 0, PopPath.CHECK_IN),
        ("nothing", 1, PopPath.CLAIM),
        ("time", 32, PopPath.CLAIM),
    ],
)
def test_an_empty_page_with_nothing_to_write_is_the_answer(need: str, rows: int, expected: PopPath) -> None:
    assert path(Seen(known=True, need=need, page_rows=rows)) is expected  # type: ignore[arg-type]


def test_a_paused_workers_pops_are_not_counted() -> None:
    assert counts_pop(paused=False)
    assert not counts_pop(paused=True)


def test_a_pop_takes_what_it_asks_up_to_what_is_left() -> None:
    taken = take(fake=False, amount=3, n_remaining=2, max_length=512, capacity=400)
    assert (taken.count, taken.left) == (2, 0)
    assert taken.over_capacity
    assert taken.over_capacity_at_assignment
    assert taken.records
    taken = take(fake=False, amount=1, n_remaining=2, max_length=100, capacity=400)
    assert (taken.count, taken.left, taken.over_capacity) == (1, 1, False)


def test_a_fake_pop_takes_one_copy_and_changes_nothing() -> None:
    taken = take(fake=True, amount=4, n_remaining=1, max_length=512, capacity=100)
    assert (taken.count, taken.left, taken.records) == (1, None, False)
    assert taken.over_capacity
    assert not taken.over_capacity_at_assignment


@given(
    fake=st.booleans(),
    amount=st.integers(1, 20),
    n_remaining=st.integers(1, 20),
    max_length=st.integers(16, 8192),
    capacity=st.integers(0, 8192),
)
def test_a_pop_never_takes_more_than_the_request_has(
    fake: bool, amount: int, n_remaining: int, max_length: int, capacity: int
) -> None:
    taken = take(fake=fake, amount=amount, n_remaining=n_remaining, max_length=max_length, capacity=capacity)
    assert 1 <= taken.count <= max(amount, 1)
    if fake:
        assert taken.left is None
        assert not taken.records
    else:
        assert taken.left is not None
        assert 0 <= taken.left == n_remaining - taken.count
        assert taken.records


@given(
    known=st.booleans(),
    need=st.sampled_from(["nothing", "time", "all"]),
    paused=st.booleans(),
    maintenance=st.booleans(),
    page_rows=st.none() | st.integers(0, 32),
)
def test_only_a_pop_with_nothing_to_write_and_nothing_to_take_is_idle(
    known: bool, need: str, paused: bool, maintenance: bool, page_rows: int | None
) -> None:
    seen = Seen(known=known, need=need, paused=paused, maintenance=maintenance, page_rows=page_rows)  # type: ignore[arg-type]
    found = path(seen)
    if found is PopPath.IDLE:
        assert known
        assert need == "nothing"
        assert not paused
        assert not maintenance
        assert page_rows == 0
    if found is None:
        assert page_rows is None
