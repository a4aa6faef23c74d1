"""Kudos rules as pure functions (docs/reference/horde_api.md, "Kudos"): parameter counts, price,
reward, multiplier.

The ledger, holds and settlement are exercised through HTTP in tests/integration/test_horde_kudos.py.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from horde_lite.lifecycle.kudos import (
    context_multiplier,
    hold_key,
    job_reward,
    largest_parameters,
    parameters_billion,
    upfront_cost,
)
from horde_lite.settings import KudosSettings

DEFAULTS = KudosSettings()


@pytest.mark.parametrize(
    ("model", "billions"),
    [
        ("Rocinante-X-12B-v1", 12.0),
        ("koboldcpp/Rocinante-X-12B-v1", 12.0),
        ("aphrodite/TheDrummer/Cydonia-24B-v4.1", 24.0),
        ("Llama-3.1-8B-Instruct", 8.0),
        ("Qwen2.5-32B-Instruct", 32.0),
        ("gemma-2-2b-it", 2.0),
        ("Phi-3.5-mini-3.8B", 3.8),
        ("tiny-model", None),
        ("gpt2", None),
    ],
)
def test_parameters_read_from_the_name(model: str, billions: float | None) -> None:
    assert parameters_billion(model, DEFAULTS) == billions


def test_model_reference_wins_over_the_name() -> None:
    settings = KudosSettings(models={"Rocinante-X-12B-v1": 13.5, "mystery": 70})
    assert parameters_billion("Rocinante-X-12B-v1", settings) == 13.5
    # A backend prefix ("koboldcpp/") is looked up by its short name too.
    assert parameters_billion("koboldcpp/mystery", settings) == 70
    assert parameters_billion("Other-12B", settings) == 12


def test_largest_parameters_and_the_default_for_unknown_names() -> None:
    assert largest_parameters([], DEFAULTS) is None
    assert largest_parameters(["a-7B", "b-70B", "c-13B"], DEFAULTS) == 70
    # Listed models none of which can be sized cost as the operator's default size.
    assert largest_parameters(["mystery"], DEFAULTS) == DEFAULTS.default_parameters_billion
    assert largest_parameters(["mystery"], KudosSettings(default_parameters_billion=3)) == 3


@pytest.mark.parametrize(
    ("max_length", "n", "models", "expected"),
    [
        (80, 1, ["Rocinante-X-12B-v1"], round(80 * 12 / 21, 2)),  # 45.71
        (512, 3, ["Rocinante-X-12B-v1"], round(512 * 12 / 21, 2) * 3),  # 292.57 x 3
        (100, 2, ["a-7B", "b-70B"], round(100 * 70 / 21, 2) * 2),  # the largest model prices it
        (4096, 1, [], 20.0),  # without models: 20 per job
        (16, 5, [], 100.0),
    ],
)
def test_upfront_cost(max_length: int, n: int, models: list[str], expected: float) -> None:
    assert upfront_cost(max_length, n, models, DEFAULTS) == pytest.approx(expected)


def test_upfront_cost_worked_value() -> None:
    assert upfront_cost(80, 1, ["Rocinante-X-12B-v1"], DEFAULTS) == pytest.approx(45.71)
    assert upfront_cost(80, 2, ["Rocinante-X-12B-v1"], DEFAULTS) == pytest.approx(91.42)


@pytest.mark.parametrize(
    ("ctx", "expected"),
    [
        (1024, 2.2),  # 1.2 + 2.2^0
        (2048, 3.4),  # 1.2 + 2.2^1
        (4096, 1.2 + 2.2**2),
        (512, 1.2 + 1 / 2.2),
        (80, 1.2 + 2.2 ** math.log2(80 / 1024)),
        (32768, 30.0),  # 1.2 + 2.2^5 = 52.7, clamped
        (1_048_576, 30.0),
    ],
)
def test_context_multiplier(ctx: int, expected: float) -> None:
    assert context_multiplier(ctx) == pytest.approx(expected)


@given(st.integers(min_value=1, max_value=10_000_000))
def test_context_multiplier_stays_in_its_clamp(ctx: int) -> None:
    assert 0.1 <= context_multiplier(ctx) <= 30.0


def test_context_multiplier_is_monotonic_until_the_clamp() -> None:
    values = [context_multiplier(c) for c in (80, 256, 1024, 2048, 8192, 16384, 20000, 65536)]
    assert values == sorted(values)
    assert values[-1] == 30.0


def _reward(tokens: int, b: float, ctx: int) -> float:
    return round(tokens * (max(b, 13) / 13) ** 0.2 * b / 125 * context_multiplier(ctx), 2)


@pytest.mark.parametrize(
    ("tokens", "model", "ctx", "b"),
    [
        (100, "Rocinante-X-12B-v1", 2048, 12),  # below 13B: the size factor is 1
        (100, "Cydonia-24B-v4.1", 2048, 24),  # above 13B: (24/13)^0.2
        (512, "Llama-70B", 4096, 70),
        (10, "mystery", 1024, 7),  # unsized models use the default size
        (0, "Rocinante-X-12B-v1", 2048, 12),
    ],
)
def test_job_reward(tokens: int, model: str, ctx: int, b: float) -> None:
    assert job_reward(tokens, model, ctx, DEFAULTS) == pytest.approx(_reward(tokens, b, ctx))


def test_job_reward_worked_value() -> None:
    # 100 tokens x 1 x 12/125 x 3.4 = 32.64
    assert job_reward(100, "Rocinante-X-12B-v1", 2048, DEFAULTS) == pytest.approx(32.64)
    # (24/13)^0.2 = 1.1305...; 100 x 1.1305 x 24/125 x 3.4 = 73.80
    assert job_reward(100, "Cydonia-24B-v4.1", 2048, DEFAULTS) == pytest.approx(73.8, abs=0.01)


def test_job_reward_reads_the_model_reference() -> None:
    settings = KudosSettings(models={"house-model": 13})
    assert job_reward(125, "house-model", 1024, settings) == pytest.approx(round(125 * 13 / 125 * 2.2, 2))


@given(
    st.integers(min_value=0, max_value=20_000),
    st.sampled_from(["Rocinante-X-12B-v1", "x-70B", "tiny-1B", "mystery"]),
    st.integers(min_value=80, max_value=200_000),
)
def test_reward_is_never_negative_and_grows_with_tokens(tokens: int, model: str, ctx: int) -> None:
    reward = job_reward(tokens, model, ctx, DEFAULTS)
    assert reward >= 0
    assert job_reward(tokens + 100, model, ctx, DEFAULTS) >= reward


def test_hold_key_names_the_request() -> None:
    assert hold_key("6f1c1d3e-0000-4000-8000-000000000000") == "upfront:6f1c1d3e-0000-4000-8000-000000000000"
