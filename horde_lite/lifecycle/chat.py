"""Chat rules shared by the native route and the /v1 front: requirements, prompt size, the payload
a worker receives."""

from __future__ import annotations

import math
from typing import Any

import msgspec

from horde_lite.lifecycle.inputs import ChatPayload


def _image_urls(payload: ChatPayload) -> list[str]:
    urls: list[str] = []
    for message in payload.messages:
        if isinstance(message.content, list):
            for part in message.content:
                if isinstance(part, dict) and part.get("type") == "image_url":
                    image = part.get("image_url")
                    url = image.get("url") if isinstance(image, dict) else image
                    if isinstance(url, str):
                        urls.append(url)
    return urls


def image_transport(url: str) -> str | None:
    if url.startswith("data:"):
        return "base64"
    if url.startswith(("http://", "https://")):
        return "url"
    return None


def requirements(payload: ChatPayload) -> tuple[list[str], list[str]]:
    """(features, image transports) a worker must declare to take this request."""
    features: set[str] = set()
    if payload.tools and payload.tool_choice != "none":
        features.add("tools")
    fmt = (payload.response_format or {}).get("type")
    if fmt in ("json_schema", "json_object"):
        features.add("json_schema")
    transports = {t for t in (image_transport(u) for u in _image_urls(payload)) if t is not None}
    if _image_urls(payload):
        features.add("vision")
    return sorted(features), sorted(transports)


def bad_image_urls(payload: ChatPayload) -> list[str]:
    return [u[:60] for u in _image_urls(payload) if image_transport(u) is None]


def prompt_chars(payload: ChatPayload) -> int:
    total = 0
    for message in payload.messages:
        content = message.content
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(
                len(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"
            )
        if message.tool_calls:
            total += len(msgspec.json.encode(message.tool_calls))
    if payload.tools:
        total += len(msgspec.json.encode(payload.tools))
    return total


def prompt_tokens(payload: ChatPayload) -> int:
    """Estimated as ceil(chars / 3) (behaviour.md §4)."""
    return math.ceil(prompt_chars(payload) / 3)


def worker_payload(payload: ChatPayload, max_tokens: int) -> dict[str, Any]:
    """What the worker sends to its backend's /v1/chat/completions."""
    out: dict[str, Any] = msgspec.to_builtins(payload)
    out["max_tokens"] = max_tokens
    return {k: v for k, v in out.items() if v is not None}
