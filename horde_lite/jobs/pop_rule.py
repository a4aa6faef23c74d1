"""The pop's choices as pure functions of what it read: how it goes on after its reads outside any
transaction, and what it does with the request its claim found. No database, no clock, no metrics:
`dispatch.look` and `dispatch.pop` read, lock and write around them, with the same statements."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

# What a pop's check-in would write (`workers.check_in_need`).
CheckInNeed = Literal["nothing", "time", "all"]


class PopPath(StrEnum):
    """How a pop goes on after its reads outside any transaction."""

    # In a transaction from its start, owner and worker read again there: a key or name not found
    # (refused there, or a first pop), changed declarations, a paused worker or one in maintenance.
    WHOLE = "whole"
    # Answered from the reads: nothing to write and an empty first page. No transaction at all.
    IDLE = "idle"
    # An empty first page and only the due check-in time (and a moved address) to write: one
    # statement after the reads on PostgreSQL, whose reads autocommit; a transaction on SQLite.
    CHECK_IN = "check_in"
    # A transaction that judges and claims from the page read (stamping the check-in when due).
    CLAIM = "claim"


@dataclass(frozen=True, slots=True)
class Seen:
    """What a pop's reads outside any transaction found, as far as they went."""

    known: bool  # its owner and named worker were found, by key and name
    need: CheckInNeed = "all"
    paused: bool = False
    maintenance: bool = False
    page_rows: int | None = None  # rows on the first page of its part of the queue (None: not read)


def path(seen: Seen) -> PopPath | None:
    """How the pop goes on; None: the first page must be read to say. A paused worker's fake job
    and a worker in maintenance (its owner's requests only) are judged in the transaction, as is
    every declaration the check-in would write."""
    if not seen.known or seen.need == "all" or seen.paused or seen.maintenance:
        return PopPath.WHOLE
    if seen.page_rows is None:
        return None
    if seen.page_rows:
        return PopPath.CLAIM
    return PopPath.CHECK_IN if seen.need == "time" else PopPath.IDLE


def counts_pop(paused: bool) -> bool:
    """The shadow metrics count a pop, once whichever way it is answered, unless its worker is
    paused (its pops serve fake jobs, which no metric records)."""
    return not paused


@dataclass(frozen=True, slots=True)
class Take:
    """What a pop does with the request its claim found."""

    fake: bool  # a paused worker's copy of another user's job: nothing is claimed or recorded
    count: int  # the jobs taken (a fake pop: one)
    left: int | None  # the request's jobs left after this pop (None: a fake pop changes nothing)
    over_capacity: bool  # the request's length is over the worker's capacity

    @property
    def over_capacity_at_assignment(self) -> bool:
        return self.over_capacity and not self.fake

    @property
    def records(self) -> bool:
        """A real pop's jobs are counted, recorded in shadow and announced to the request's waiters."""
        return not self.fake


def take(*, fake: bool, amount: int, n_remaining: int, max_length: int, capacity: int) -> Take:
    """A pop asks for `amount` jobs and takes what the request has left, at least one; a fake pop
    takes one copy and leaves the request as it was."""
    count = 1 if fake else min(amount, n_remaining)
    left = None if fake else n_remaining - count
    return Take(fake=fake, count=count, left=left, over_capacity=max_length > capacity)
