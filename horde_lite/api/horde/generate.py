"""/generate/text/*: requests, status, and the worker protocol (pop, submit)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, delete, get, post
from litestar.params import FromPath

from horde_lite.api.common import apikey_of, client_agent_of, decode, horde_of, transaction
from horde_lite.lifecycle import admission, completion, dispatch, lease
from horde_lite.lifecycle import status as status_rules
from horde_lite.lifecycle.inputs import PopInput, SubmitInput, TextRequestInput
from horde_lite.lifecycle.users import authenticate, authenticate_user

Req = Request[Any, Any, Any]


@post("/generate/text/async", status_code=202)
async def create_text_request(request: Req) -> Response[dict[str, Any]]:
    body = await decode(request, TextRequestInput)
    try:
        result, spec = await _admit(request, body)
    except DryRun as quote:
        answer = {"kudos": quote.result.kudos, "max_length": quote.result.max_length}
        if body.chat is not None or quote.result.context_adjustments:
            answer["context_adjustments"] = quote.result.context_adjustments
        return Response(answer, status_code=200)
    answer: dict[str, Any] = {"id": result.request_id, "kudos": result.kudos}
    if result.warnings:
        answer["warnings"] = result.warnings
        answer["message"] = result.warnings[0]["message"]
    if spec.is_chat or result.context_adjustments:
        answer["context_adjustments"] = result.context_adjustments
    return Response(answer, status_code=202)


class DryRun(Exception):
    """Raised inside the admission transaction so a quote is computed like the real request and
    then rolled back: nothing is kept."""

    def __init__(self, result: admission.Admission) -> None:
        self.result = result


async def _admit(request: Req, body: TextRequestInput) -> tuple[admission.Admission, admission.AdmissionSpec]:
    horde = horde_of(request)
    async with transaction(horde) as session:
        requester = await authenticate(session, apikey_of(request), horde.clock.now())
        if body.chat is not None:
            spec = await admission.chat_spec(
                session, horde, requester, body.chat, models=body.models, dry_run=body.dry_run, base=body,
                client_agent=client_agent_of(request),
            )  # fmt: skip
        else:
            spec = admission.legacy_spec(requester, body, horde, client_agent_of(request))
        result = await admission.admit(session, horde, spec)
        if body.dry_run:
            raise DryRun(result)
    return result, spec


@get("/generate/text/status/{request_id:str}")
async def get_status(request: Req, request_id: FromPath[str]) -> dict[str, Any]:
    horde = horde_of(request)
    async with transaction(horde) as session:
        return await status_rules.status(session, horde, request_id)


@delete("/generate/text/status/{request_id:str}", status_code=200)
async def cancel_request(request: Req, request_id: FromPath[str]) -> dict[str, Any]:
    horde = horde_of(request)
    async with transaction(horde) as session:
        await status_rules.cancel(session, horde, request_id)
        return await status_rules.status(session, horde, request_id)


@post("/generate/text/pop", status_code=200)
async def pop_job(request: Req) -> dict[str, Any]:
    horde = horde_of(request)
    body = await decode(request, PopInput)
    async with transaction(horde) as session:
        owner = await authenticate_user(session, apikey_of(request), horde.clock.now())
        worker, job = await dispatch.pop(session, horde, owner, body)
        if job is None:
            return {
                "id": None,
                "ids": [],
                "payload": {},
                "skipped": await dispatch.skipped_reasons(session, horde, worker),
            }
        return dispatch.job_answer(job)


@post("/generate/text/submit", status_code=200)
async def submit_job(request: Req) -> dict[str, Any]:
    horde = horde_of(request)
    body = await decode(request, SubmitInput)
    async with transaction(horde) as session:
        # A lapse found here is kept even though the submit is then refused with AbortedGen.
        await lease.lapse_expired(session, horde, horde.clock.now(), generation_id=body.id)
    async with transaction(horde) as session:
        user = await authenticate_user(session, apikey_of(request), horde.clock.now())
        reward = await completion.submit(session, horde, user, body)
    return {"reward": reward}


HANDLERS = [create_text_request, get_status, cancel_request, pop_job, submit_job]
