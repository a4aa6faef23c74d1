"""The OpenAI-compatible front under /v1: chat completions, text completions and the model list.
Request and answer shapes only; the waiting and every rule live in the lifecycle
(`chat_front`, `text_front`, `waiting`). Errors take the OpenAI shape through the router's
exception handlers (`horde_lite.api.errors`)."""

from __future__ import annotations

from typing import Any

from litestar import Router

from horde_lite.api.errors import OPENAI_HANDLERS
from horde_lite.api.openai import completions, models, text_completions
from horde_lite.api.strict_body import StrictBody

router = Router(
    path="/v1",
    # Bodies (`data`) decode strictly into their structs; answers are encoded as returned.
    dto=StrictBody,
    return_dto=None,
    exception_handlers=OPENAI_HANDLERS,  # errors as `{"error": {...}}`
    tags=["OpenAI-compatible"],
    route_handlers=[*completions.HANDLERS, *text_completions.HANDLERS, *models.HANDLERS],
)

ROUTES: list[Any] = [router]
