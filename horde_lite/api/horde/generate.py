"""/generate/text/*: requests, status, and the worker protocol (pop, submit).

Each handler calls one lifecycle entry point (it owns its transactions and authenticates the
caller) and builds the wire struct from the typed result it returns.
"""

from __future__ import annotations

from typing import Any, cast

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, JSONBody
from msgspec import UNSET

from horde_lite.api import client_gone
from horde_lite.api.address_guard import address_guard
from horde_lite.api.deps import CallerDep, HordeDep
from horde_lite.api.horde.schemas import (
    ChatResult,
    ContextAdjustment,
    GenerationKobold,
    GenerationPayloadKobold,
    GenerationState,
    GenerationSubmitted,
    NoValidRequestFoundKobold,
    PopInput,
    RequestAsync,
    RequestQuote,
    RequestStatusKobold,
    RequestWarning,
    SubmitInput,
    TextRequestInput,
)
from horde_lite.api.horde.worker_messages import pop_message
from horde_lite.jobs import completion, dispatch, long_poll
from horde_lite.requests import admission
from horde_lite.requests import status as status_rules

# --- building the answers from the lifecycle's typed results ----------------------------------------


def _adjustments(decision: admission.Decision) -> list[ContextAdjustment] | Any:
    """Listed for chat requests always, for others only when something was changed."""
    adjustments = decision.admission.context_adjustments
    if not decision.spec.is_chat and not adjustments:
        return UNSET
    return msgspec.convert(adjustments, list[ContextAdjustment])


def request_answer(decision: admission.Decision) -> RequestAsync | RequestQuote:
    result = decision.admission
    if result.request_id is None:  # a dry run
        return RequestQuote(
            kudos=result.kudos, max_length=result.max_length, context_adjustments=_adjustments(decision)
        )
    warnings = [RequestWarning(**w) for w in result.warnings]
    return RequestAsync(
        id=result.request_id,
        kudos=result.kudos,
        message=warnings[0].message if warnings else UNSET,
        warnings=warnings or UNSET,
        context_adjustments=_adjustments(decision),
    )


def _seed(raw: str | None) -> int | str | Any:
    """Stored as text; answered as the integer it was when it reads as one."""
    if raw is None:
        return UNSET
    return status_rules.seed_value(raw)  # ASCII digits only: "²" and "--5" stay text


def status_answer(status: status_rules.RequestStatus) -> RequestStatusKobold:
    return RequestStatusKobold(
        finished=status.finished,
        processing=status.processing,
        restarted=status.restarted,
        waiting=status.waiting,
        done=status.done,
        faulted=status.faulted,
        wait_time=status.wait_time,
        queue_position=status.queue_position,
        kudos=status.kudos,
        is_possible=status.is_possible,
        generations=[
            GenerationKobold(
                text=g.text,
                model=g.model,
                state=cast(GenerationState, g.state),  # finished generations only
                worker_id=g.worker_id,
                worker_name=g.worker_name,
                seed=_seed(g.seed),
                gen_metadata=g.gen_metadata or UNSET,
                chat=msgspec.convert(g.chat_result, ChatResult) if g.chat_result else UNSET,
            )
            for g in status.generations
        ],
    )


def pop_answer(popped: dispatch.Popped, wait_seconds: int | None = None) -> GenerationPayloadKobold:
    """`wait_seconds`: the wait applied, for a pop that asked to wait (None: it did not ask)."""
    offer = popped.offer
    messages = [pop_message(m) for m in popped.messages]
    wait: int | Any = UNSET if wait_seconds is None else wait_seconds
    if offer is None:
        # `payload` is present (empty): the horde-sdk's model of this answer requires it.
        skipped = NoValidRequestFoundKobold(**popped.skipped)
        return GenerationPayloadKobold(
            id=None, ids=[], payload={}, skipped=skipped, messages=messages, wait_seconds=wait
        )
    common: dict[str, Any] = {
        "id": offer.ids[0],
        "ids": offer.ids,
        "model": offer.model,
        "ttl": offer.ttl,
        "skipped": NoValidRequestFoundKobold(),
        "messages": messages,
        "wait_seconds": wait,
    }
    if offer.is_chat:
        return GenerationPayloadKobold(**common, kind="chat", stream=offer.stream, payload=offer.chat or {})
    # Kobold parameters pass through untouched; n is the jobs taken, max_length the admitted one.
    payload = {**offer.params, "prompt": offer.prompt, "n": len(offer.ids), "max_length": offer.max_length}
    return GenerationPayloadKobold(**common, kind="text", payload=payload, softprompt=None)


# --- the routes ------------------------------------------------------------------------------------


@post(
    "/generate/text/async",
    status_code=202,
    before_request=address_guard,
    responses={
        202: ResponseSpec(RequestAsync, description="Queued."),
        200: ResponseSpec(RequestQuote, description="A dry run: what it would cost; nothing created."),
    },
)
async def create_text_request(
    data: JSONBody[TextRequestInput], horde: HordeDep, caller: CallerDep
) -> Response[RequestAsync | RequestQuote]:
    decision = await admission.request_text(horde, caller, data)
    return Response(request_answer(decision), status_code=200 if decision.spec.dry_run else 202)


@get("/generate/text/status/{request_id:str}")
async def get_status(request_id: FromPath[str], horde: HordeDep) -> RequestStatusKobold:
    return status_answer(await status_rules.read(horde, request_id))


@delete("/generate/text/status/{request_id:str}", status_code=200)
async def cancel_request(request_id: FromPath[str], horde: HordeDep) -> RequestStatusKobold:
    return status_answer(await status_rules.cancel_and_read(horde, request_id))


@post("/generate/text/pop", status_code=200, before_request=address_guard)
async def pop_job(
    data: JSONBody[PopInput], horde: HordeDep, caller: CallerDep, request: Request[Any, Any, Any]
) -> GenerationPayloadKobold:
    if not data.wait_seconds:  # upstream's pop: answered at once, in upstream's shape
        return pop_answer(await dispatch.pop_job(horde, caller, data))
    async with client_gone.watched(request) as gone:
        popped = await long_poll.pop_job(horde, caller, data, gone)
    return pop_answer(popped, long_poll.bound(horde.settings, data))


@post("/generate/text/submit", status_code=200, before_request=address_guard)
async def submit_job(data: JSONBody[SubmitInput], horde: HordeDep, caller: CallerDep) -> GenerationSubmitted:
    submitted = await completion.submit_job(horde, caller, data)
    return GenerationSubmitted(reward=submitted.reward)


HANDLERS = [create_text_request, get_status, cancel_request, pop_job, submit_job]
