"""What a worker is told (flags) and what it declares to the horde in every pop."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from horde_lite import __version__
from horde_lite.worker.backends.base import Discovered

BRIDGE_AGENT = f"horde-lite worker:{__version__}:unknown"  # upstream's "name:version:url"
MAX_DEFAULT_OUTPUT = 4096  # the default max_length is half the context, at most this


@dataclass
class WorkerConfig:
    horde: str  # the server's base URL, e.g. http://127.0.0.1:8000 (a trailing /api is accepted)
    key: str
    name: str
    models: list[str] = field(default_factory=list)
    threads: int = 1
    max_length: int | None = None
    max_context_length: int | None = None
    chat: bool = True  # declare a chat block (False: a legacy-only worker)
    max_completion_tokens: int | None = None
    max_context_tokens: int | None = None
    features: list[str] = field(default_factory=list)
    image_transports: list[str] = field(default_factory=list)
    nsfw: bool = False
    priority_usernames: list[str] = field(default_factory=list)
    progress_interval: float = 0.3  # at most ~3 progress posts a second per job
    drain_seconds: float = 30.0  # on SIGINT/SIGTERM, jobs in hand get this long, then are faulted
    # A pop with no job waits up to this long for one, where the horde offers waiting (0: never).
    wait_seconds: int = 20
    handle_signals: bool = True


class ConfigError(Exception):
    pass


def declarations(config: WorkerConfig, found: Discovered) -> dict[str, Any]:
    """The pop body: flags first, then what the backend said, then defaults."""
    models = config.models or found.models
    if not models:
        raise ConfigError("the backend lists no model: name the model(s) to serve with --model")
    # No guess: a context the model server does not have would be offered prompts it must refuse.
    said = config.max_context_length or found.context
    if said is None:
        raise ConfigError(
            "the backend does not say its context: give --max-context-length N, the context the "
            "model server was started with (llama.cpp's -c or --n_ctx, Ollama's num_ctx, vLLM's "
            "--max-model-len); the worker does not guess it"
        )
    context = max(80, said)
    max_length = config.max_length or found.max_output or min(context // 2, MAX_DEFAULT_OUTPUT)
    body: dict[str, Any] = {
        "name": config.name,
        "models": models,
        "max_length": max(16, min(max_length, 65536)),
        "max_context_length": context,
        "threads": config.threads,
        "amount": 1,
        "nsfw": config.nsfw,
        "bridge_agent": BRIDGE_AGENT,
        "priority_usernames": config.priority_usernames,
    }
    if config.wait_seconds > 0:  # absent, the pop is upstream's: answered at once
        body["wait_seconds"] = config.wait_seconds
    if config.chat:
        body["chat"] = {
            "max_completion_tokens": config.max_completion_tokens or body["max_length"],
            "max_context_tokens": config.max_context_tokens or context,
            "features": sorted(set(config.features)),
            "image_transports": sorted(set(config.image_transports)),
        }
    return body
