"""The /v1 request bodies and the OpenAI-shaped answers, built from the lifecycle's records.

Non-streaming answers are typed structs, so the OpenAPI schema describes them; streamed chunks are
built here too and sent by `horde_lite.api.openai.streaming`."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

import msgspec

from horde_lite.core.errors import HordeError
from horde_lite.fronts.chat_front import Quote
from horde_lite.fronts.waiting import Final, FrontRequest
from horde_lite.inputs import ChatMessage, ChatOptions, ChatPayload, TextRequestInput
from horde_lite.rc import Rc

Positive = Annotated[int, msgspec.Meta(gt=0, le=2**31 - 1)]
ModelId = Annotated[str, msgspec.Meta(min_length=1, max_length=255)]


# --- requests ----------------------------------------------------------------------------------


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None


# Each request is answered by one worker: n may only be 1 (`_one_choice` says so in words).
OnlyOne = Annotated[int, msgspec.Meta(extra_json_schema={"enum": [1]})]


class ChatCompletionInput(ChatOptions, kw_only=True):
    """POST /v1/chat/completions. Fields OpenAI clients send that horde_lite does not use
    (`user`, `presence_penalty`, `logprobs`, ...) are accepted and ignored."""

    model: ModelId
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    max_completion_tokens: Positive | None = None
    max_tokens: Positive | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: OnlyOne | None = None
    # horde_lite's extension (the openai package sends it through `extra_body`).
    dry_run: bool = False


class CompletionInput(msgspec.Struct, kw_only=True):
    """POST /v1/completions (OpenAI's legacy completions API), answered by a legacy text request.
    Other OpenAI fields (`echo`, `suffix`, `logprobs`, `best_of`, `user`, penalties, ...) are
    accepted and ignored."""

    model: ModelId
    prompt: str | Annotated[list[str], msgspec.Meta(min_length=1, max_length=1)]
    max_tokens: Positive | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    stop: str | Annotated[list[str], msgspec.Meta(max_length=16)] | None = None
    n: OnlyOne | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    seed: Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | None = None


def _one_choice(n: int | None) -> None:
    if n is not None and n != 1:
        raise HordeError(Rc.BadRequest, "n must be 1: each request is answered by one worker.", param="n")


def wants_usage(options: StreamOptions | None) -> bool:
    return bool(options and options.include_usage)


def to_payload(body: ChatCompletionInput) -> ChatPayload:
    """The native chat payload both routes admit (the lifecycle checks its contents)."""
    _one_choice(body.n)
    options = {f: getattr(body, f) for f in ChatOptions.__struct_fields__}
    return ChatPayload(
        messages=body.messages, max_tokens=body.max_completion_tokens or body.max_tokens, **options
    )


def to_text_request(body: CompletionInput) -> TextRequestInput:
    """The legacy text request /v1/completions makes: the prompt and its Kobold parameters
    (`max_length` is left out when `max_tokens` is: the lifecycle applies the default and the
    horde's minimum)."""
    _one_choice(body.n)
    params: dict[str, Any] = {"n": 1}
    if body.max_tokens is not None:
        params["max_length"] = body.max_tokens
    if body.temperature is not None:
        params["temperature"] = body.temperature
    if body.top_p is not None:
        params["top_p"] = body.top_p
    if body.stop:
        params["stop_sequence"] = [body.stop] if isinstance(body.stop, str) else list(body.stop)
    if body.seed is not None:
        params["sampler_seed"] = body.seed
    prompt = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
    return TextRequestInput(prompt=prompt, params=params, models=[body.model])


# --- answers -----------------------------------------------------------------------------------


class ContextAdjustment(msgspec.Struct):
    """A limit horde_lite changed, and why (`[]` when nothing was changed)."""

    field: str
    requested: int
    applied: int
    reason: str


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ToolCallFunction(msgspec.Struct):
    name: str
    arguments: str


class ToolCall(msgspec.Struct):
    id: str
    function: ToolCallFunction
    type: Literal["function"] = "function"


class AssistantMessage(msgspec.Struct, omit_defaults=True):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCall] | None = None  # left out when the worker called no tools


ChatFinish = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]
TextFinish = Literal["stop", "length", "content_filter"]


class ChatChoice(msgspec.Struct):
    index: int
    message: AssistantMessage
    finish_reason: ChatFinish
    logprobs: None = None


