"""The pop loop: `threads` slots each popping and running one job at a time.

- Waiting pops: each pop asks the horde to wait for a job (`wait_seconds`); when the answer says
  the horde waited (its `wait_seconds` > 0), an empty answer is followed by the next pop at once.
  A stop ends a waiting pop at once (the horde claims nothing for a pop whose client has gone).
- Idle back-off, against a horde that does not wait (upstream's, or waiting turned off): an empty
  pop waits 0.5 s, then 1.5 times longer each time, never more than 15 s; after a job the slot
  pops again at once.
- The horde unreachable: the same back-off, one log line per outage. A 4xx on pop (a bad key, a
  name owned by someone else, a declaration the horde refuses) stops the worker with its message.
- The backend down: popping pauses (every slot), one monitor checks the backend with back-off and
  logs when it is back. A job in hand when it went down is faulted once, not job after job.
- SIGINT/SIGTERM: stop popping; jobs in hand get `drain_seconds` to finish, then are faulted;
  exit 0. A second signal skips the wait.
- Messages: the horde hands the worker's unexpired messages with every pop; each is logged once,
  the first time it comes (its text with control characters escaped: it is someone else's words).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any

from horde_lite.worker.backends.base import Backend, BackendDown, BackendError
from horde_lite.worker.config import ConfigError, WorkerConfig, declarations
from horde_lite.worker.horde import HordeAPI, HordeRefused, HordeUnreachable
from horde_lite.worker.jobs import JobRunner

log = logging.getLogger("horde_lite.worker")

FIRST_IDLE_WAIT = 0.5
IDLE_GROWTH = 1.5
MAX_WAIT = 15.0  # never more than this between two pops (or two backend checks)
SEEN_MESSAGES = 1000  # message ids remembered, so each is logged once


def _horde_waited(answer: dict[str, Any]) -> bool:
    """The pop's answer says the horde waited for a job before answering empty."""
    waited = answer.get("wait_seconds")
    return isinstance(waited, int) and not isinstance(waited, bool) and waited > 0


