"""What clients and workers send, as typed structs. The horde API decodes request bodies straight
into these (msgspec validates types and ranges); defaults are applied here, on the server, because
the horde-sdk sends only the fields its caller set."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

CHAT_FEATURES = ("tools", "json_schema", "vision")
IMAGE_TRANSPORTS = ("url", "base64")

Positive = Annotated[int, msgspec.Meta(gt=0)]
# Model names are stored in VARCHAR(255) columns (worker_models, request_models).
ModelName = Annotated[str, msgspec.Meta(max_length=255)]
# A submitted seed is stored as text in a VARCHAR(64): a 64-bit integer or a short string.
Seed = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | Annotated[str, msgspec.Meta(max_length=64)]


class _In(msgspec.Struct, kw_only=True, omit_defaults=True):
    pass


class ChatBlock(_In, forbid_unknown_fields=True):
    """A chat worker's declaration in its pop."""

    max_completion_tokens: Positive
    max_context_tokens: Positive
    features: list[Literal["tools", "json_schema", "vision"]] = []
    image_transports: list[Literal["url", "base64"]] = []


class PopInput(_In):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
    models: list[ModelName] = []
    max_length: Annotated[int, msgspec.Meta(ge=16, le=65536)] = 512
    max_context_length: Annotated[int, msgspec.Meta(ge=80, le=1_048_576)] = 2048
    threads: Annotated[int, msgspec.Meta(ge=1, le=100)] = 1
    amount: Annotated[int, msgspec.Meta(ge=1, le=20)] = 1
    bridge_agent: str = "unknown:0:unknown"
    nsfw: bool = False
    priority_usernames: list[str] = []
    softprompts: list[str] = []
    chat: ChatBlock | None = None


class KoboldParams(_In):
    n: Annotated[int, msgspec.Meta(ge=1, le=20)] = 1
    max_length: int = 80
    max_context_length: Annotated[int, msgspec.Meta(ge=80, le=1_048_576)] = 2048


class ChatMessage(_In):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatOptions(_In, kw_only=True):
    """Sampling, tools and output format: the same fields on the native chat payload and on /v1."""

    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None


class ChatPayload(ChatOptions, kw_only=True):
    """A chat request on the native route (and, converted, from the /v1 front)."""

    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    max_tokens: Positive | None = None


class TextRequestInput(_In):
    prompt: str = ""
    params: dict[str, Any] = {}
    models: list[ModelName] = []
    workers: list[str] = []
    worker_blacklist: bool | list[str] = []
    trusted_workers: bool = False
    slow_workers: bool = True
    extra_slow_workers: bool = False
    allow_downgrade: bool = False
    dry_run: bool = False
    nsfw: bool = False
    disable_batching: bool = False
    proxied_account: str | None = None
    softprompt: str | None = None
    webhook: str | None = None
    chat: ChatPayload | None = None


class SubmitChat(_In):
    message: dict[str, Any]
    finish_reason: str = "stop"
    usage: dict[str, int] = {}


class SubmitInput(_In):
    id: str
    generation: str = ""
    state: Literal["ok", "censored", "faulted", "csam"] = "ok"
    seed: Seed | None = None
    gen_metadata: list[dict[str, Any]] | None = None
    chat: SubmitChat | None = None


class ProgressDelta(_In):
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ProgressInput(_In):
    id: str
    seq: Annotated[int, msgspec.Meta(ge=1)]
    delta: ProgressDelta = msgspec.field(default_factory=ProgressDelta)
    completion_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None


class WorkerUpdate(_In):
    maintenance: bool | None = None
    maintenance_msg: str | None = None
    paused: bool | None = None


class SharedKeyInput(_In):
    kudos: Annotated[float, msgspec.Meta(ge=-1)] = 5000
    expiry: Annotated[int, msgspec.Meta(ge=-1)] = -1  # days; -1 never
    name: Annotated[str, msgspec.Meta(max_length=255)] = ""
    max_text_tokens: Annotated[int, msgspec.Meta(ge=-1, le=2**31 - 1)] = -1


class SharedKeyPatch(_In):
    """PATCH /sharedkeys/{id}: only the fields sent change."""

    kudos: Annotated[float, msgspec.Meta(ge=-1)] | msgspec.UnsetType = msgspec.UNSET
    expiry: Annotated[int, msgspec.Meta(ge=-1)] | msgspec.UnsetType = msgspec.UNSET
    name: Annotated[str, msgspec.Meta(max_length=255)] | msgspec.UnsetType = msgspec.UNSET
    max_text_tokens: Annotated[int, msgspec.Meta(ge=-1, le=2**31 - 1)] | msgspec.UnsetType = msgspec.UNSET
