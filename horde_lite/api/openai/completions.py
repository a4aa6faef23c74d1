"""POST /v1/chat/completions: waits for the answer, or streams it as server-sent events
(`horde_lite.api.openai.streaming` holds the waiting and streaming rules both /v1 fronts share)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post
from litestar.params import JSONBody

from horde_lite.api.address_guard import address_guard
from horde_lite.api.deps import CallerDep, HordeDep
from horde_lite.api.openai import schemas
from horde_lite.api.openai.schemas import ChatCompletion, ChatCompletionInput, ChatCompletionQuote
from horde_lite.api.openai.streaming import Answer, EventStreamOperation, Render, respond
from horde_lite.fronts import chat_front
from horde_lite.fronts.waiting import Delta, Final


class ChatRender(Render):
    """The role chunk, one chunk per piece of progress, the rest of the submit, the finish chunk
    and (when asked) the usage chunk."""

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        choice = schemas.chat_choice(delta, finish)
        return schemas.chunk(self.front, [choice], include_usage=self.include_usage, **extra)

    def opening(self) -> list[dict[str, Any]]:
        adjustments = self.front.context_adjustments
        return [self._chunk({"role": "assistant", "content": ""}, context_adjustments=adjustments)]

    def delta(self, delta: Delta) -> list[dict[str, Any]]:
        return [self._chunk(_delta(delta))]

    def closing(self, final: Final) -> list[dict[str, Any]]:
        out = [] if final.remainder is None else [self._chunk(_delta(final.remainder))]
        out.append(self._chunk({}, final.finish_reason, kudos=final.kudos))
        return out


def _delta(delta: Delta) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if delta.content:
        out["content"] = delta.content
    if delta.tool_calls:
        out["tool_calls"] = delta.tool_calls
    return out


CHAT = Answer(whole=schemas.completion, render=ChatRender)


@post(
    "/chat/completions", status_code=200, operation_class=EventStreamOperation, before_request=address_guard
)
async def chat_completions(
    request: Request[Any, Any, Any], data: JSONBody[ChatCompletionInput], horde: HordeDep, caller: CallerDep
) -> Response[ChatCompletion | ChatCompletionQuote]:
    """A chat completion (OpenAI's chat API); `dry_run: true` answers a quote instead."""
    payload = schemas.to_payload(data)
    if data.dry_run:
        quoted = await chat_front.quote(horde, caller, payload, data.model)
        return Response(schemas.quote(quoted))
    front = await chat_front.create(horde, caller, payload, data.model, stream=bool(data.stream))
    return await respond(request, horde, front, CHAT, include_usage=schemas.wants_usage(data.stream_options))


HANDLERS = [chat_completions]
