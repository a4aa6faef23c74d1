"""Chat rules shared by the native route and the /v1 front: requirements, prompt size, the payload
a worker receives."""

from __future__ import annotations

import math
from typing import Any

import msgspec

from horde_lite.core.errors import HordeError
from horde_lite.inputs import PART_TYPES, RESPONSE_FORMATS, ROLES, TOOL_CHOICES, ChatPayload
from horde_lite.rc import Rc


def _bad(message: str, param: str) -> HordeError:
    return HordeError(Rc.BadRequest, message, param=param)


def validate(payload: ChatPayload) -> None:
    """What msgspec's types cannot say about a chat payload; the same on both routes."""
    for i, message in enumerate(payload.messages):
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
    if isinstance(payload.tool_choice, str) and payload.tool_choice not in TOOL_CHOICES:
        raise _bad(f"tool_choice must be one of {', '.join(TOOL_CHOICES)} or an object.", "tool_choice")
    if payload.response_format is not None and payload.response_format.get("type") not in RESPONSE_FORMATS:
        raise _bad(f"response_format.type must be one of {', '.join(RESPONSE_FORMATS)}.", "response_format")


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
    """Estimated as ceil(chars / 3) (docs/reference/chat_requests.md)."""
    return math.ceil(prompt_chars(payload) / 3)


def worker_payload(payload: ChatPayload, max_tokens: int) -> dict[str, Any]:
    """What the worker sends to its backend's /v1/chat/completions."""
    out: dict[str, Any] = msgspec.to_builtins(payload)
    out["max_tokens"] = max_tokens
    return {k: v for k, v in out.items() if v is not None}
