"""The demo's simulated fleet: real `Worker`s (the same code as `horde-lite worker --simulate`) run
as tasks in the demo's process, logging to a file."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from horde_lite.worker.backends.simulate import SimulatedBackend
from horde_lite.worker.config import WorkerConfig
from horde_lite.worker.runner import Worker

MODEL = "demo/chat-8B"


@dataclass(frozen=True)
class Spec:
    name: str
    tokens_per_second: float
    threads: int = 1
    chat: bool = True
    features: tuple[str, ...] = ()
    max_completion_tokens: int = 4096


FLEET = (
    Spec("fast-chat", 150, threads=2),
    Spec("slow-chat", 12),
    Spec("legacy-only", 40, chat=False),
    Spec("tools-chat", 60, features=("tools", "json_schema")),
)


@dataclass
class Fleet:
    workers: list[Worker] = field(default_factory=list)
    tasks: list[asyncio.Task[int]] = field(default_factory=list)

    @classmethod
    def start(cls, horde_url: str, key: str, suffix: str = "") -> Fleet:
        fleet = cls()
        for spec in FLEET:
            config = WorkerConfig(
                horde=horde_url,
                key=key,
                name=spec.name + suffix,
                models=[MODEL],
                threads=spec.threads,
                max_length=8192,
                max_context_length=16384,
                chat=spec.chat,
                max_completion_tokens=spec.max_completion_tokens,
                max_context_tokens=16384,
                features=list(spec.features),
                drain_seconds=3.0,
                handle_signals=False,
            )
            worker = Worker(config, SimulatedBackend(spec.tokens_per_second))
            fleet.workers.append(worker)
            fleet.tasks.append(asyncio.create_task(worker.run()))
        return fleet

    def failed(self) -> list[str]:
        return [w.config.name for w in self.workers if w.fatal]

    async def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        await asyncio.gather(*self.tasks, return_exceptions=True)
