"""The running horde as the lifecycle sees it: settings, selected policies, metrics, clock, DB."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
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

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """One short transaction: committed when the block ends, rolled back on any error (so a
        refused request leaves nothing behind). Lifecycle entry points open their own."""
        async with self.sessionmaker() as session, session.begin():
            yield session


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling, as the faces hand it to the lifecycle: the key it presented (None: none, the
    anonymous key's stand-in), its client agent and its address. The lifecycle authenticates it
    inside the entry point's own transaction."""

    apikey: str | None = None
    client_agent: str = ""
    address: str = ""
