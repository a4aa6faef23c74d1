"""Prices and rewards as pure functions (requests/prices.py): model sizes, the quote fixed at
admission, upstream's reward, and the rule that no reward exceeds its job's share of the quote.

The ledger, holds and settlement are exercised through HTTP in tests/integration/test_horde_kudos.py
and tests/integration/test_prices_hostile.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from horde_lite.accounts.kudos import hold_key
from horde_lite.requests.prices import (
    BURN,
    ModelSizes,
    context_multiplier,
    job_reward,
    priced_context,
    read_model_reference,
    request_price,
)
from horde_lite.settings import KUDOS_LIMIT, LARGEST_BILLION, KudosSettings, SettingsError

SIZES = ModelSizes.from_settings(KudosSettings())


@pytest.mark.parametrize(
    ("model", "billions"),
    [
        ("Rocinante-X-12B-v1", 12.0),
        ("koboldcpp/Rocinante-X-12B-v1", 12.0),
        ("Llama-3.1-8B-Instruct", 8.0),
        ("gemma-2-2b-it", 2.0),
        ("Phi-3.5-mini-3.8B", 3.8),
        # A name claims at most name_size_limit_billion (13 by default).
        ("aphrodite/TheDrummer/Cydonia-24B-v4.1", 13.0),
        ("Llama-3.3-70B-Instruct", 13.0),
        ("evil-99999B", 13.0),
        ("evil-99999999B", None),  # no size a name can hold: unknown
        ("tiny-model", None),
        ("gpt2", None),
    ],
)
def test_sizes_read_from_the_name_are_bounded(model: str, billions: float | None) -> None:
    assert SIZES.of(model) == billions


def test_the_operators_sizes_win_and_are_found_as_upstream_finds_them() -> None:
    sizes = ModelSizes.from_settings(
        KudosSettings(models={"Rocinante-X-12B-v1": 13.5, "mystery": 70, "big-70B": 70})
    )
    assert sizes.of("Rocinante-X-12B-v1") == 13.5
    assert sizes.of("koboldcpp/mystery") == 70  # a backend prefix: its short name
    assert sizes.of("mystery::alice") == 70  # upstream's model::user
    assert sizes.of("big-70B") == 70  # a listed size is not bounded by the name limit
    assert sizes.of("Other-12B") == 12
    assert ModelSizes.from_settings(KudosSettings(name_size_limit_billion=70)).of("x-70B-y") == 70


def test_a_model_reference_file_in_upstreams_format(tmp_path: Path) -> None:
    path = tmp_path / "db.json"
    reference = {
        "koboldcpp/Big-Model": {"name": "koboldcpp/Big-Model", "parameters": 70_000_000_000, "nsfw": False},
        "Small": {"parameters": 1_500_000_000, "baseline": "x", "settings": {"a": 1}},
    }
    path.write_text(json.dumps(reference))
    sizes = ModelSizes.from_settings(
        KudosSettings(model_reference=str(path), models={"Small": 2})  # [kudos.models] wins
    )
    assert sizes.of("koboldcpp/Big-Model") == 70
    assert sizes.of("koboldcpp/Big-Model.i1-Q4_K_M") == 70  # upstream strips a quantisation suffix
    assert sizes.of("Small") == 2
    assert read_model_reference(str(path)) == {"koboldcpp/Big-Model": 70.0, "Small": 1.5}


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("not json", "is not a text model reference"),
        ('{"m": {"name": "m"}}', "is not a text model reference"),
        ('{"m": {"parameters": "7B"}}', "is not a text model reference"),
        ('{"m": {"parameters": 0}}', "must be more than 0"),
        ('{"m": {"parameters": 1e30}}', "is not a text model reference"),  # not an int
        (json.dumps({"m": {"parameters": int(LARGEST_BILLION * 1e9) + 1}}), "at most"),
    ],
)
def test_a_bad_model_reference_stops_start_up(tmp_path: Path, content: str, says: str) -> None:
    path = tmp_path / "db.json"
    path.write_text(content)
    with pytest.raises(SettingsError, match=says):
        read_model_reference(str(path))


def test_a_missing_model_reference_stops_start_up(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read"):
        read_model_reference(str(tmp_path / "absent.json"))


@pytest.mark.parametrize(
    "kudos",
    [
        {"name_size_limit_billion": 0},
        {"name_size_limit_billion": math.inf},
        {"name_size_limit_billion": math.nan},
        {"models": {"m": -1}},
        {"models": {"m": math.inf}},
        {"models": {"m": LARGEST_BILLION + 1}},
        {"anonymous_floor": -math.inf},
        {"registered_floor": KUDOS_LIMIT * 2},
    ],
)
def test_sizes_and_floors_outside_their_bounds_are_refused(kudos: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"\[kudos\]"):
        KudosSettings(**kudos)  # type: ignore[arg-type]


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


def test_the_priced_context_is_what_the_worker_must_hold() -> None:
    assert priced_context(max_context_length=1_048_576, prompt_tokens=10, max_length=100) == 110
    assert priced_context(max_context_length=2048, prompt_tokens=5000, max_length=100) == 2048
    assert priced_context(max_context_length=2048, prompt_tokens=0, max_length=0) == 1


def test_upstreams_quote_plus_the_burn() -> None:
    ctx = 2048  # multiplier 3.4
    price = request_price(SIZES, ["Rocinante-X-12B-v1"], 80, 2, ctx)
    assert price.job_price == round(80 * 1 * 12 * 3.4 / 100 + BURN, 2)  # 32.64 + 1
    assert price.total == round(price.job_price * 2, 2)
    assert price.reward_cap == round(price.job_price - BURN, 2)
    # The dearest named model prices the request; one naming none is priced as a 13B model's.
    assert request_price(SIZES, ["a-2B", "b-12B"], 80, 1, ctx) == request_price(SIZES, ["b-12B"], 80, 1, ctx)
    assert request_price(SIZES, [], 80, 1, ctx).job_price == round(80 * 13 * 3.4 / 100 + BURN, 2)
    # An unknown model: upstream's 2.7 / 100 per token.
    assert request_price(SIZES, ["mystery"], 80, 1, ctx).job_price == round(80 * 0.027 * 3.4 + BURN, 2)


def test_upstreams_reward_for_the_model_served() -> None:
    price = request_price(SIZES, [], 512, 1, 2048).job_price
    # 100 tokens x 1 x 12/125 x 3.4 = 32.64
    assert job_reward(SIZES, 100, "Rocinante-X-12B-v1", 2048, False, price) == pytest.approx(32.64)
    # An unknown model: a trusted owner earns 2.7/100 per token, an untrusted one the multiplier.
    assert job_reward(SIZES, 100, "mystery", 2048, True, price) == pytest.approx(round(100 * 0.027 * 3.4, 2))
    assert job_reward(SIZES, 100, "mystery", 2048, False, price) == pytest.approx(3.4)


models = st.sampled_from(["Rocinante-X-12B-v1", "x-70B", "tiny-1B", "mystery", "evil-99999B", "big"])


@given(
    requested=st.lists(models, max_size=3),
    served=models,
    max_length=st.integers(min_value=16, max_value=16384),
    tokens=st.integers(min_value=0, max_value=10**9),
    n=st.integers(min_value=1, max_value=20),
    ctx=st.integers(min_value=1, max_value=1_048_576),
    trusted=st.booleans(),
)
def test_no_reward_exceeds_its_jobs_share_of_the_quote(
    requested: list[str], served: str, max_length: int, tokens: int, n: int, ctx: int, trusted: bool
) -> None:
    """Whatever model the worker says it served and however many tokens it claims, the owner earns
    at most the job's share of the quote less the burn, and the requester pays at most the share."""
    sizes = ModelSizes.from_settings(KudosSettings(models={"big": LARGEST_BILLION}))
    price = request_price(sizes, requested, max_length, n, ctx)
    reward = job_reward(sizes, tokens, served, ctx, trusted, price.job_price)
    assert 0 <= reward <= price.reward_cap
    assert reward + BURN <= price.job_price + 1e-9
    assert n * price.job_price <= price.total + 0.011
    assert math.isfinite(price.total)
    assert price.total <= KUDOS_LIMIT


@given(
    st.integers(min_value=0, max_value=20_000),
    st.sampled_from(["Rocinante-X-12B-v1", "x-70B", "tiny-1B"]),
    st.integers(min_value=1, max_value=200_000),
)
def test_reward_is_never_negative_and_grows_with_tokens(tokens: int, model: str, ctx: int) -> None:
    cap = request_price(SIZES, [model], 16384, 1, ctx).job_price
    reward = job_reward(SIZES, tokens, model, ctx, False, cap)
    assert reward >= 0
    assert job_reward(SIZES, tokens + 100, model, ctx, False, cap) >= reward


def test_hold_key_names_the_request() -> None:
    assert hold_key("6f1c1d3e-0000-4000-8000-000000000000") == "upfront:6f1c1d3e-0000-4000-8000-000000000000"
