"""The chat front's lifecycle (POST /v1/chat/completions), without HTTP (docs/reference/chat_requests.md).

The front creates a chat request through the same admission as the native route
(`admission.decide`), then follows it with `horde_lite.fronts.waiting`, which the text
completions front (`text_front`) shares: the waiting rules, wake-ups and failures are described
there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.accounts.users import Requester
from horde_lite.core.context import Caller, Horde, InForce
from horde_lite.core.errors import HordeError
from horde_lite.db.models import Worker, WorkerModel
from horde_lite.filters import screen
from horde_lite.fronts import waiting
from horde_lite.fronts.waiting import FrontRequest
from horde_lite.inputs import ChatPayload
from horde_lite.rc import Rc
from horde_lite.requests import admission


@dataclass(frozen=True)
class Quote:
    """A chat dry run: what the request would be, without creating it."""

    model: str
    kudos: float
    outcome: str
    allowance: int
    max_tokens: int
    requested_max_tokens: int
    prompt_tokens: int
    eligible_workers: int
    estimated_wait_seconds: float | None
    features: list[str]
    image_transports: list[str]
    context_adjustments: list[dict[str, Any]]


# --- creating ----------------------------------------------------------------------------------


async def known_chat_model(session: AsyncSession, model: str) -> bool:
    """A model some registered chat worker declares, online or not. An unknown model is a 404
    (`model_not_found`); a known one whose workers are offline waits the grace like any request
    no worker can take, and then fails with `no_eligible_worker` (docs/reference/chat_requests.md)."""
    found = await session.execute(
        select(WorkerModel.model)
        .join(Worker, Worker.id == WorkerModel.worker_id)
        .where(WorkerModel.model == model, Worker.chat_max_completion_tokens.is_not(None))
        .limit(1)
    )
    return found.first() is not None


def _spec_builder(
    horde: Horde, payload: ChatPayload, model: str, *, stream: bool, dry_run: bool, client_agent: str
) -> admission.SpecBuilder:
    """The front's request as admission judges it: a model some chat worker declares, one chat job."""

    async def build(
        session: AsyncSession, requester: Requester, in_force: InForce
    ) -> admission.AdmissionSpec:
        if not await known_chat_model(session, model):
            raise HordeError(
                Rc.ModelNotFound,
                f"The model {model!r} does not exist on this horde: no chat worker serves it. "
                "GET /v1/models lists the models online chat workers serve.",
                param="model",
            )
        return await admission.chat_spec(
            session, horde, in_force, requester, payload, models=[model], stream=stream, dry_run=dry_run,
            native_route=False, client_agent=client_agent,
        )  # fmt: skip

    return build


async def create(
    horde: Horde, caller: Caller, payload: ChatPayload, model: str, *, stream: bool
) -> FrontRequest:
    """Admit and queue a chat request from the /v1 front (HordeError for a refusal)."""
    payload = await screen.screened_chat(horde, caller, payload)
    agent = caller.client_agent
    build = _spec_builder(horde, payload, model, stream=stream, dry_run=False, client_agent=agent)
    return await waiting.queue(horde, caller, build, model=model, stream=stream)


async def quote(horde: Horde, caller: Caller, payload: ChatPayload, model: str) -> Quote:
    """A chat dry run: judged exactly like the real request (refused the same way), then rolled
    back (`admission.decide`, the one dry run of both routes). Nothing is cached."""
    payload = await screen.screened_chat(horde, caller, payload)
    agent = caller.client_agent
    build = _spec_builder(horde, payload, model, stream=False, dry_run=True, client_agent=agent)
    decided = await admission.decide(horde, caller, build)
    spec, result = decided.spec, decided.admission
    return Quote(
        model=model,
        kudos=result.kudos,
        outcome=result.outcome,
        allowance=result.allowance,
        max_tokens=result.max_length,
        requested_max_tokens=spec.requested_max_length,
        prompt_tokens=spec.prompt_tokens,
        eligible_workers=result.estimate.eligible_workers,
        estimated_wait_seconds=result.estimate.estimated_wait,
        features=list(spec.required_features),
        image_transports=list(spec.required_transports),
        context_adjustments=list(result.context_adjustments),
    )
