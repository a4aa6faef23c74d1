"""What workers submit, shaped the way OpenAI clients validate it: finish reasons, tool calls (whole
and streamed), message text and token counts. The /v1 fronts read submitted results through these."""

from __future__ import annotations

import json
import uuid
from typing import Any

FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter", "function_call")


def finish_reason(raw: Any, state: str, has_tool_calls: bool) -> str:
    """Never null: the worker's reason when it is one OpenAI knows, else `stop`."""
    if state == "censored":
        return "content_filter"
    reason = raw if raw in FINISH_REASONS else "stop"
    if has_tool_calls and reason == "stop":
        return "tool_calls"
    return str(reason)


def text_of(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return None


def count(value: Any, default: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return int(default)


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value if value is not None else {})


def message_tool_calls(raw: Any) -> list[dict[str, Any]]:
    """A submitted message's tool calls in the shape OpenAI clients validate."""
    out: list[dict[str, Any]] = []
    for call in raw if isinstance(raw, list) else []:
        if not isinstance(call, dict):
            continue
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        assert isinstance(function, dict)
        out.append(
            {
                "id": str(call.get("id") or f"call_{uuid.uuid4().hex[:24]}"),
                "type": "function",
                "function": {
                    "name": str(function.get("name") or ""),
                    "arguments": _arguments(function.get("arguments")),
                },
            }
        )
    return out


def tool_call_delta(raw: Any, position: int) -> dict[str, Any]:
    """A streamed tool-call fragment in the shape OpenAI clients validate (`index` required)."""
    call = raw if isinstance(raw, dict) else {}
    index = call.get("index")
    out: dict[str, Any] = {
        "index": index if isinstance(index, int) and not isinstance(index, bool) else position
    }
    if call.get("id") is not None:
        out["id"] = str(call["id"])
    if call.get("type") is not None or call.get("id") is not None:
        out["type"] = "function"
    function = call.get("function")
    if isinstance(function, dict):
        fn: dict[str, Any] = {}
        if function.get("name") is not None:
            fn["name"] = str(function["name"])
        if function.get("arguments") is not None:
            fn["arguments"] = _arguments(function["arguments"])
        out["function"] = fn
    return out
