"""The running horde as the lifecycle sees it: settings, selected policies, metrics, clock, DB."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from horde_lite.clock import Clock
from horde_lite.lifecycle.eligibility import Rules
from horde_lite.lifecycle.notify import Notifier
from horde_lite.metrics import Metrics
from horde_lite.policies.registry import Policies
from horde_lite.settings import Settings


@dataclass
class Horde:
    settings: Settings
    policies: Policies
    metrics: Metrics
    clock: Clock
    engine: AsyncEngine
    sessionmaker: async_sessionmaker[AsyncSession]
    notifier: Notifier = field(default_factory=lambda: Notifier())

    def rules(self, now: float) -> Rules:
        return Rules.from_settings(self.settings, self.policies.speed_gate, now)
