"""Prices: what a request may cost and what its jobs may earn, fixed when the request is admitted.

A request's price is the horde's: it is computed once, at admission, from the models the request
names and the horde's own model sizes (`ModelSizes`), and stored on the request as the most one job
may be charged (`job_price`, the burn included) with the context it was priced at. A job's reward
follows upstream's rules for the model the worker served, but never exceeds the request's
`job_price` less the burn, so nothing a worker declares (a model called `x-99999B`, a huge context)
or submits can raise what the requester pays above what it was quoted, and a budget that holds the
quote always covers the charges (docs/explanation/kudos_accounting.md, "Prices and rewards").

Sizes come from the operator: `[kudos.models]`, then the optional model reference file in the AI
Horde's text-model format (`[kudos] model_reference`), then a number like `12B` in the name, bounded
by `[kudos] name_size_limit_billion`. A model with no size at all is unknown and priced as upstream
prices one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import msgspec

from horde_lite.settings import LARGEST_BILLION, KudosSettings, SettingsError

BURN = 1.0  # upstream's: each job costs the requester its reward plus this, which leaves circulation
NO_MODEL_BILLION = 13.0  # upstream prices a request that names no model as a 13B model's
UNKNOWN_RATE = 2.7 / 100  # upstream's kudos per token (times the context multiplier), unknown model
QUOTE_DIVISOR = 100.0  # upstream's quote: tokens x size bonus x B x context multiplier / 100
REWARD_DIVISOR = 125.0  # upstream's reward: the same over 125, so the quote covers the reward

_PARAMS_IN_NAME = re.compile(r"(?<![0-9.])(\d{1,6}(?:\.\d{1,3})?)\s*[bB](?![a-zA-Z])")
# Upstream's quantisation suffix (`-Q4_K_M`, `.Q8_0`): a model is looked up without it too.
_QUANT_SUFFIX = re.compile(r"[.,-][a-zA-Z0-9]+?-?Q(-[Ii]nt)?[2-9]{1,2}([_.-][0-9a-zA-Z]+)*")


class _ReferenceEntry(msgspec.Struct):
    parameters: int


def read_model_reference(path: str) -> dict[str, float]:
    """Sizes in billions from a model reference file in the AI Horde's text format: an object of
    model names, each with `parameters` (a count, not billions). Other fields are ignored."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise SettingsError(f"[kudos] model_reference: cannot read {path}: {e.strerror or e}") from e
    try:
        entries = msgspec.json.decode(raw, type=dict[str, _ReferenceEntry])
    except msgspec.DecodeError as e:
        raise SettingsError(
            f"[kudos] model_reference: {path} is not a text model reference "
            f'({{"model name": {{"parameters": 12000000000, ...}}, ...}}): {e}'
        ) from e
    sizes: dict[str, float] = {}
    for name, entry in entries.items():
        billions = entry.parameters / 1e9
        if not 0 < billions <= LARGEST_BILLION:
            raise SettingsError(
                f"[kudos] model_reference: {path}: {name!r} has {entry.parameters} parameters "
                f"(must be more than 0 and at most {LARGEST_BILLION:,.0f} billion)"
            )
        sizes[name] = billions
    return sizes


def context_multiplier(context_tokens: int) -> float:
    """Upstream's: longer contexts cost more (1024 tokens is the base), clamped to 0.1..30."""
    value = 1.2 + 2.2 ** math.log2(max(context_tokens, 1) / 1024)
    return min(max(value, 0.1), 30.0)


def _size_bonus(billions: float) -> float:
    return (max(billions, 13) / 13) ** 0.2


@dataclass(frozen=True, slots=True)
class ModelSizes:
    """The horde's sizes of models, in billions of parameters."""

    listed: Mapping[str, float]  # the operator's, from [kudos.models] over the reference file
    name_limit: float  # the largest size a number in a model's name may claim

    @classmethod
    def from_settings(cls, settings: KudosSettings) -> ModelSizes:
        listed = read_model_reference(settings.model_reference) if settings.model_reference else {}
        return cls(listed={**listed, **settings.models}, name_limit=settings.name_size_limit_billion)

    def of(self, model: str) -> float | None:
        """The model's size, or None for a model the horde cannot size (priced as unknown)."""
        name = model.split("::", 1)[0]  # upstream's `model::username` names the same model
        for candidate in (name, _QUANT_SUFFIX.sub("", name), name.rsplit("/", 1)[-1]):
            if candidate in self.listed:
                return self.listed[candidate]
        found = _PARAMS_IN_NAME.findall(name.rsplit("/", 1)[-1])
        return min(float(found[-1]), self.name_limit) if found else None


@dataclass(frozen=True, slots=True)
class Price:
    job_price: float  # the most one job may be charged: its reward cap plus the burn
    context: int  # the context tokens the request is priced at (and its jobs rewarded at)
    n: int

    @property
    def total(self) -> float:
        """What the request may cost at most: its quote, and what a funded request holds."""
        return round(self.job_price * self.n, 2)

    @property
    def reward_cap(self) -> float:
        return reward_cap(self.job_price)


def text_tokens(text: str) -> int:
    """Upstream's estimate of a text's tokens where nobody counted them: one per 4 characters."""
    return math.ceil(len(text) / 4)


def reward_cap(job_price: float) -> float:
    return round(max(job_price - BURN, 0.0), 2)


def priced_context(max_context_length: int, prompt_tokens: int, max_length: int) -> int:
    """The context a request is priced at: what its worker must hold (the prompt and the output),
    at most the request's max_context_length. A declared context the prompt does not fill costs
    nothing, so nobody inflates a price, or a reward, by declaring one."""
    return max(1, min(max_context_length, prompt_tokens + max_length))


def _job_quote(sizes: ModelSizes, model: str | None, max_length: int, multiplier: float) -> float:
    if model is None:
        return max_length * NO_MODEL_BILLION * multiplier / QUOTE_DIVISOR
    billions = sizes.of(model)
    if billions is None:
        return max_length * UNKNOWN_RATE * multiplier
    return max_length * _size_bonus(billions) * billions * multiplier / QUOTE_DIVISOR


def request_price(sizes: ModelSizes, models: Iterable[str], max_length: int, n: int, context: int) -> Price:
    """Upstream's quote for the request's dearest model (a request naming none as a 13B model's),
    plus the burn, per job."""
    multiplier = context_multiplier(context)
    named = list(models) or [None]
    quote = max(_job_quote(sizes, m, max_length, multiplier) for m in named)
    return Price(job_price=round(quote + BURN, 2), context=context, n=n)


def job_reward(
    sizes: ModelSizes, tokens: int, model: str, context: int, owner_trusted: bool, job_price: float
) -> float:
    """What the worker's owner earns for one job (the requester pays this plus the burn): upstream's
    reward for the model served at the request's priced context, at most the request's reward cap.
    An unknown model earns an untrusted owner upstream's flat context multiplier."""
    multiplier = context_multiplier(context)
    billions = sizes.of(model)
    if billions is None:
        reward = tokens * UNKNOWN_RATE * multiplier if owner_trusted else multiplier
    else:
        reward = tokens * _size_bonus(billions) * billions / REWARD_DIVISOR * multiplier
    return min(round(reward, 2), reward_cap(job_price))
