"""The OpenAI-compatible chat front under /v1."""

from __future__ import annotations

from typing import Any

ROUTES: list[Any] = []
