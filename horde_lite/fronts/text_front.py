"""The text completions front's lifecycle (POST /v1/completions), without HTTP.

The front makes a legacy text request (a prompt and Kobold parameters) on the same queue and
through the same admission as the native route (`admission.decide`), then waits for it with
`horde_lite.fronts.waiting`, exactly as the chat front does. What differs from the native route
is what a waiting client needs (docs/reference/chat_requests.md, "POST /v1/completions"):

- the model must be one some registered worker declares (`model_not_found` otherwise);
- `max_length` defaults to `chat.default_max_tokens`, is raised to the horde's minimum of 16 and
  lowered to the largest `max_length` an online worker for the model declares, each change
  reported in `context_adjustments`;
- `max_context_length` is what the prompt needs (estimated as characters / 3) plus `max_length`, so
  only a worker that holds the whole prompt takes the job; when no online worker for the model
  declares that much, the request is refused at once (`context_length_exceeded`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import msgspec
from sqlalchemy import func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.accounts.users import Requester
from horde_lite.core.context import Caller, Horde, InForce
from horde_lite.core.errors import HordeError
from horde_lite.db.models import Worker, WorkerModel
from horde_lite.filters import screen
from horde_lite.fronts import waiting
from horde_lite.fronts.waiting import FrontRequest
from horde_lite.inputs import TextRequestInput
from horde_lite.rc import Rc
from horde_lite.requests import admission

MIN_MAX_LENGTH = 16  # the horde's smallest max_length
MIN_CONTEXT = 80  # the horde's smallest max_context_length


def prompt_tokens(prompt: str) -> int:
    """Estimated as ceil(chars / 3), like a chat request's messages."""
    return math.ceil(len(prompt) / 3)


def _workers_of(model: str) -> Any:
    return Worker.id.in_(select(WorkerModel.worker_id).where(WorkerModel.model == model))


async def _online_limits(
    session: AsyncSession, horde: Horde, in_force: InForce, model: str, requester_id: int
) -> tuple[int | None, int | None]:
    """The largest max_length and max_context_length online workers for `model` declare (None: none
    online). A worker in maintenance counts only for its owner's requests, as everywhere."""
    online_since = in_force.rules(horde.clock.now()).online_since
    found = await session.execute(
        select(func.max(Worker.max_length), func.max(Worker.max_context_length)).where(
            _workers_of(model),
            Worker.last_check_in >= online_since,
            Worker.paused.is_(False),
            or_(Worker.maintenance.is_(False), Worker.owner_id == requester_id),
        )
    )
    most, most_context = found.one()
    return most, most_context


def _adjusted(requested: int, applied: int, reason: str) -> dict[str, Any]:
    return {"field": "max_tokens", "requested": requested, "applied": applied, "reason": reason}


def _spec_builder(
    horde: Horde, body: TextRequestInput, model: str, client_agent: str
) -> admission.SpecBuilder:
    async def build(
        session: AsyncSession, requester: Requester, in_force: InForce
    ) -> admission.AdmissionSpec:
        if (await session.execute(select(Worker.id).where(_workers_of(model)).limit(1))).first() is None:
            raise HordeError(
                Rc.ModelNotFound,
                f"The model {model!r} does not exist on this horde: no worker serves it.",
                param="model",
            )
        settings = in_force.settings
        requested = body.params.get("max_length") or settings.chat.default_max_tokens
        limit = settings.request.max_length_limit
        if requested > limit:
            raise HordeError(Rc.BadRequest, f"max_tokens must be at most {limit}.", param="max_tokens")
        changes: list[dict[str, Any]] = []
        applied = max(requested, MIN_MAX_LENGTH)
        if applied != requested:
            changes.append(_adjusted(requested, applied, "raised to the horde's minimum max_length"))
        most, most_context = await _online_limits(session, horde, in_force, model, requester.user.id)
        if most is not None and applied > most:
            changes.append(
                _adjusted(
                    requested,
                    most,
                    "lowered to the largest max_length declared by an online worker for the requested model",
                )
            )
            applied = most
        tokens = prompt_tokens(body.prompt)
        need = tokens + applied
        if most_context is not None and need > most_context:
            raise HordeError(
                Rc.ContextLengthExceeded,
                f"This request needs {need} context tokens ({tokens} for the prompt, estimated as "
                f"characters / 3, plus max_tokens {applied}); the online workers for {model} accept at "
                f"most {most_context}. Shorten the prompt or lower max_tokens.",
                param="prompt",
            )
        params = {**body.params, "max_length": applied, "max_context_length": max(need, MIN_CONTEXT)}
        spec = admission.legacy_spec(
            requester, msgspec.structs.replace(body, params=params), horde, client_agent
        )
        return replace(spec, native_route=False, requested_max_length=requested, context_adjustments=changes)

    return build


async def create(horde: Horde, caller: Caller, body: TextRequestInput, *, stream: bool) -> FrontRequest:
    """Admit and queue the legacy text request of a /v1/completions call (HordeError for a refusal).
    `body.models` holds the one model asked for."""
    body = await screen.screened_request(horde, caller, body)
    model = body.models[0]
    build = _spec_builder(horde, body, model, caller.client_agent)
    return await waiting.queue(
        horde, caller, build, model=model, stream=stream, prompt_tokens=prompt_tokens(body.prompt)
    )
