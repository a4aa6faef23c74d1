"""The demo's fleet: real `Worker`s (the same code as `horde-lite worker`) run as tasks in the
demo's process, logging to a file. Simulated by default (`--simulate`'s backend); with a model
server, they bridge it with the worker's own OpenAIBackend."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from horde_lite.worker.backends.base import Backend
from horde_lite.worker.backends.openai import OpenAIBackend
from horde_lite.worker.backends.simulate import SimulatedBackend
from horde_lite.worker.config import WorkerConfig
from horde_lite.worker.runner import Worker

MODEL = "demo/chat-8B"


@dataclass(frozen=True)
class Spec:
    name: str
    tokens_per_second: float = 0.0  # simulated only
    threads: int = 1
    chat: bool = True
    features: tuple[str, ...] = ()
    max_length: int = 8192
    context: int = 16384
    max_completion_tokens: int = 4096


FLEET = (
    Spec("fast-chat", 150, threads=2),
    Spec("slow-chat", 12),
    Spec("legacy-only", 40, chat=False),
    Spec("tools-chat", 60, features=("tools", "json_schema")),
)


def model_fleet(context: int) -> tuple[Spec, ...]:
    """Two workers sharing one model server of `context` tokens: a chat worker and a legacy one."""
    half = max(16, context // 2)
    return (
        Spec("model-chat", max_length=half, context=context, max_completion_tokens=half),
        Spec("model-legacy", chat=False, max_length=half, context=context),
    )


def simulated(spec: Spec) -> Backend:
    return SimulatedBackend(spec.tokens_per_second)


def bridging(url: str) -> Callable[[Spec], Backend]:
    """Each worker its own OpenAIBackend (its own connections) to the model server at `url`."""
    return lambda spec: OpenAIBackend(url)


@dataclass
class Fleet:
    workers: list[Worker] = field(default_factory=list)
    tasks: list[asyncio.Task[int]] = field(default_factory=list)

    @classmethod
    def start(
        cls,
        horde_url: str,
        key: str,
        suffix: str = "",
        *,
        model: str = MODEL,
        specs: tuple[Spec, ...] = FLEET,
        backend: Callable[[Spec], Backend] = simulated,
    ) -> Fleet:
        fleet = cls()
        for spec in specs:
            config = WorkerConfig(
                horde=horde_url,
                key=key,
                name=spec.name + suffix,
                models=[model],
                threads=spec.threads,
                max_length=spec.max_length,
                max_context_length=spec.context,
                chat=spec.chat,
                max_completion_tokens=spec.max_completion_tokens,
                max_context_tokens=spec.context,
                features=list(spec.features),
                drain_seconds=3.0,
                handle_signals=False,
            )
            worker = Worker(config, backend(spec))
            fleet.workers.append(worker)
            fleet.tasks.append(asyncio.create_task(worker.run()))
        return fleet

    def failed(self) -> list[str]:
        return [w.config.name for w in self.workers if w.fatal]

    async def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        await asyncio.gather(*self.tasks, return_exceptions=True)
