"""The demo's clients: a steady mix of legacy requests (/api/v2, polled) and chat requests (/v1,
streamed and not, with tools and JSON schemas), of mixed sizes, from a registered user with kudos
and from the anonymous key. Each outcome is counted per kind. The first requests show each rule
once (a refusal, a downgrade, a big chat request the speed gate keeps from the slow worker); the
rest are drawn at random. Against a real model the sizes are small and no client asks for tools
or a schema (a small model follows neither)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from horde_lite.demo.fleet import MODEL

ANON = "0000000000"
GIVE_UP = 180.0  # seconds a client waits before cancelling its request
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city"],
        },
    },
}
PLAN_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "steps": {"type": "array", "items": {"type": "string"}}},
    "required": ["title", "steps"],
}
KINDS = ("legacy", "chat stream", "chat tools", "chat json")


@dataclass
class Tally:
    counts: dict[str, Counter[str]] = field(default_factory=lambda: {k: Counter() for k in KINDS})
    errors: list[str] = field(default_factory=list)

    def add(self, kind: str, outcome: str, detail: str = "") -> None:
        self.counts[kind][outcome] += 1
        if outcome == "failed":
            self.errors.append(f"{kind}: {detail}"[:300])

    def total(self, outcome: str) -> int:
        return sum(c[outcome] for c in self.counts.values())


SIZES = [64, 128, 256, 512]
CHAT_SIZES = [64, 256, 512, 2000]
MODEL_SIZES = [16, 32, 64, 128]  # a real model on a CPU: short answers


class Load:
    def __init__(
        self,
        url: str,
        user_key: str,
        seed: int = 7,
        interval: float = 0.6,
        in_flight: int = 10,
        *,
        model: str = MODEL,
        real_model: bool = False,
    ) -> None:
        self.url, self.user_key, self.model = url, user_key, model
        self.real_model = real_model
        self.sizes = MODEL_SIZES if real_model else SIZES
        self.chat_sizes = MODEL_SIZES if real_model else CHAT_SIZES
        self.random = random.Random(seed)
        self.interval, self.limit = interval, in_flight
        self.tally = Tally()
        self.http = httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(GIVE_UP, connect=5.0))
        self.tasks: set[asyncio.Task[None]] = set()
        self.answer = ("", "")  # (kind, text) of the answer served last
        self.streaming = ("", "")  # (kind, text so far) of the answer streaming last

    async def run(self) -> None:
        clients: list[tuple[float, Callable[[], Awaitable[None]]]] = [
            (4, self.legacy_free),
            (1, self.legacy_funded),
            (1, self.legacy_too_big),
            (1, self.legacy_downgraded),
            (4, self.chat_stream),
        ]
        showcase: list[Callable[[], Awaitable[None]]] = [self.legacy_too_big, self.legacy_downgraded]
        if not self.real_model:
            clients += [(1, self.chat_tools), (1, self.chat_json)]
            # Once at the start, while every worker is unmeasured (no capable one: a shadow
            # record), and again once the fast workers have measured themselves.
            showcase += [self.chat_big, *[self.chat_stream] * 8, self.chat_big]
        weights = [w for w, _ in clients]
        while True:
            if len(self.tasks) < self.limit:
                if showcase:
                    client = showcase.pop(0)
                else:
                    ((_, client),) = self.random.choices(clients, weights)
                task = asyncio.create_task(client())
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            await asyncio.sleep(self.interval)

    async def aclose(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.http.aclose()

    # --- legacy ----------------------------------------------------------------------------------

    async def legacy_free(self) -> None:
        await self._legacy(ANON, {"max_length": self.random.choice(self.sizes)})

    async def legacy_funded(self) -> None:  # slow_workers: false always holds kudos upfront
        await self._legacy(self.user_key, {"max_length": self.sizes[-1]}, slow_workers=False)

    async def legacy_too_big(self) -> None:  # over the free allowance, anonymous: refused
        await self._legacy(ANON, {"max_length": 6000, "max_context_length": 8192})

    async def legacy_downgraded(self) -> None:  # the same, allowing a downgrade: lowered to it
        await self._legacy(ANON, {"max_length": 6000, "max_context_length": 8192}, allow_downgrade=True)

    async def _legacy(self, key: str, params: dict[str, Any], **extra: Any) -> None:
        body = {"prompt": "Once upon a time", "params": params, "models": [self.model], **extra}
        created = await self.http.post("/api/v2/generate/text/async", json=body, headers={"apikey": key})
        if created.status_code != 202:
            self._refused("legacy", created)
            return
        request_id = created.json()["id"]
        self.tally.counts["legacy"]["waiting"] += 1
        try:
            async with asyncio.timeout(GIVE_UP):
                while True:
                    await asyncio.sleep(0.5)
                    status = (await self.http.get(f"/api/v2/generate/text/status/{request_id}")).json()
                    if status.get("faulted"):
                        self.tally.add("legacy", "failed", f"request {request_id} faulted")
                        return
                    if status.get("done"):
                        self.tally.add("legacy", "served")
                        for generation in status.get("generations") or []:
                            self.answer = ("legacy", str(generation.get("text") or ""))
                        return
        except (TimeoutError, asyncio.CancelledError):
            with contextlib.suppress(httpx.HTTPError):
                await asyncio.shield(
                    self.http.delete(f"/api/v2/generate/text/status/{request_id}", timeout=5.0)
                )
            raise
        finally:
            self.tally.counts["legacy"]["waiting"] -= 1

    # --- chat --------------------------------------------------------------------------------------

    async def chat_stream(self, max_tokens: int | None = None) -> None:
        body = {
            "max_tokens": max_tokens or self.random.choice(self.chat_sizes),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        await self._chat("chat stream", self.user_key, body)

    async def chat_big(self) -> None:  # over the slow worker's capacity: the speed gate at work
        await self.chat_stream(CHAT_SIZES[-1])

    async def chat_tools(self) -> None:
        await self._chat("chat tools", ANON, {"max_tokens": 200, "tools": [WEATHER_TOOL]})

    async def chat_json(self) -> None:
        fmt = {"type": "json_schema", "json_schema": {"name": "plan", "schema": PLAN_SCHEMA}}
        await self._chat("chat json", ANON, {"max_tokens": 200, "response_format": fmt})

    async def _chat(self, kind: str, key: str, extra: dict[str, Any]) -> None:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "Tell me about the horde."}],
            **extra,
        }
        headers = {"Authorization": f"Bearer {key}"}
        self.tally.counts[kind]["waiting"] += 1
        try:
            async with self.http.stream(
                "POST", "/v1/chat/completions", json=body, headers=headers
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                    self._refused(kind, response)
                    return
                if not extra.get("stream"):
                    answer = json.loads(await response.aread())
                    self._check_answer(kind, answer)
                    return
                text = ""
                async for line in response.aiter_lines():
                    if line.startswith("data: {") and '"error"' in line[:20]:
                        self.tally.add(kind, "failed", line)
                        return
                    if line.startswith("data: {"):
                        text += _delta_text(line[6:])
                        self.streaming = (kind, text)
                    if line == "data: [DONE]":
                        self.tally.add(kind, "served")
                        self.answer, self.streaming = (kind, text), ("", "")
                        return
                self.tally.add(kind, "failed", "the stream ended without [DONE]")
        except httpx.HTTPError as e:
            self.tally.add(kind, "failed", f"{type(e).__name__}: {e}")
        finally:
            self.tally.counts[kind]["waiting"] -= 1

    def _check_answer(self, kind: str, answer: dict[str, Any]) -> None:
        message = answer["choices"][0]["message"]
        if kind == "chat tools" and not message.get("tool_calls"):
            self.tally.add(kind, "failed", "no tool call in the answer")
        elif kind == "chat json" and not isinstance(json.loads(message.get("content") or "null"), dict):
            self.tally.add(kind, "failed", "the answer is not a JSON object")
        else:
            self.tally.add(kind, "served")
            self.answer = (kind, str(message.get("content") or ""))

    def _refused(self, kind: str, response: httpx.Response) -> None:
        # Kudos upfront, too many waiting, no worker may take it: the rules at work.
        if response.status_code in (403, 429, 503):
            self.tally.add(kind, "refused")
        else:
            self.tally.add(kind, "failed", f"HTTP {response.status_code}: {response.text[:200]}")


def _delta_text(data: str) -> str:
    """The text a streamed chunk adds (none for a usage or tool-call chunk)."""
    try:
        chunk = json.loads(data)
        return str(chunk["choices"][0]["delta"].get("content") or "")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return ""
