"""What the database's triggers write to the queue's index for a request, stated in Python: the
oracle of `tests/integration/test_queue_triggers.py` (which checks that the installed triggers agree
with it on both databases), of the invariants, and of the tests of older migrations that wrote
entries themselves."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from horde_lite.queue.queue_index import ANY_MODEL, ANY_WORKER, TARGET_ENTRIES, TARGET_LENGTH


def targets(request: Mapping[str, Any], models: int) -> list[str]:
    """The workers the entries of a request asking for `models` models name: those of its
    allow-list when the entries would number at most `TARGET_ENTRIES`, else `ANY_WORKER` alone."""
    allow = sorted(set(request.get("worker_allow") or ())) if request.get("targeted") else []
    if not allow or models * len(allow) > TARGET_ENTRIES or any(len(w) > TARGET_LENGTH for w in allow):
        return [ANY_WORKER]
    return allow


# What makes a request's entries not plain (QueueEntry.plain), besides an allow-list they do not name.
_NOT_PLAIN = ("required_features", "required_transports")


def entry_rows(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The entries of a waiting request with a job to hand out, given as its column values. The
    lengths are what `chat_limits_admit`/`legacy_limits_admit` compare with a worker's."""
    chat = bool(request["is_chat"])
    need_context = (
        request.get("prompt_tokens", 0) + request["max_length"] if chat else request["max_context_length"]
    )
    common = {
        "request_id": request["id"],
        "effective_start": request["effective_start"],
        "created_at": request["created_at"],
        "is_chat": chat,
        "need_length": request["max_length"],
        "need_context": need_context,
        "nsfw": bool(request.get("nsfw", False)),
        "trusted_workers": bool(request.get("trusted_workers", False)),
        "slow_workers": bool(request.get("slow_workers", True)),
    }
    models = [ANY_MODEL] if request.get("any_model", True) else sorted(set(request["models"]))
    named = targets(request, len(models))
    common["plain"] = not any(request.get(c) for c in _NOT_PLAIN) and (
        not request.get("targeted") or named != [ANY_WORKER]
    )
    return [{**common, "model": m, "target": t} for m in models for t in named]


def has_entries(request: Mapping[str, Any]) -> bool:
    """Only a request waiting with a job to hand out is in the index."""
    return request.get("state", "waiting") == "waiting" and request.get("n_remaining", 1) > 0


def refusal_rows(request_id: str, workers: Iterable[str]) -> list[dict[str, Any]]:
    """The refusals of a request naming `workers`; a name longer than a worker id refuses no worker."""
    return [
        {"request_id": request_id, "worker_id": w} for w in sorted(set(workers)) if len(w) <= TARGET_LENGTH
    ]
