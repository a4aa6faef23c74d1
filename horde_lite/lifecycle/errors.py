"""Refusals raised by the lifecycle. Each face maps them to its own error shape."""

from __future__ import annotations

from typing import Any


class HordeError(Exception):
    """A refusal with an upstream `rc` code and an HTTP status."""

    def __init__(self, status: int, rc: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.rc = rc
        self.message = message
        self.extra = extra
