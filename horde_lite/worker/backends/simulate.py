"""`--simulate TOKENS_PER_SECOND`: a backend with no model, for demos, tests and load.

It writes filler words at the given rate (a token is a word here), streamed, up to the job's
max_tokens (finish_reason `length`). A request with tools (tool_choice not `none`) is answered with
one call of the named or first tool, its arguments valid for the tool's parameter schema; a
`json_object`/`json_schema` response format is answered with JSON valid for the schema's basic
types (object, array, string, integer, number, boolean, null, enum, const).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import time
from collections.abc import AsyncIterator
from typing import Any

from horde_lite.worker.backends.base import Chunk, Completion, Discovered

WORDS = [
    "the",
    "horde",
    "hums",
    "along",
    "as",
    "volunteers",
    "lend",
    "their",
    "cards",
    "to",
    "strangers",
    "and",
    "every",
    "token",
    "finds",
    "a",
    "home",
    "while",
    "the",
    "queue",
    "drains",
    "slowly",
    "under",
    "a",
    "patient",
    "moon",
]
TICK = 0.05  # seconds between two emitted pieces
# The simulator has no model, so any context is true of it; this one is declared unless a flag says.
SIMULATED_CONTEXT = 4096


def sample(schema: Any, depth: int = 0) -> Any:
    """A value valid for a JSON schema's basic keywords (enough for structured-output demos)."""
    if not isinstance(schema, dict) or depth > 8:
        return "value"
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return sample(schema[key][0], depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: sample(sub, depth + 1) for name, sub in props.items()}
    if kind == "array":
        count = max(1, int(schema.get("minItems", 1)))
        return [sample(schema.get("items", {}), depth + 1) for _ in range(count)]
    if kind == "integer":
        return int(schema.get("minimum", 42))
    if kind == "number":
        return float(schema.get("minimum", 4.2))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    text = "simulated"
    return text.ljust(int(schema.get("minLength", 0)), "x")


def _pieces(text: str, count: int) -> list[str]:
    """`text` cut into `count` pieces (at least one character each)."""
    count = max(1, min(count, len(text)))
    cuts = [math.floor(len(text) * i / count) for i in range(count + 1)]
    return [text[a:b] for a, b in itertools.pairwise(cuts)]


def _tool_call(payload: dict[str, Any]) -> dict[str, Any] | None:
    tools = [t for t in payload.get("tools") or [] if isinstance(t, dict)]
    choice = payload.get("tool_choice")
    if not tools or choice == "none":
        return None
    wanted = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    tool = next((t for t in tools if t.get("function", {}).get("name") == wanted), tools[0])
    function = tool.get("function") or {}
    return {"name": function.get("name", "tool"), "arguments": json.dumps(sample(function.get("parameters")))}


def _json_answer(payload: dict[str, Any]) -> str | None:
    fmt = payload.get("response_format")
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema") or {}
        return json.dumps(sample(spec.get("schema", spec)))
    if fmt.get("type") == "json_object":
        return json.dumps({"answer": "simulated"})
    return None


def _prompt_tokens(payload: dict[str, Any]) -> int:
    return math.ceil(len(json.dumps(payload.get("messages", payload.get("prompt", "")))) / 4)


class SimulatedBackend:
    kind = "simulate"

    def __init__(self, tokens_per_second: float, seed: int | None = None) -> None:
        if tokens_per_second <= 0:
            raise ValueError("--simulate needs a positive number of tokens per second")
        self.rate = tokens_per_second
        self.random = random.Random(seed)

    async def discover(self, models: list[str]) -> Discovered:
        return Discovered(models=list(models), context=SIMULATED_CONTEXT, source="flags (simulated)")

    async def healthy(self) -> bool:
        return True

    def _words(self, count: int) -> list[str]:
        return [self.random.choice(WORDS) + " " for _ in range(count)]

    async def _paced(self, total: int) -> AsyncIterator[int]:
        """Yield how many more tokens are due, every TICK, until `total` were produced."""
        start, made = time.monotonic(), 0
        while made < total:
            await asyncio.sleep(TICK)  # batched by time, so a fast rate is not a busy loop
            due = min(total, int((time.monotonic() - start) * self.rate))
            if due > made:
                yield due - made
                made = due

    async def chat(self, model: str, payload: dict[str, Any]) -> AsyncIterator[Chunk]:
        max_tokens = int(payload.get("max_tokens") or 256)
        call, structured = _tool_call(payload), _json_answer(payload)
        usage = {"prompt_tokens": _prompt_tokens(payload), "completion_tokens": 0}
        if call is not None:  # the call's name first, then its arguments in pieces, like llama-server
            pieces = _pieces(call["arguments"], math.ceil(len(call["arguments"]) / 4))
            yield Chunk(
                tool_calls=[
                    {
                        "index": 0,
                        "id": f"call_{self.random.randrange(16**8):08x}",
                        "type": "function",
                        "function": {"name": call["name"], "arguments": ""},
                    }
                ]
            )
            sent = 0
            async for due in self._paced(len(pieces)):
                for piece in pieces[sent : sent + due]:
                    yield Chunk(tool_calls=[{"index": 0, "function": {"arguments": piece}}])
                sent += due
            usage["completion_tokens"] = len(pieces) + 1
            yield Chunk(finish_reason="tool_calls", usage={**usage, "total_tokens": sum(usage.values())})
            return
        words = _pieces(structured, math.ceil(len(structured) / 4)) if structured else self._words(max_tokens)
        sent = 0
        async for due in self._paced(len(words)):
            yield Chunk(content="".join(words[sent : sent + due]))
            sent += due
        usage["completion_tokens"] = len(words)
        finish = "stop" if structured or len(words) < max_tokens else "length"
        yield Chunk(finish_reason=finish, usage={**usage, "total_tokens": sum(usage.values())})

    async def text(self, model: str, payload: dict[str, Any]) -> Completion:
        total = int(payload.get("max_length") or 80)
        parts = [piece async for piece in self._legacy(total)]
        usage = {"prompt_tokens": _prompt_tokens(payload), "completion_tokens": total}
        return Completion("".join(parts), usage)

    async def _legacy(self, total: int) -> AsyncIterator[str]:
        async for due in self._paced(total):
            yield "".join(self._words(due))

    async def aclose(self) -> None:
        pass
