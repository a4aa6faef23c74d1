"""Each server process's copy of the live address timeouts, so that checking a caller's address
costs no query: request creation and every worker call ask it (`ip_timeouts.check`).

The copy is indexed by prefix length: for each length some timeout has, the caller's address cut
to that length is looked up in a dict. A check costs one parse of the address and one lookup per
distinct prefix length, whatever the number of timeouts. Expiry is compared at each check with the
horde's clock, so a timeout ends on time between two reloads; a timeout added or lifted in another
process reaches this one at its next reload (`due`), one made here at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from horde_lite.operators.ip_rule import Network, client_ip


@dataclass(frozen=True, slots=True)
class _Index:
    # (IP version, prefix length) -> {the network's address shifted to its prefix: expires_at}
    by_length: dict[tuple[int, int], dict[int, float]] = field(default_factory=dict)

    @classmethod
    def of(cls, rows: Iterable[tuple[Network, float]]) -> _Index:
        by_length: dict[tuple[int, int], dict[int, float]] = {}
        for network, expires_at in rows:
            key = int(network.network_address) >> (network.max_prefixlen - network.prefixlen)
            table = by_length.setdefault((network.version, network.prefixlen), {})
            table[key] = max(expires_at, table.get(key, expires_at))
        return cls(by_length)


class LiveTimeouts:
    """The live timeouts as this process last read them, and when to read them again. A read takes
    a ticket when it starts, and a copy older than the one installed is dropped: a poll that began
    before a moderator's change and ends after the change's own read must not undo it."""

    def __init__(self) -> None:
        self._index = _Index()
        self._next_read = 0.0  # time.monotonic(); 0: never read, the first check reads
        self._tickets = 0
        self._installed = 0
        self.loading: asyncio.Task[None] | None = None  # the poll under way, if any

    @property
    def loaded(self) -> bool:
        return self._installed > 0

    def due(self) -> bool:
        return time.monotonic() >= self._next_read

    def begin(self, every: float) -> int:
        """A read starts: the next one is due in `every` seconds; its ticket."""
        self._next_read = time.monotonic() + every
        self._tickets += 1
        return self._tickets

    def replace(self, ticket: int, rows: Iterable[tuple[Network, float]]) -> None:
        """Install the copy read under `ticket` (one assignment: a check running holds whichever
        copy it read), unless a read that started later was installed first."""
        if ticket > self._installed:
            self._index, self._installed = _Index.of(rows), ticket

    def __len__(self) -> int:
        return sum(len(table) for table in self._index.by_length.values())

    def seconds_left(self, address: str, now: float) -> float:
        """How long the longest live timeout covering `address` still runs; 0 when none does."""
        by_length = self._index.by_length
        if not by_length:
            return 0.0
        ip = client_ip(address)
        if ip is None:
            return 0.0
        value, bits, version = int(ip), ip.max_prefixlen, ip.version
        until = 0.0
        for (of_version, length), table in by_length.items():
            if of_version == version:
                until = max(until, table.get(value >> (bits - length), 0.0))
        return max(0.0, until - now)
