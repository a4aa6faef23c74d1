"""Backends: one module per kind of model server, all implementing `base.Backend`.

Adding a backend is one module with a class like `openai.OpenAIBackend` and one line in `KINDS`.
"""

from __future__ import annotations

from collections.abc import Callable

from horde_lite.worker.backends.base import Backend, BackendDown, BackendError, Chunk, Discovered
from horde_lite.worker.backends.kobold import KoboldBackend
from horde_lite.worker.backends.openai import OpenAIBackend
from horde_lite.worker.backends.simulate import SimulatedBackend

__all__ = ["KINDS", "Backend", "BackendDown", "BackendError", "Chunk", "Discovered", "SimulatedBackend"]

# `--backend-type` -> the class, built from the backend URL and the read timeout.
KINDS: dict[str, Callable[[str, float], Backend]] = {
    "openai": OpenAIBackend,
    "kobold": KoboldBackend,
}
