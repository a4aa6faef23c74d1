"""One job from pop to submit: a chat job (streamed to the horde as progress when it streams) or a
legacy text job. A backend failure faults the job (the horde gives it back to the queue at once)
with a log line naming the cause; `BackendDown` is re-raised after that so the pop loop pauses."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

from horde_lite.worker.backends.base import Backend, BackendDown, BackendError, Chunk
from horde_lite.worker.horde import HordeAPI, HordeRefused, HordeUnreachable
from horde_lite.worker.relay import ProgressRelay

log = logging.getLogger("horde_lite.worker")

LEASE_MARGIN = 5.0  # a job that does not stream must be submitted this long before its ttl ends
FAULT_TIMEOUT = 10.0  # how long a fault report may take while shutting down


def legacy_tokens(text: str, payload: dict[str, Any], usage: dict[str, int] | None = None) -> int:
    """A legacy text's tokens as the horde counts them: the backend's `completion_tokens` when it
    said one, else one per 4 characters; never more than the job's `max_length` (what it allowed,
    and what is paid)."""
    reported = (usage or {}).get("completion_tokens")
    counted = reported if reported is not None else math.ceil(len(text) / 4)
    allowed = payload.get("max_length")
    return min(counted, allowed) if isinstance(allowed, int) and allowed > 0 else counted


@dataclass
class ChatOutput:
    """A chat completion put together from its chunks."""

    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    pieces: int = 0  # chunks with output: about one token each on llama-server and vLLM

    def add(self, chunk: Chunk) -> None:
        if chunk.content:
            self.content += chunk.content
        for fragment in chunk.tool_calls or []:
            self._merge(fragment)
        if chunk.content or chunk.tool_calls:
            self.pieces += 1
        self.finish_reason = chunk.finish_reason or self.finish_reason
        self.usage = {**self.usage, **(chunk.usage or {})}

    def _merge(self, fragment: dict[str, Any]) -> None:
        index = fragment.get("index", 0)
        call = next((c for c in self.tool_calls if c["index"] == index), None)
        if call is None:
            call = {"index": index, "id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            self.tool_calls.append(call)
        if fragment.get("id"):
            call["id"] = fragment["id"]
        function = fragment.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""

    @property
    def completion_tokens(self) -> int:
        return int(self.usage.get("completion_tokens") or self.pieces)

    def submit_chat(self, stopped: bool) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c["id"] or f"call_{c['index']}", "type": "function", "function": c["function"]}
                for c in sorted(self.tool_calls, key=lambda c: c["index"])
            ]
        finish = self.finish_reason or ("tool_calls" if self.tool_calls else "length" if stopped else "stop")
        usage = {**self.usage, "completion_tokens": self.completion_tokens}
        return {"message": message, "finish_reason": finish, "usage": usage}


class JobRunner:
    def __init__(self, api: HordeAPI, backend: Backend, progress_interval: float) -> None:
        self.api, self.backend, self.progress_interval = api, backend, progress_interval

    async def run(self, job: dict[str, Any]) -> None:
        ids = [str(i) for i in job.get("ids") or [job["id"]]]
        done: list[str] = []
        started = time.monotonic()
        try:
            if job.get("kind") == "chat":
                await self._chat(job, started)
            else:
                await self._text(job, ids, done, started)
        except (BackendError, BackendDown) as e:
            kind = "backend down" if isinstance(e, BackendDown) else "backend error"
            log.warning("job %s faulted: %s: %s", job["id"], kind, e)
            await self.fault([i for i in ids if i not in done])
            if isinstance(e, BackendDown):
                raise
        except asyncio.CancelledError:  # shutting down past the drain time
            log.warning("job %s faulted: the worker is stopping", job["id"])
            await asyncio.shield(self.fault([i for i in ids if i not in done]))
            raise
        except (HordeRefused, HordeUnreachable) as e:
            log.warning("job %s lost: the submit failed: %s", job["id"], e)

    async def fault(self, ids: list[str]) -> None:
        for gen_id in ids:
            if gen_id in self.api.submitted:
                continue
            try:
                async with asyncio.timeout(FAULT_TIMEOUT):
                    await self.api.submit({"id": gen_id, "generation": "", "state": "faulted"})
            except (HordeRefused, HordeUnreachable, TimeoutError) as e:
                log.warning("job %s: the fault report failed too (%s); its lease will lapse", gen_id, e)

    async def _chat(self, job: dict[str, Any], started: float) -> None:
        gen_id, streaming = str(job["id"]), bool(job.get("stream"))
        payload = dict(job.get("payload") or {})
        output = ChatOutput()
        relay = ProgressRelay(self.api, gen_id, self.progress_interval) if streaming else None

        async def consume() -> None:
            stream = self.backend.chat(str(job.get("model", "")), payload)
            async with contextlib.aclosing(stream):  # type: ignore[type-var]
                async for chunk in stream:
                    output.add(chunk)
                    if relay is not None:
                        relay.add(chunk, output.completion_tokens)

        # A job that does not stream cannot extend its lease: it must finish within its ttl.
        limit = None if streaming else max(1.0, float(job.get("ttl", 150)) - LEASE_MARGIN)
        reading = asyncio.create_task(consume())
        stopping = asyncio.create_task(relay.stop.wait()) if relay is not None else None
        try:
            waits = {reading} if stopping is None else {reading, stopping}
            done, _ = await asyncio.wait(waits, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                raise BackendError(f"no complete answer within the job's lease ({limit:.0f} s)")
            if reading in done:
                reading.result()  # a backend failure surfaces here
        finally:
            for task in (reading, stopping):
                if task is not None and not task.done():
                    task.cancel()  # closes the backend stream
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if relay is not None:
                await relay.close()
        if relay is not None and relay.lost:
            log.warning("job %s lost: %s", gen_id, relay.lost)
            return
        stopped = relay is not None and relay.cancelled
        chat = output.submit_chat(stopped)
        reward = await self.api.submit(
            {"id": gen_id, "generation": output.content, "state": "ok", "chat": chat}
        )
        self._done(
            gen_id,
            "chat stream" if streaming else "chat",
            output.completion_tokens,
            started,
            reward,
            "stopped early (cancel: true), " if stopped else "",
        )

    async def _text(self, job: dict[str, Any], ids: list[str], done: list[str], started: float) -> None:
        payload, model = dict(job.get("payload") or {}), str(job.get("model", ""))
        limit = max(1.0, float(job.get("ttl", 150)) - LEASE_MARGIN - (time.monotonic() - started))
        for gen_id in ids:
            try:
                async with asyncio.timeout(limit):
                    answer = await self.backend.text(model, payload)
            except TimeoutError as e:
                raise BackendError(f"no answer within the job's lease ({limit:.0f} s)") from e
            submitted: dict[str, Any] = {"id": gen_id, "generation": answer.text, "state": "ok"}
            if answer.usage:  # the model's counts, a horde_lite extension of the submit
                submitted["usage"] = answer.usage
            reward = await self.api.submit(submitted)
            done.append(gen_id)
            self._done(gen_id, "text", legacy_tokens(answer.text, payload, answer.usage), started, reward, "")

    @staticmethod
    def _done(gen_id: str, kind: str, tokens: int, started: float, reward: float | None, note: str) -> None:
        took = max(time.monotonic() - started, 1e-6)
        paid = "already stored" if reward is None else f"reward {reward:g}"
        log.info(
            "job %s submitted (%s): %s%d tokens in %.1f s (%.1f tokens/s), %s",
            gen_id,
            kind,
            note,
            tokens,
            took,
            tokens / took,
            paid,
        )
