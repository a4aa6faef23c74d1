"""What a generation's webhook says: upstream's body (the generation's details as its status lists
them, plus `request`, `id`, `kudos` and `worker_id` as a string), made when the submit is stored."""

from __future__ import annotations

from typing import Any

import msgspec

from horde_lite.db.models import Generation, TextRequest, Worker
from horde_lite.requests.status import seed_value
from horde_lite.webhooks.delivery import Delivery


class GenerationWebhook(msgspec.Struct, kw_only=True):
    """Upstream's body (a text ProcessingGeneration's details, with the request's id and the
    reward); `chat` is horde_lite's, the chat result a chat job's status lists too."""

    text: str
    seed: int | str | None
    worker_id: str
    worker_name: str
    model: str
    id: str  # the generation's
    state: str  # ok | censored
    gen_metadata: list[Any]
    request: str
    kudos: float  # what the worker earned for it
    chat: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


def delivery(request: TextRequest, generation: Generation, worker: Worker, reward: float) -> Delivery | None:
    """The webhook of a stored submit (None: its request named none)."""
    if not request.webhook:
        return None
    body = GenerationWebhook(
        text=generation.text or "",
        seed=None if generation.seed is None else seed_value(generation.seed),
        worker_id=str(worker.id),
        worker_name=worker.name,
        model=generation.model,
        id=generation.id,
        state=generation.state,
        gen_metadata=generation.gen_metadata or [],
        request=request.id,
        kudos=reward,
        chat=generation.chat_result if generation.chat_result is not None else msgspec.UNSET,
    )
    return Delivery(request.webhook, msgspec.json.encode(body), request.id, generation.id)
