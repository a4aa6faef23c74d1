"""The /v1 request body and the OpenAI-shaped answers built from the lifecycle's records."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from horde_lite.lifecycle.chat_front import ChatRequest, Final, Quote
from horde_lite.lifecycle.errors import HordeError
from horde_lite.lifecycle.inputs import ChatMessage, ChatPayload

Positive = Annotated[int, msgspec.Meta(gt=0)]

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
PART_TYPES = ("text", "image_url")
TOOL_CHOICES = ("none", "auto", "required")
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None


class ChatCompletionInput(msgspec.Struct, kw_only=True):
    """POST /v1/chat/completions. Fields OpenAI clients send that horde_lite does not use
    (`user`, `presence_penalty`, `logprobs`, ...) are accepted and ignored."""

    model: Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    max_completion_tokens: Positive | None = None
    max_tokens: Positive | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    n: int | None = None
    # horde_lite's extension (the openai package sends it through `extra_body`).
    dry_run: bool = False


def _bad(message: str, param: str) -> HordeError:
    return HordeError(400, "BadRequest", message, param=param)


def to_payload(body: ChatCompletionInput) -> ChatPayload:
    """The native chat payload both routes admit; the checks msgspec's types cannot express."""
    if body.n is not None and body.n != 1:
        raise _bad("n must be 1: each chat request is answered by one worker.", "n")
    for i, message in enumerate(body.messages):
        if message.role not in ROLES:
            raise _bad(f"messages[{i}].role must be one of {', '.join(ROLES)}.", f"messages.{i}.role")
        if isinstance(message.content, list):
            for j, part in enumerate(message.content):
                kind = part.get("type")
                if kind not in PART_TYPES:
                    raise _bad(
                        f"messages[{i}].content[{j}].type {kind!r} is not supported; use text or image_url.",
                        f"messages.{i}.content.{j}.type",
                    )
                if kind == "image_url":
                    image = part.get("image_url")
                    url = image.get("url") if isinstance(image, dict) else image
                    if not isinstance(url, str):
                        raise _bad(
                            f"messages[{i}].content[{j}].image_url.url must be a string.",
                            f"messages.{i}.content.{j}.image_url",
                        )
                elif not isinstance(part.get("text"), str):
                    raise _bad(
                        f"messages[{i}].content[{j}].text must be a string.", f"messages.{i}.content.{j}.text"
                    )
    if isinstance(body.tool_choice, str) and body.tool_choice not in TOOL_CHOICES:
        raise _bad(f"tool_choice must be one of {', '.join(TOOL_CHOICES)} or an object.", "tool_choice")
    if body.response_format is not None and body.response_format.get("type") not in RESPONSE_FORMATS:
        raise _bad(f"response_format.type must be one of {', '.join(RESPONSE_FORMATS)}.", "response_format")
    return ChatPayload(
        messages=body.messages,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        stop=body.stop,
        seed=body.seed,
        tools=body.tools,
        tool_choice=body.tool_choice,
        response_format=body.response_format,
    )


# --- answers -----------------------------------------------------------------------------------


def completion_id(chat: ChatRequest) -> str:
    return f"chatcmpl-{chat.request_id}"


def usage(final: Final) -> dict[str, int]:
    return {
        "prompt_tokens": final.prompt_tokens,
        "completion_tokens": final.completion_tokens,
        "total_tokens": final.prompt_tokens + final.completion_tokens,
    }


def completion(chat: ChatRequest, final: Final) -> dict[str, Any]:
    """A non-streaming `chat.completion`, with the extensions `context_adjustments` and `kudos`."""
    return {
        "id": completion_id(chat),
        "object": "chat.completion",
        "created": int(chat.created_at),
        "model": chat.model,
        "choices": [
            {"index": 0, "message": final.message, "finish_reason": final.finish_reason, "logprobs": None}
        ],
        "usage": usage(final),
        "system_fingerprint": None,
        "context_adjustments": chat.context_adjustments,
        "kudos": final.kudos,
    }


def chunk(
    chat: ChatRequest,
    delta: dict[str, Any] | None,
    finish_reason: str | None = None,
    *,
    include_usage: bool = False,
    **extra: Any,
) -> bytes:
    """One `chat.completion.chunk` as an SSE event. `delta=None` makes the usage chunk
    (`choices: []`); `usage` is null on the others when the client asked for usage."""
    body: dict[str, Any] = {
        "id": completion_id(chat),
        "object": "chat.completion.chunk",
        "created": int(chat.created_at),
        "model": chat.model,
        "system_fingerprint": None,
        "choices": []
        if delta is None
        else [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
    }
    if include_usage and "usage" not in extra:
        body["usage"] = None
    body.update(extra)
    return sse(body)


def sse(data: Any) -> bytes:
    return b"data: " + msgspec.json.encode(data) + b"\n\n"


DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"


def quote(q: Quote) -> dict[str, Any]:
    """A chat dry run's answer: nothing was created."""
    return {
        "object": "chat.completion.quote",
        "dry_run": True,
        "model": q.model,
        "kudos": q.kudos,
        "outcome": q.outcome,
        "free_output_allowance": q.allowance,
        "max_tokens": q.max_tokens,
        "requested_max_tokens": q.requested_max_tokens,
        "prompt_tokens": q.prompt_tokens,
        "eligible_workers": q.eligible_workers,
        "estimated_wait_seconds": q.estimated_wait_seconds,
        "requirements": {"features": q.features, "image_transports": q.image_transports},
        "context_adjustments": q.context_adjustments,
    }
