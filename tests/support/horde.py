"""A test client for the horde: the real app over HTTP, plus set-up helpers that write what an
operator's CLI would (users, kudos) through the same lifecycle functions."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import httpx
from litestar.testing import AsyncTestClient
from sqlalchemy import select, update

from horde_lite.accounts import kudos as ledger
from horde_lite.accounts.users import create_user
from horde_lite.accounts.workers import capacity_for
from horde_lite.clock import ManualClock
from horde_lite.core.context import Horde
from horde_lite.db.models import TextRequest, User, Worker
from horde_lite.jobs import lease
from horde_lite.requests import prices

ANON = "0000000000"


def quote(max_length: int, billions: float, context: int, n: int = 1) -> float:
    """A request's price as documented (docs/reference/horde_api.md, "Kudos"), written out here
    independently of requests/prices.py: upstream's quote plus the burn of 1, per job, times n."""
    multiplier = min(max(1.2 + 2.2 ** math.log2(context / 1024), 0.1), 30.0)
    bonus = (max(billions, 13) / 13) ** 0.2
    return round(round(max_length * bonus * billions * multiplier / 100 + 1, 2) * n, 2)


class HordeClient:
    def __init__(self, http: AsyncTestClient[Any], horde: Horde) -> None:
        self.http = http
        self.horde = horde

    @property
    def clock(self) -> ManualClock:
        assert isinstance(self.horde.clock, ManualClock)
        return self.horde.clock

    # --- set-up (what `horde-lite users create/kudos` does) -----------------------------------

    async def user(
        self, name: str, kudos: float = 0.0, *, trusted: bool = False, moderator: bool = False
    ) -> str:
        async with self.horde.sessionmaker() as session, session.begin():
            user, key = await create_user(
                session, name, self.clock.now(), trusted=trusted, moderator=moderator
            )
            if kudos:
                await ledger.record(session, user.id, kudos, "grant", "test", self.clock.now())
        return key

    async def set_worker_speed(self, name: str, lease_speed: float | None) -> None:
        """Give a worker a measured lease speed, as if its past submits had measured it."""
        async with self.horde.sessionmaker() as session, session.begin():
            samples = [] if lease_speed is None else [lease_speed]
            await session.execute(
                update(Worker)
                .where(Worker.name == name)
                .values(
                    lease_speed=lease_speed,
                    speed_samples=samples,
                    capacity=capacity_for(lease_speed, self.horde.settings),
                )
            )

    async def balance(self, name: str) -> float:
        async with self.horde.sessionmaker() as session:
            user = (await session.execute(select(User).where(User.username == name))).scalar_one()
            return user.kudos

    async def price(self, request_id: str) -> tuple[float, int]:
        """The request's price as admission fixed it: (the most one job may be charged, the
        context tokens its jobs are rewarded at)."""
        async with self.horde.sessionmaker() as session:
            priced = select(TextRequest.job_price, TextRequest.price_context)
            job_price, context = (await session.execute(priced.where(TextRequest.id == request_id))).one()
            return job_price, context

    async def expected_reward(
        self, request_id: str, tokens: int, model: str, *, owner_trusted: bool = False
    ) -> float:
        """What prices.job_reward pays for a job of the request, as the submit computes it."""
        job_price, context = await self.price(request_id)
        return prices.job_reward(self.horde.sizes, tokens, model, context, owner_trusted, job_price)

    async def sweep(self) -> tuple[int, int]:
        return await lease.sweep(self.horde)

    # --- the wire ------------------------------------------------------------------------------

    async def create(self, key: str = ANON, **body: Any) -> httpx.Response:
        body.setdefault("prompt", "Hello there.")
        return await self.http.post("/api/v2/generate/text/async", json=body, headers={"apikey": key})

    async def pop(self, key: str, name: str, **body: Any) -> httpx.Response:
        return await self.http.post(
            "/api/v2/generate/text/pop", json={"name": name, **body}, headers={"apikey": key}
        )

    async def submit(self, key: str, gen_id: str, text: str = "done", **body: Any) -> httpx.Response:
        return await self.http.post(
            "/api/v2/generate/text/submit",
            json={"id": gen_id, "generation": text, "state": "ok", **body},
            headers={"apikey": key},
        )

    async def post_aside(self, path: str, key: str, body: dict[str, Any]) -> httpx.Response:
        """POST through the app's ASGI transport from a worker thread: the app runs on the
        client's portal, where this client's own awaits are serialized; calls made from several
        threads at once run concurrently on the portal's event loop, like several real clients
        (a waiting pop among them)."""

        def post() -> httpx.Response:
            request = httpx.Request("POST", f"{self.http.base_url}{path}", json=body, headers={"apikey": key})
            response = self.http._transport.handle_request(request)  # type: ignore[attr-defined]
            response.read()
            return response

        return await asyncio.to_thread(post)

    async def status(self, request_id: str) -> httpx.Response:
        return await self.http.get(f"/api/v2/generate/text/status/{request_id}")

    async def cancel(self, request_id: str) -> httpx.Response:
        return await self.http.delete(f"/api/v2/generate/text/status/{request_id}")

    async def metrics(self) -> str:
        response = await self.http.get("/metrics")
        assert response.status_code == 200
        return response.text