class TextChoice(msgspec.Struct):
    text: str
    index: int
    finish_reason: TextFinish
    logprobs: None = None


class _Whole(msgspec.Struct, kw_only=True):
    """What a non-streaming answer carries besides its choices, with the extensions
    `context_adjustments` and `kudos` (what the request cost its requester)."""

    id: str
    created: int
    model: str
    usage: Usage
    context_adjustments: list[ContextAdjustment]
    kudos: float
    system_fingerprint: None = None


class ChatCompletion(_Whole, kw_only=True):
    """A non-streaming `chat.completion`."""

    choices: list[ChatChoice]
    object: Literal["chat.completion"] = "chat.completion"


class TextCompletion(_Whole, kw_only=True):
    """A non-streaming `text_completion`."""

    choices: list[TextChoice]
    object: Literal["text_completion"] = "text_completion"


class Requirements(msgspec.Struct):
    features: list[str]
    image_transports: list[str]


class ChatCompletionQuote(msgspec.Struct):
    """A chat dry run's answer: nothing was created."""

    model: str
    kudos: float
    outcome: str
    free_output_allowance: int
    max_tokens: int
    requested_max_tokens: int
    prompt_tokens: int
    eligible_workers: int
    estimated_wait_seconds: float | None
    requirements: Requirements
    context_adjustments: list[ContextAdjustment]
    object: Literal["chat.completion.quote"] = "chat.completion.quote"
    dry_run: Literal[True] = True


class Model(msgspec.Struct):
    id: str
    created: int
    object: Literal["model"] = "model"
    owned_by: str = "horde_lite"


class ModelList(msgspec.Struct):
    data: list[Model]
    object: Literal["list"] = "list"


def adjustments(raw: list[dict[str, Any]]) -> list[ContextAdjustment]:
    return msgspec.convert(raw, list[ContextAdjustment])


def usage(final: Final) -> Usage:
    return Usage(final.prompt_tokens, final.completion_tokens, final.prompt_tokens + final.completion_tokens)


def chat_id(front: FrontRequest) -> str:
    return f"chatcmpl-{front.request_id}"


def text_id(front: FrontRequest) -> str:
    return f"cmpl-{front.request_id}"


def _whole(front: FrontRequest, final: Final) -> dict[str, Any]:
    return {
        "created": int(front.created_at),
        "model": front.model,
        "usage": usage(final),
        "context_adjustments": adjustments(front.context_adjustments),
        "kudos": final.kudos,
    }


def completion(front: FrontRequest, final: Final) -> ChatCompletion:
    message = msgspec.convert(final.message, AssistantMessage)
    choice = ChatChoice(0, message, final.finish_reason)  # type: ignore[arg-type]
    return ChatCompletion(id=chat_id(front), choices=[choice], **_whole(front, final))


def text_completion(front: FrontRequest, final: Final) -> TextCompletion:
    choice = TextChoice(final.text, 0, final.finish_reason)  # type: ignore[arg-type]
    return TextCompletion(id=text_id(front), choices=[choice], **_whole(front, final))


def quote(q: Quote) -> ChatCompletionQuote:
    fields = dataclasses.asdict(q)
    fields["free_output_allowance"] = fields.pop("allowance")
    fields["requirements"] = {
        "features": fields.pop("features"),
        "image_transports": fields.pop("image_transports"),
    }
    return msgspec.convert(fields, ChatCompletionQuote)


# --- streamed chunks ---------------------------------------------------------------------------


def chunk(
    front: FrontRequest, choices: list[dict[str, Any]], *, include_usage: bool, **extra: Any
) -> dict[str, Any]:
    """One streamed chunk: `chat.completion.chunk` for a chat request, `text_completion` for a text
    one. `choices=[]` with `usage` makes the usage chunk; the other chunks carry `usage: null`
    when the client asked for usage, and no `usage` otherwise."""
    chat = front.spec.is_chat
    body: dict[str, Any] = {
        "id": chat_id(front) if chat else text_id(front),
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(front.created_at),
        "model": front.model,
        "system_fingerprint": None,
        "choices": choices,
    }
    if include_usage and "usage" not in extra:
        body["usage"] = None
    body.update(extra)
    return body


def chat_choice(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}


def text_choice(text: str, finish_reason: str) -> dict[str, Any]:
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
