"""The horde side of a worker: pop, progress and submit over /api/v2, with retries.

Retries happen only where repeating is harmless: a connection error, a timeout or a 5xx answer.
A progress post is repeated with the same body and `seq` (the horde acknowledges an accepted
`seq` again without applying it twice). A submit is repeated only while its answer is unknown; a
`DuplicateGen` on a repeat means the first attempt was stored, and an id once submitted is never
sent again. A pop is never repeated here: the pop loop decides when to ask again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from horde_lite import __version__
from horde_lite.rc import Rc

log = logging.getLogger("horde_lite.worker")

SUBMIT_DELAYS = (1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0)  # ~60 s, well inside a job's lease
PROGRESS_DELAYS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # ~16 s: a progress post extends the lease by 30 s
# A waiting pop's answer may take its whole wait: its timeout is the wait and this much more.
POP_WAIT_SLACK = 15.0


class HordeUnreachable(Exception):
    """No answer from the horde (connection error, timeout, or a 5xx)."""


class HordeRefused(Exception):
    """A 4xx answer: `rc` and `message` are the horde's."""

    def __init__(self, status: int, rc: str, message: str) -> None:
        super().__init__(f"{status} {rc}: {message}")
        self.status, self.rc, self.message = status, rc, message


def api_base(url: str) -> str:
    """`http://h:8000`, `http://h:8000/api` or `http://h:8000/api/v2/` -> `http://h:8000/api/v2`."""
    root = url.rstrip("/")
    for suffix in ("/v2", "/api"):
        root = root.removesuffix(suffix)
    return f"{root}/api/v2"


class HordeAPI:
    def __init__(self, url: str, key: str, timeout: float = 30.0) -> None:
        self.base = api_base(url)
        self.timeout = timeout
        self.http = httpx.AsyncClient(
            base_url=self.base,
            headers={"apikey": key, "Client-Agent": f"horde-lite-worker:{__version__}:unknown"},
            timeout=timeout,
        )
        self.submitted: dict[str, None] = {}  # ids submitted, newest last (bounded)

    async def _once(self, path: str, body: dict[str, Any], answer_within: float | None = None) -> Any:
        try:
            response = await self.http.post(path, json=body, timeout=answer_within or self.timeout)
        except httpx.HTTPError as e:
            raise HordeUnreachable(f"POST {path}: {type(e).__name__}: {e}") from e
        if response.status_code >= 500:
            raise HordeUnreachable(f"POST {path}: HTTP {response.status_code}")
        try:
            answer = response.json()
        except ValueError as e:
            raise HordeUnreachable(f"POST {path}: HTTP {response.status_code}, not JSON") from e
        if response.status_code >= 400:
            rc = answer.get("rc", "?") if isinstance(answer, dict) else "?"
            message = answer.get("message", "") if isinstance(answer, dict) else str(answer)
            raise HordeRefused(response.status_code, rc, message)
        return answer

    async def _retried(self, path: str, body: dict[str, Any], delays: tuple[float, ...]) -> tuple[Any, int]:
        """The answer and the number of attempts it took (the same body every time)."""
        for attempt, delay in enumerate((*delays, None), start=1):
            try:
                return await self._once(path, body), attempt
            except HordeUnreachable as e:
                if delay is None:
                    raise
                log.warning("%s; retrying in %.2g s (attempt %d)", e, delay, attempt + 1)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def pop(self, body: dict[str, Any]) -> dict[str, Any]:
        waits = body.get("wait_seconds")
        timeout = max(self.timeout, waits + POP_WAIT_SLACK) if isinstance(waits, int) else None
        answer = await self._once("/generate/text/pop", body, timeout)
        return answer if isinstance(answer, dict) else {}

    async def progress(self, body: dict[str, Any]) -> dict[str, Any]:
        answer, _ = await self._retried("/generate/text/progress", body, PROGRESS_DELAYS)
        return answer if isinstance(answer, dict) else {}

    async def submit(self, body: dict[str, Any]) -> float | None:
        """Submit once; the reward, or None when the horde already had it from an earlier attempt."""
        gen_id = str(body["id"])
        if gen_id in self.submitted:
            log.error("job %s was already submitted; not sending it again", gen_id)
            return None
        try:
            answer, attempts = await self._retried("/generate/text/submit", body, SUBMIT_DELAYS)
        except HordeRefused as e:
            if e.rc == Rc.DuplicateGen:  # a repeat whose first attempt was stored (answer lost)
                self._remember(gen_id)
                return None
            raise
        self._remember(gen_id)
        if attempts > 1:
            log.info("job %s submitted on attempt %d", gen_id, attempts)
        return float(answer.get("reward", 0.0)) if isinstance(answer, dict) else 0.0

    def _remember(self, gen_id: str) -> None:
        self.submitted[gen_id] = None
        if len(self.submitted) > 10_000:
            del self.submitted[next(iter(self.submitted))]

    async def aclose(self) -> None:
        await self.http.aclose()
