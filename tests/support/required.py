"""What CI demands of the test environment: `HORDE_LITE_REQUIRE_<THING>=1` (or true, yes) turns a
test's skip for want of that thing (PostgreSQL, PgBouncer, a real model, ...) into a failure."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def required(env: str) -> bool:
    return os.environ.get(env, "").strip().lower() in {"1", "true", "yes"}


def skip_or_fail(env: str, reason: str) -> NoReturn:
    """Skip the test for want of `reason`; fail it instead when `env` requires what is missing."""
    if required(env):
        pytest.fail(f"required ({env}) but missing: {reason}")
    pytest.skip(reason)
