"""The OpenAI-compatible chat front under /v1 (api.md "Chat front"): request and answer shapes
only; the waiting and every rule live in `horde_lite.lifecycle.chat_front`. Errors take the OpenAI
shape through `horde_lite.api.errors` (every path under /v1)."""

from __future__ import annotations

from typing import Any

from horde_lite.api.openai import completions, models

ROUTES: list[Any] = [*completions.HANDLERS, *models.HANDLERS]
