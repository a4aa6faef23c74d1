"""Refusals raised by the lifecycle, named by their upstream `rc` code (`horde_lite.rc.Rc`). Each
face gives a code its own error shape (`horde_lite.api.errors`); the lifecycle knows no HTTP."""

from __future__ import annotations

from typing import Any

from horde_lite.rc import Rc


class HordeError(Exception):
    """A refusal with an upstream `rc` code and a message for the client. `extra` carries what a
    face may show beside it: `param` (the offending field), `errors` (field -> problem),
    `retry_after` (seconds)."""

    def __init__(self, rc: Rc, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.rc = rc
        self.message = message
        self.extra = extra
