"""The remembered idle answers' own bounds (jobs/idle_answers.py): how many are held, and what a
flood of model names in wake-ups does. What ends an answer is tested over HTTP
(tests/integration/test_idle_answers.py)."""

from __future__ import annotations

from horde_lite.jobs.dispatch import Popped
from horde_lite.jobs.idle_answers import MODELS_MOST, IdleAnswers, Key, Mark, Remembered, key_of

POLICIES, MODES = object(), object()


def remember(answers: IdleAnswers, key: Key, mark: Mark) -> None:
    answers.remember(key, Remembered(Popped(None, {}), None, mark, POLICIES, MODES, 0.0, 10.0))


def key(n: int) -> Key:
    return key_of(f"key{n}", None, b"{}")


def test_at_most_the_bound_is_held_the_oldest_going_first() -> None:
    answers = IdleAnswers(10.0, heard=lambda: 1, most=3)
    for n in range(5):
        mark = answers.mark(["m"])
        assert mark is not None
        remember(answers, key(n), mark)
    assert len(answers) == 3
    assert answers.recall(key(0), 1.0, POLICIES, MODES) is None
    assert answers.recall(key(4), 1.0, POLICIES, MODES) is not None
    remember(answers, key(4), answers.mark(["m"]))  # remembered again: not held twice
    assert len(answers) == 3


def test_a_flood_of_model_names_resets_instead_of_growing() -> None:
    answers = IdleAnswers(10.0, heard=lambda: 1, most=4)
    mark = answers.mark(["m"])
    assert mark is not None
    remember(answers, key(1), mark)
    answers.jobs_arrived(["x1", "x2"])
    assert answers.recall(key(1), 1.0, POLICIES, MODES) is not None  # other models: still fresh
    answers.jobs_arrived([f"flood{n}" for n in range(10)])  # past the bound: one reset
    assert len(answers._models) == 0
    assert answers.recall(key(1), 1.0, POLICIES, MODES) is None


def test_nothing_is_remembered_when_off_or_without_a_listener() -> None:
    assert IdleAnswers(0.0, heard=lambda: 1).mark(["m"]) is None
    assert IdleAnswers(10.0, heard=lambda: None).mark(["m"]) is None


def test_a_pop_declaring_many_models_is_not_remembered() -> None:
    answers = IdleAnswers(10.0, heard=lambda: 1)
    assert answers.mark([f"m{n}" for n in range(MODELS_MOST)]) is not None
    assert answers.mark([f"m{n}" for n in range(MODELS_MOST + 1)]) is None


def test_keys_tell_apart_their_key_address_and_body() -> None:
    base = key_of("k", "1.2.3.4", b"{}")
    others = {key_of("k2", "1.2.3.4", b"{}"), key_of("k", "1.2.3.5", b"{}"), key_of("k", "1.2.3.4", b"[]")}
    assert len({base, *others}) == 4
    assert key_of("k", None, b"{}") == key_of("k", "", b"{}")  # no address: one form
