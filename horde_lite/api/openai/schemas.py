"""The /v1 request body and the OpenAI-shaped answers built from the lifecycle's records."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from horde_lite.lifecycle.chat_front import ChatRequest, Final, Quote
from horde_lite.lifecycle.errors import HordeError
from horde_lite.lifecycle.inputs import ChatMessage, ChatOptions, ChatPayload

Positive = Annotated[int, msgspec.Meta(gt=0)]


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None


class ChatCompletionInput(ChatOptions, kw_only=True):
    """POST /v1/chat/completions. Fields OpenAI clients send that horde_lite does not use
    (`user`, `presence_penalty`, `logprobs`, ...) are accepted and ignored."""

    model: Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    max_completion_tokens: Positive | None = None
    max_tokens: Positive | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: int | None = None
    # horde_lite's extension (the openai package sends it through `extra_body`).
    dry_run: bool = False


def _bad(message: str, param: str) -> HordeError:
    return HordeError("BadRequest", message, param=param)


def to_payload(body: ChatCompletionInput) -> ChatPayload:
    """The native chat payload both routes admit (the lifecycle checks its contents)."""
    if body.n is not None and body.n != 1:
        raise _bad("n must be 1: each chat request is answered by one worker.", "n")
    options = {f: getattr(body, f) for f in ChatOptions.__struct_fields__}
    return ChatPayload(
        messages=body.messages, max_tokens=body.max_completion_tokens or body.max_tokens, **options
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
