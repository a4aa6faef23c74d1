"""The backend interface every model server module implements, and what it yields.

A backend turns a job's payload into output. Chat output is streamed as `Chunk`s (whether or not
the job streams to a client: the worker accumulates them); legacy text is one `Completion`. Two kinds
of failure are told apart because the worker reacts differently:

- `BackendDown`: the server cannot be reached (connection refused, DNS, connect timeout). The
  worker stops popping until it answers again, rather than faulting job after job.
- `BackendError`: the server answered but failed this job (an HTTP error, a read timeout, a
  malformed stream). The worker faults that job and carries on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol


class BackendDown(Exception):
    """The backend cannot be reached at all."""


class BackendError(Exception):
    """The backend failed one job; the message names the cause."""


@dataclass
class Chunk:
    """A piece of chat output: a content delta and/or tool-call fragments (OpenAI delta shape, with
    `index`); the last chunks carry `finish_reason` and the backend's `usage`."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    usage: dict[str, int] | None = None


@dataclass
class Completion:
    """A legacy job's text, with the backend's `usage` (`prompt_tokens`, `completion_tokens`) when
    it says one."""

    text: str
    usage: dict[str, int] | None = None


@dataclass
class Discovered:
    """What the backend says about itself; None where it says nothing (flags fill the gaps)."""

    models: list[str] = field(default_factory=list)
    context: int | None = None  # tokens of context (prompt + output)
    max_output: int | None = None
    source: str = "flags"  # where the figures came from, for the start-up log line


class Backend(Protocol):
    """One module per kind of model server implements this."""

    kind: str

    async def discover(self, models: list[str]) -> Discovered:
        """Read models and limits from the server (`models`: the ones the operator named)."""
        ...

    async def healthy(self) -> bool:
        """True when the server answers (any HTTP answer counts); False when it is down."""
        ...

    def chat(self, model: str, payload: dict[str, Any]) -> AsyncIterator[Chunk]:
        """Stream a chat completion of the job's payload. Closing the iterator closes the stream."""
        ...

    async def text(self, model: str, payload: dict[str, Any]) -> Completion:
        """One completion of a legacy job's prompt with its Kobold parameters."""
        ...

    async def aclose(self) -> None: ...
