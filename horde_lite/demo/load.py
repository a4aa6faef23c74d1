"""The demo's clients: a steady mix of legacy requests (/api/v2, polled) and chat requests (/v1,
streamed and not, with tools and JSON schemas), of mixed sizes, from a registered user with kudos
and from the anonymous key. Each outcome is counted per kind."""

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


class Load:
    def __init__(
        self, url: str, user_key: str, seed: int = 7, interval: float = 0.6, in_flight: int = 10
    ) -> None:
        self.url, self.user_key = url, user_key
        self.random = random.Random(seed)
        self.interval, self.limit = interval, in_flight
        self.tally = Tally()
        self.http = httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(GIVE_UP, connect=5.0))
        self.tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        clients: list[tuple[float, Callable[[], Awaitable[None]]]] = [
            (4, self.legacy_free),
            (1, self.legacy_funded),
            (1, self.legacy_too_big),
            (4, self.chat_stream),
            (1, self.chat_tools),
            (1, self.chat_json),
        ]
        weights = [w for w, _ in clients]
        while True:
            if len(self.tasks) < self.limit:
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
        await self._legacy(ANON, {"max_length": self.random.choice([64, 128, 256, 512])})

    async def legacy_funded(self) -> None:  # slow_workers: false always holds kudos upfront
        await self._legacy(self.user_key, {"max_length": 256}, slow_workers=False)

    async def legacy_too_big(self) -> None:  # over the free allowance, anonymous: refused
        await self._legacy(ANON, {"max_length": 6000, "max_context_length": 8192})

    async def _legacy(self, key: str, params: dict[str, Any], **extra: Any) -> None:
        body = {"prompt": "Once upon a time", "params": params, "models": [MODEL], **extra}
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

    async def chat_stream(self) -> None:
        body = {
            "max_tokens": self.random.choice([64, 256, 512, 2000]),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        await self._chat("chat stream", self.user_key, body)

    async def chat_tools(self) -> None:
        await self._chat("chat tools", ANON, {"max_tokens": 200, "tools": [WEATHER_TOOL]})

    async def chat_json(self) -> None:
        fmt = {"type": "json_schema", "json_schema": {"name": "plan", "schema": PLAN_SCHEMA}}
        await self._chat("chat json", ANON, {"max_tokens": 200, "response_format": fmt})

    async def _chat(self, kind: str, key: str, extra: dict[str, Any]) -> None:
        body = {
            "model": MODEL,
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
                async for line in response.aiter_lines():
                    if line.startswith("data: {") and '"error"' in line[:20]:
                        self.tally.add(kind, "failed", line)
                        return
                    if line == "data: [DONE]":
                        self.tally.add(kind, "served")
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

    def _refused(self, kind: str, response: httpx.Response) -> None:
        if response.status_code in (403, 429):  # kudos upfront, too many waiting: the rules at work
            self.tally.add(kind, "refused")
        else:
            self.tally.add(kind, "failed", f"HTTP {response.status_code}: {response.text[:200]}")
