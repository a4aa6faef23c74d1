"""/generate/text/progress: a streaming chat job's progress posts (docs/reference/chat_requests.md)."""

from __future__ import annotations

from datetime import UTC, datetime

from litestar import post
from litestar.params import JSONBody

from horde_lite.api.address_guard import address_guard
from horde_lite.api.deps import CallerDep, HordeDep
from horde_lite.api.horde.schemas import GenerationProgress, ProgressInput
from horde_lite.jobs import progress


def progress_answer(answer: progress.ProgressAnswer) -> GenerationProgress:
    # ISO 8601 in UTC with a `Z`, e.g. 2025-01-31T12:00:00.250000Z.
    return GenerationProgress(
        lease_expires_at=datetime.fromtimestamp(answer.lease_expires_at, UTC), cancel=answer.cancel
    )


@post("/generate/text/progress", status_code=200, before_request=address_guard)
async def post_progress(
    data: JSONBody[ProgressInput], horde: HordeDep, caller: CallerDep
) -> GenerationProgress:
    return progress_answer(await progress.post(horde, caller, data))


HANDLERS = [post_progress]