def printable(text: str) -> str:
    """Text for one log line: line breaks and other control characters escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class Worker:
    def __init__(self, config: WorkerConfig, backend: Backend, api: HordeAPI | None = None) -> None:
        self.config = config
        self.backend = backend
        self.api = api or HordeAPI(config.horde, config.key)
        self.jobs = JobRunner(self.api, backend, config.progress_interval)
        self.body: dict[str, Any] = {}
        self.fatal: str | None = None
        self.stopping = asyncio.Event()
        self.backend_up = asyncio.Event()
        self._monitor: asyncio.Task[None] | None = None
        self._signals = 0
        self._hurry = asyncio.Event()  # a second signal: stop waiting for jobs in hand
        self.served = 0  # jobs finished (submitted or faulted), for the demo's table
        self.seen_messages: dict[str, None] = {}  # ids of the messages logged, oldest first

    # --- life ----------------------------------------------------------------------------------

    def stop(self) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info(
                "%s: stopping: no more pops; jobs in hand get %g s to finish",
                self.config.name,
                self.config.drain_seconds,
            )
        else:
            self._hurry.set()
        self.stopping.set()

    async def run(self, banner: str = "") -> int:
        """Serve until stopped; 0 after a stop, 1 after a fatal refusal. `banner` is logged once
        the signals are handled, so a SIGINT sent after it always stops the worker (one started
        with SIGINT ignored, as a shell's background job is, would otherwise miss it)."""
        loop = asyncio.get_running_loop()
        if self.config.handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.stop)
        if banner:
            log.info("%s", banner)
        try:
            if await self._start():
                slots = [asyncio.create_task(self._slot(i)) for i in range(self.config.threads)]
                await self._finish(slots)
        finally:
            if self._monitor is not None:
                self._monitor.cancel()
            if self.config.handle_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)
            await self.api.aclose()
            await self.backend.aclose()
        if self.fatal:
            log.error("%s: stopped: %s", self.config.name, self.fatal)
            return 1
        log.info("%s: stopped", self.config.name)
        return 0

    async def _start(self) -> bool:
        """Wait for the backend, read what it says about itself, log the declarations."""
        wait = FIRST_IDLE_WAIT
        while not self.stopping.is_set():
            try:
                found = await self.backend.discover(self.config.models)
                break
            except (BackendDown, BackendError) as e:
                log.warning(
                    "%s: backend not ready (%s); popping paused, next check in %.1f s",
                    self.config.name,
                    e,
                    wait,
                )
                await self._sleep(wait)
                wait = min(wait * 2, MAX_WAIT)
        else:
            return False
        try:
            self.body = declarations(self.config, found)
        except ConfigError as e:
            self.fatal = str(e)
            return False
        self.backend_up.set()
        shown = {k: v for k, v in self.body.items() if k not in ("name", "bridge_agent", "amount")}
        log.info("%s: declared %s (limits from %s)", self.config.name, shown, found.source)
        return True

    async def _finish(self, slots: list[asyncio.Task[None]]) -> None:
        await self.stopping.wait()
        drain = asyncio.gather(*slots, return_exceptions=True)
        second_signal = asyncio.create_task(self._second_signal())
        await asyncio.wait(
            {drain, second_signal},
            timeout=self.config.drain_seconds,  # type: ignore[arg-type]
            return_when=asyncio.FIRST_COMPLETED,
        )
        second_signal.cancel()
        for slot in slots:
            slot.cancel()  # a job still running is faulted by the job runner
        await asyncio.gather(*slots, return_exceptions=True)

    async def _second_signal(self) -> None:
        await self._hurry.wait()

    async def _sleep(self, seconds: float) -> None:
        """Sleep, or less if the worker is stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    # --- the loop ------------------------------------------------------------------------------

    async def _slot(self, index: int) -> None:
        try:
            await self._pop_loop()
        except Exception as e:  # a bug must not leave the worker half-alive: stop it, loudly
            log.exception("%s: slot %d failed", self.config.name, index)
            self.fatal = f"slot {index} failed: {type(e).__name__}: {e}"
            self.stopping.set()

    async def _pop_loop(self) -> None:
        idle = FIRST_IDLE_WAIT
        horde_down = False
        while not self.stopping.is_set():
            if not self.backend_up.is_set():
                await self._until_backend_or_stop()
                continue
            try:
                job = await self._pop_unless_stopping()
            except HordeUnreachable as e:
                if not horde_down:
                    log.warning(
                        "%s: the horde does not answer (%s); retrying with back-off", self.config.name, e
                    )
                horde_down = True
                await self._sleep(idle)
                idle = min(idle * IDLE_GROWTH, MAX_WAIT)
                continue
            except HordeRefused as e:
                self.fatal = f"the horde refused the pop: {e}"
                self.stopping.set()
                return
            if horde_down:
                log.info("%s: the horde answers again", self.config.name)
                horde_down = False
            if job is None:  # stopped while the pop waited
                return
            self._log_messages(job.get("messages"))
            if not job.get("id"):
                if not _horde_waited(job):
                    await self._sleep(idle)
                    idle = min(idle * IDLE_GROWTH, MAX_WAIT)
                continue
            idle = FIRST_IDLE_WAIT  # fast polling after a job
            if self.stopping.is_set():  # popped while the stop came in: give it back at once
                log.info("job %s given back: the worker is stopping", job["id"])
                await self.jobs.fault([str(i) for i in job.get("ids") or [job["id"]]])
                return
            await self._run(job)

    async def _pop_unless_stopping(self) -> dict[str, Any] | None:
        """One pop; None when the worker stops first (a waiting pop is then given up: the horde
        claims nothing for a pop whose client has gone)."""
        popping = asyncio.ensure_future(self.api.pop(self.body))
        stopped = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({popping, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if popping.done():
            return popping.result()
        popping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await popping
        return None

    def _log_messages(self, messages: object) -> None:
        """Log each message the first time a pop hands it."""
        for message in messages if isinstance(messages, list) else []:
            if not isinstance(message, dict) or not isinstance(message.get("id"), str):
                continue
            if message["id"] in self.seen_messages:
                continue
            self.seen_messages[message["id"]] = None
            if len(self.seen_messages) > SEEN_MESSAGES:
                del self.seen_messages[next(iter(self.seen_messages))]
            log.info(
                "%s: message from %s (until %s): %s",
                self.config.name,
                printable(str(message.get("origin", "?"))),
                printable(str(message.get("expiry", "?"))),
                printable(str(message.get("message", ""))),
            )

    async def _run(self, job: dict[str, Any]) -> None:
        payload = job.get("payload") or {}
        size = payload.get("max_tokens", payload.get("max_length"))
        log.info(
            "job %s popped: %s%s model=%s max_tokens=%s",
            job["id"],
            job.get("kind", "text"),
            " stream" if job.get("stream") else "",
            job.get("model"),
            size,
        )
        try:
            await self.jobs.run(job)
        except BackendDown as e:
            self._backend_down(str(e))
        finally:
            self.served += 1

    def _backend_down(self, why: str) -> None:
        if self.backend_up.is_set():
            self.backend_up.clear()
            self._monitor = asyncio.create_task(self._watch_backend(why))

    async def _watch_backend(self, why: str) -> None:
        wait = FIRST_IDLE_WAIT
        while not self.stopping.is_set():
            log.warning(
                "%s: backend down (%s); popping paused, next check in %.1f s", self.config.name, why, wait
            )
            await self._sleep(wait)
            if await self.backend.healthy():
                log.info("%s: backend is back; popping resumed", self.config.name)
                self.backend_up.set()
                return
            wait = min(wait * 2, MAX_WAIT)
            why = "still unreachable"

    async def _until_backend_or_stop(self) -> None:
        waits = {asyncio.create_task(self.backend_up.wait()), asyncio.create_task(self.stopping.wait())}
        _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
