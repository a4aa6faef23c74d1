"""Idle answers remembered: a process answers a known worker's idle poll again from memory, with no
statement and no connection, while nothing that could give the worker a job has happened.

Most of a big horde's pops are idle workers polling. The look (jobs/dispatch.py) answers one in a
statement; the answer it gives when the worker's first page is empty, nothing is to be written
and no message waits is remembered under what decides it (the worker's key, the pop's address,
its whole body) until the first of:

- jobs arrive for one of its models, or for any model: a request admitted or a job given back, in
  this process (at commit) or in another (its NOTIFY): the waiting pops' own wake-ups;
- this process applies a switch of the horde's policies or modes;
- the worker's check-in falls due: that pop goes to the database and writes it on time;
- `[pops] idle_answer_seconds` pass. What no wake-up announces (a pause, a deletion, a flag, a
  new message, a capable worker going offline for the speed gate, the `skipped` counts) reaches
  the worker at most that much later, as an empty answer where something else was due: never a
  job lost or handed twice, since a job is only ever handed out by the database's claim.

Only while something tells this process of other processes' new jobs, without a break since the
answer was read: its LISTEN connection (PostgreSQL), or else the waiting pops' watcher, which reads
the change log every `[pops] wait_poll_seconds` (SQLite, whose processes may share a file;
PostgreSQL while its listener is down or through PgBouncer without `listen_url`). What the watcher
tells reaches the answers that much later; this process's own commits end them at once. A wake-up
that comes while the look's statement runs makes its answer stale before it is first used: the
mark is taken before the statement (`mark`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from horde_lite.jobs.dispatch import Popped
    from horde_lite.policies.protocols import PopCheck

# What decides an idle answer (`key_of`): a digest of the key, the pop's address and its body.
Key = bytes
# A pop declaring more models is not remembered: a mark holds its models, and memory stays bounded
# per answer whatever a body declares.
MODELS_MOST = 16


def key_of(apikey: str | None, address: str | None, body: bytes) -> Key:
    """`body`: the pop's body as JSON (all of it decides the answer)."""
    return hashlib.sha256(b"\0".join(((apikey or "").encode(), (address or "").encode(), body))).digest()


@dataclass(frozen=True, slots=True)
class Mark:
    """Where the wake-ups stood before a look read the database."""

    heard: Hashable  # what told this process of other processes' jobs then (`IdleAnswers` `heard`)
    every: int  # wake-ups for any model, and resets
    models: tuple[tuple[str, int], ...]  # wake-ups per model of the pop


@dataclass(frozen=True, slots=True)
class Remembered:
    answer: Popped
    check: PopCheck | None  # what the shadow metrics count for each pop answered (None: nothing)
    mark: Mark
    policies: object  # the policies and modes the look applied: a switch replaces them whole
    modes: object
    since: float  # the look's time: a clock that moved back ends the answer
    until: float


class IdleAnswers:
    """This process's remembered idle answers (held on the `Horde`). `seconds`: the longest one is
    used (0: never); `heard`: what tells this process of other processes' jobs now, as a value that
    changes whenever it may have missed some (the LISTEN connection's generation, or the watcher's),
    else None; `most`: answers held at once (the oldest goes first)."""

    def __init__(self, seconds: float, heard: Callable[[], Hashable | None], most: int = 10_000) -> None:
        self.seconds = seconds
        self._heard = heard
        self._most = most
        self._answers: dict[Key, Remembered] = {}
        self._every = 0
        self._models: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._answers)

    def jobs_arrived(self, models: Iterable[str]) -> None:
        """Jobs for `models` (none: any model) may be taken now: answers for them are stale."""
        named = tuple(models)
        if not named or len(self._models) + len(named) > self._most:
            self._every += 1  # a bounded count per model: past it, one reset ends every answer
            self._models.clear()
            return
        for model in named:
            self._models[model] = self._models.get(model, 0) + 1

    def mark(self, models: Iterable[str]) -> Mark | None:
        """Before a look's statement; None: nothing may be remembered now."""
        named = sorted(set(models))
        if self.seconds <= 0 or len(named) > MODELS_MOST:
            return None
        heard = self._heard()
        if heard is None:
            return None
        return Mark(heard, self._every, tuple((m, self._models.get(m, 0)) for m in named))

    def remember(self, key: Key, remembered: Remembered) -> None:
        if self._answers.pop(key, None) is None and len(self._answers) >= self._most:
            del self._answers[next(iter(self._answers))]
        self._answers[key] = remembered

    def until(self, now: float, due: float) -> float:
        """When an answer read at `now` ends, its worker's check-in falling due at `due`."""
        return min(due, now + self.seconds)

    def recall(self, key: Key, now: float, policies: object, modes: object) -> Remembered | None:
        """The answer remembered for `key`, if nothing has made it stale."""
        found = self._answers.get(key)
        if found is None:
            return None
        if self._fresh(found, now, policies, modes):
            return found
        del self._answers[key]
        return None

    def _fresh(self, found: Remembered, now: float, policies: object, modes: object) -> bool:
        mark = found.mark
        return (
            found.since <= now < found.until
            and found.policies is policies
            and found.modes is modes
            and mark.every == self._every
            and mark.heard == self._heard()
            and all(self._models.get(model, 0) == seen for model, seen in mark.models)
        )
