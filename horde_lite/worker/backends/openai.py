"""Any OpenAI-compatible server: llama.cpp's llama-server, Ollama, vLLM, TabbyAPI, KoboldCpp's /v1.

Chat jobs go to `/v1/chat/completions` with the job's payload as it is (the server applies the
model's chat template), always streamed. Legacy jobs go to `/v1/completions` with the Kobold
parameters mapped by `completion_params` (docs/reference/worker.md lists what is dropped).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx

from horde_lite.worker.backends.base import BackendError, Chunk, Completion, Discovered
from horde_lite.worker.backends.http import client, raise_for_status, split_base, stream_chat, translated

# Kobold parameter -> OpenAI /v1/completions field. top_k, min_p and the repetition penalty are
# extensions the usual local servers read: llama.cpp reads `repeat_penalty`, vLLM and TabbyAPI
# `repetition_penalty`, so the penalty is sent under both names (servers ignore fields they lack).
KOBOLD_TO_OPENAI: dict[str, tuple[str, ...]] = {
    "max_length": ("max_tokens",),
    "temperature": ("temperature",),
    "top_p": ("top_p",),
    "top_k": ("top_k",),
    "min_p": ("min_p",),
    "rep_pen": ("repetition_penalty", "repeat_penalty"),
    "stop_sequence": ("stop",),
    "sampler_seed": ("seed",),
}


def completion_params(payload: dict[str, Any]) -> dict[str, Any]:
    """A legacy job's Kobold payload as /v1/completions fields; unmapped keys are dropped."""
    out: dict[str, Any] = {"prompt": payload.get("prompt", "")}
    for kobold, names in KOBOLD_TO_OPENAI.items():
        value = payload.get(kobold)
        if value is None or (kobold == "stop_sequence" and not value):
            continue
        for name in names:
            out[name] = value
    return out


def served_model(job_model: str, backend_models: list[str]) -> str:
    """The name to send: the job's model when the server lists it, else the server's first one
    (llama-server ignores it; Ollama and vLLM need a name they know)."""
    if not backend_models or job_model in backend_models:
        return job_model
    return backend_models[0]


_NUM_CTX = re.compile(r"^\s*num_ctx\s+(\d+)", re.MULTILINE)
# How long the prompt count may take (a one-token answer to a prompt the server has just read).
COUNT_TIMEOUT = 10.0


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _usage(value: Any) -> dict[str, int] | None:
    """The prompt and completion counts of a `usage` object, those that are counts (None: none)."""
    if not isinstance(value, dict):
        return None
    kept = {k: n for k in ("prompt_tokens", "completion_tokens") if (n := _count(value.get(k))) is not None}
    return kept or None


class OpenAIBackend:
    kind = "openai"

    def __init__(self, url: str, timeout: float = 120.0) -> None:
        self.root, self.v1 = split_base(url)
        self.http = client(timeout)
        self.backend_models: list[str] = []

    async def _json(self, method: str, url: str, **kwargs: Any) -> Any:
        """A discovery read: the JSON answer, or None when the server does not have the route."""
        with translated(url):
            response = await self.http.request(method, url, **kwargs)
        if response.status_code >= 400:
            return None
        try:
            return response.json()
        except ValueError:
            return None

    async def discover(self, models: list[str]) -> Discovered:
        found = Discovered(models=list(models))
        sources: list[str] = []
        listed = await self._json("GET", f"{self.v1}/models")
        entries = listed.get("data", []) if isinstance(listed, dict) else []
        self.backend_models = [
            e["id"] for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)
        ]
        if self.backend_models:
            sources.append("/v1/models")
            found.models = found.models or list(self.backend_models)
        for entry in entries:  # vLLM says its context per model
            if isinstance(entry, dict) and isinstance(entry.get("max_model_len"), int):
                found.context = entry["max_model_len"]
                sources.append("max_model_len")
                break
        if found.context is None:  # llama.cpp's llama-server
            props = await self._json("GET", f"{self.root}/props")
            if isinstance(props, dict):
                settings = props.get("default_generation_settings") or {}
                n_ctx = settings.get("n_ctx", props.get("n_ctx"))
                if isinstance(n_ctx, int) and n_ctx > 0:
                    found.context = n_ctx
                    sources.append("/props n_ctx")
        if found.context is None and self.backend_models:  # Ollama
            show = await self._json("POST", f"{self.root}/api/show", json={"model": self.backend_models[0]})
            if isinstance(show, dict):
                match = _NUM_CTX.search(str(show.get("parameters") or ""))
                info = show.get("model_info") or {}
                trained = [v for k, v in info.items() if k.endswith(".context_length") and isinstance(v, int)]
                if match:
                    found.context = int(match.group(1))
                elif trained:
                    found.context = trained[0]
                if found.context:
                    sources.append("/api/show")
        if found.context is None:  # TabbyAPI
            model = await self._json("GET", f"{self.v1}/model")
            params = model.get("parameters") if isinstance(model, dict) else None
            if isinstance(params, dict) and isinstance(params.get("max_seq_len"), int):
                found.context = params["max_seq_len"]
                sources.append("/v1/model max_seq_len")
        found.source = ", ".join(sources) or "flags"
        return found

    async def healthy(self) -> bool:
        try:
            response = await self.http.get(f"{self.v1}/models", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code < 500  # llama-server answers 503 while it loads the model

    async def chat(self, model: str, payload: dict[str, Any]) -> AsyncIterator[Chunk]:
        """The backend's stream; when it carries no prompt count (llama-cpp-python's server sends
        no usage in a stream), one last chunk with the count `prompt_tokens` asks for."""
        body = {
            **payload,
            "model": served_model(model, self.backend_models),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        counted = False
        stream = stream_chat(self.http, f"{self.v1}/chat/completions", body, "chat completion")
        async with contextlib.aclosing(stream):
            async for chunk in stream:
                counted = counted or _count((chunk.usage or {}).get("prompt_tokens")) is not None
                yield chunk
        if not counted and (prompt := await self.prompt_tokens(body)) is not None:
            yield Chunk(usage={"prompt_tokens": prompt})

    async def prompt_tokens(self, body: dict[str, Any]) -> int | None:
        """The server's own count of a chat request's prompt (its template applied): the `usage`
        of the same request answered whole with one token. The server has just read that prompt,
        so it is cheap where the server keeps its prompt cache. None when the server does not say."""
        asked = {k: v for k, v in body.items() if k not in ("stream_options", "max_completion_tokens")}
        asked.update(stream=False, max_tokens=1)
        try:
            response = await self.http.post(f"{self.v1}/chat/completions", json=asked, timeout=COUNT_TIMEOUT)
            usage = response.json().get("usage") if response.status_code < 400 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return _count(usage.get("prompt_tokens")) if isinstance(usage, dict) else None

    async def text(self, model: str, payload: dict[str, Any]) -> Completion:
        """The completion's text and, when the server answers with a `usage`, its counts."""
        body = {**completion_params(payload), "model": served_model(model, self.backend_models)}
        with translated("completion"):
            response = await self.http.post(f"{self.v1}/completions", json=body)
            await raise_for_status(response, "completion")
        try:
            answer = response.json()
            text = str(answer["choices"][0]["text"])
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise BackendError(f"completion: unexpected answer {response.text[:200]!r}") from e
        return Completion(text, _usage(answer.get("usage")))

    async def aclose(self) -> None:
        await self.http.aclose()
