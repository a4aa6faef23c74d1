"""A streaming chat job's progress posts: output batched into at most one post per interval, `seq`
counted exactly (1, 2, ...; a retry repeats the same body and seq), tool-call fragments relayed
as they come. The horde's answer can ask the worker to stop (`cancel: true`); a refusal (the lease
lapsed, the job was submitted elsewhere) means the job is lost. Either sets `stop`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from horde_lite.worker.backends.base import Chunk
from horde_lite.worker.horde import HordeAPI, HordeRefused, HordeUnreachable

log = logging.getLogger("horde_lite.worker")


def merge_fragments(pending: list[dict[str, Any]], fragment: dict[str, Any]) -> None:
    """Append a tool-call fragment, folding a continuation (same index, no id) into the last one."""
    last = pending[-1] if pending else None
    if last is not None and fragment.get("index") == last.get("index") and fragment.get("id") is None:
        args = (fragment.get("function") or {}).get("arguments")
        if args:
            function = last.setdefault("function", {})
            function["arguments"] = (function.get("arguments") or "") + args
        return
    pending.append({**fragment, "function": dict(fragment.get("function") or {})})


class ProgressRelay:
    def __init__(self, api: HordeAPI, gen_id: str, interval: float) -> None:
        self.api, self.gen_id, self.interval = api, gen_id, interval
        self.seq = 0  # the last seq the horde accepted
        self.cancelled = False
        self.lost: str | None = None
        self.stop = asyncio.Event()  # cancelled or lost: the backend stream should close
        self._content = ""
        self._tools: list[dict[str, Any]] = []
        self._tokens = 0
        self._wake = asyncio.Event()
        self._closing = False
        self._task = asyncio.create_task(self._run())

    def add(self, chunk: Chunk, completion_tokens: int) -> None:
        if self.stop.is_set():
            return
        if chunk.content:
            self._content += chunk.content
        for fragment in chunk.tool_calls or []:
            merge_fragments(self._tools, fragment)
        self._tokens = completion_tokens
        if chunk.content or chunk.tool_calls:
            self._wake.set()

    async def close(self) -> None:
        """Post what is pending at once and stop."""
        self._closing = True
        self._wake.set()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        last = 0.0
        while not self.stop.is_set():
            if not self._closing:
                await self._wake.wait()
            if not self._closing:  # batching: at most one post per interval
                await asyncio.sleep(max(0.0, last + self.interval - time.monotonic()))
            self._wake.clear()
            if self._content or self._tools:
                last = time.monotonic()
                await self._post()
            elif self._closing:  # closing and nothing left (output may arrive during a post)
                return

    async def _post(self) -> None:
        delta: dict[str, Any] = {}
        if self._content:
            delta["content"] = self._content
        if self._tools:
            delta["tool_calls"] = self._tools
        body = {"id": self.gen_id, "seq": self.seq + 1, "delta": delta, "completion_tokens": self._tokens}
        self._content, self._tools = "", []
        try:
            answer = await self.api.progress(body)
        except HordeRefused as e:
            self._lose(f"the horde refused progress seq {body['seq']}: {e}")
            return
        except HordeUnreachable as e:
            self._lose(f"progress seq {body['seq']} got no answer after retries: {e}")
            return
        self.seq = body["seq"]
        if answer.get("cancel") and not self.cancelled:
            self.cancelled = True
            log.info("job %s: the horde asked to stop (cancel: true) after seq %d", self.gen_id, self.seq)
            self.stop.set()

    def _lose(self, why: str) -> None:
        self.lost = why
        self.stop.set()
