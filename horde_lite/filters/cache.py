"""Each server process's compiled copy of the filters.

Screening reads the copy, not the database: a process reads the `filters` table again at most
every `[filters] reload_seconds` (by its clock, at the first screening due), and at once after it
changed a filter itself (`invalidate`), so a change reaches every process within that time. A
pattern is compiled once per process and kept while a filter holds it. A read that fails keeps
the copy it had (a process with none yet fails the screening, so the request is refused, never
let through unscreened).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import regex
from sqlalchemy import select

from horde_lite.db.models import PromptFilter
from horde_lite.filters.patterns import Action, action_of, compile_pattern

if TYPE_CHECKING:
    from horde_lite.core.context import Horde

log = logging.getLogger("horde_lite.filters")


@dataclass(frozen=True, slots=True)
class Compiled:
    """One filter as screening applies it."""

    id: int
    filter_type: int
    action: Action
    pattern: regex.Pattern[str]
    description: str | None
    replacement: str


@dataclass(frozen=True, slots=True)
class FilterSet:
    """The filters in force in this process, in id order."""

    blocking: tuple[Compiled, ...] = ()
    replacing: tuple[Compiled, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.blocking or self.replacing)

    def of_type(self, filter_type: int | None) -> FilterSet:
        if filter_type is None:
            return self
        return FilterSet(
            tuple(f for f in self.blocking if f.filter_type == filter_type),
            tuple(f for f in self.replacing if f.filter_type == filter_type),
        )


_READ = select(
    PromptFilter.id, PromptFilter.regex, PromptFilter.filter_type, PromptFilter.description,
    PromptFilter.replacement,
).order_by(PromptFilter.id)  # fmt: skip


class FilterCache:
    """The filters of one process (`Horde.filters`)."""

    def __init__(self) -> None:
        self._set: FilterSet | None = None
        self._fresh_until = float("-inf")
        self._lock: asyncio.Lock | None = None
        self._compiled: dict[str, regex.Pattern[str]] = {}
        self._changes = 0  # this process's changes so far: a read begun before one is stale at once
        self._read_after = 0  # how many of them the copy's read began after

    def invalidate(self) -> None:
        """This process changed a filter: the next screening reads them again."""
        self._changes += 1
        self._fresh_until = float("-inf")

    async def current(self, horde: Horde) -> FilterSet:
        """The filters in force, read again when the copy is older than `reload_seconds`."""
        if self._set is not None and horde.clock.now() < self._fresh_until:
            return self._set
        if self._lock is None:
            self._lock = asyncio.Lock()
        if self._lock.locked() and self._set is not None and self._read_after == self._changes:
            return self._set  # another request is reading them: this one goes on with the copy
        async with self._lock:
            if self._set is None or horde.clock.now() >= self._fresh_until:
                await self._reload(horde)
            assert self._set is not None
            return self._set

    async def _reload(self, horde: Horde) -> None:
        started, changes = horde.clock.now(), self._changes
        try:
            async with horde.reading() as session:
                rows = (await session.execute(_READ)).all()
        except Exception as exc:  # the database may be away
            if self._set is None:
                raise
            log.warning("reading the filters failed, keeping this process's copy: %s", exc)
            self._fresh_until = started + horde.settings.filters.reload_seconds
            return
        self._set = await asyncio.to_thread(self._build, [tuple(r) for r in rows])
        self._read_after = changes
        if changes == self._changes:  # else a change was written meanwhile: read again next time
            self._fresh_until = started + horde.settings.filters.reload_seconds

    def _build(self, rows: list[tuple[int, str, int, str | None, str]]) -> FilterSet:
        compiled: dict[str, regex.Pattern[str]] = {}
        blocking: list[Compiled] = []
        replacing: list[Compiled] = []
        for filter_id, pattern, filter_type, description, replacement in rows:
            found = compiled.get(pattern) or self._compiled.get(pattern)
            if found is None:
                try:
                    found = compile_pattern(pattern)
                except (regex.error, MemoryError, RecursionError, OverflowError, ValueError):
                    # Checked when it was written; a library upgrade could still refuse it.
                    log.error("filter %d's pattern does not compile here; it is not applied", filter_id)
                    continue
            compiled[pattern] = found
            action = action_of(filter_type)
            entry = Compiled(filter_id, filter_type, action, found, description, replacement or "")
            (blocking if action is Action.BLOCK else replacing).append(entry)
        self._compiled = compiled
        return FilterSet(tuple(blocking), tuple(replacing))
