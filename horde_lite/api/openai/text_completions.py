"""POST /v1/completions (OpenAI's legacy completions API), answered by a legacy text request on the
same queue, with the same waiting, errors and streaming rules as /v1/chat/completions. Legacy
workers submit their text whole (they post no progress), so a stream sends keep-alives until the
submit and then the whole text in one chunk that carries the finish reason."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post
from litestar.params import JSONBody

from horde_lite.api.address_guard import address_guard
from horde_lite.api.deps import CallerDep, HordeDep
from horde_lite.api.openai import schemas
from horde_lite.api.openai.schemas import CompletionInput, TextCompletion
from horde_lite.api.openai.streaming import Answer, EventStreamOperation, Render, respond
from horde_lite.fronts import text_front
from horde_lite.fronts.waiting import Final


class TextRender(Render):
    """One `text_completion` chunk with the whole text and its finish reason (strict clients
    refuse a null `finish_reason` on completions), then the usage chunk when asked."""

    def closing(self, final: Final) -> list[dict[str, Any]]:
        front = self.front
        choice = schemas.text_choice(final.text, final.finish_reason)
        extra = {"context_adjustments": front.context_adjustments, "kudos": final.kudos}
        return [schemas.chunk(front, [choice], include_usage=self.include_usage, **extra)]


TEXT = Answer(whole=schemas.text_completion, render=TextRender)


@post("/completions", status_code=200, operation_class=EventStreamOperation, before_request=address_guard)
async def completions(
    request: Request[Any, Any, Any], data: JSONBody[CompletionInput], horde: HordeDep, caller: CallerDep
) -> Response[TextCompletion]:
    """A text completion of a prompt (OpenAI's completions API), made by a legacy text request."""
    body = schemas.to_text_request(data)
    front = await text_front.create(horde, caller, body, stream=bool(data.stream))
    return await respond(request, horde, front, TEXT, include_usage=schemas.wants_usage(data.stream_options))


HANDLERS = [completions]
