"""The bounds every amount of kudos lies in, as the database enforces them.

Each column below is checked by the database itself (a migration): a CHECK constraint on
PostgreSQL, and on SQLite, which cannot add a constraint to a table without rebuilding it (and
losing its triggers), a pair of BEFORE INSERT / BEFORE UPDATE triggers that abort. Both name
`BOUNDED_MARK`, so the HTTP faces tell a refused amount (a 400) from a database fault. The code
keeps amounts far inside these bounds on its own (prices, the inputs' limits); the database is the
last line, for a path that forgets.
"""

from __future__ import annotations

from typing import NamedTuple

from horde_lite.settings import KUDOS_LIMIT

BOUNDED_MARK = "kudos_bounded"


class Bound(NamedTuple):
    table: str
    column: str
    low: float
    high: float

    @property
    def name(self) -> str:
        """The constraint's (PostgreSQL) or the triggers' stem (SQLite)."""
        return f"{BOUNDED_MARK}_{self.table}_{self.column}"


BOUNDS: tuple[Bound, ...] = (
    Bound("users", "kudos", -KUDOS_LIMIT, KUDOS_LIMIT),
    Bound("kudos_events", "amount", -KUDOS_LIMIT, KUDOS_LIMIT),
    Bound("kudos_holds", "amount", 0.0, KUDOS_LIMIT),
    Bound("kudos_holds", "remaining", 0.0, KUDOS_LIMIT),
    Bound("shared_keys", "kudos", -1.0, KUDOS_LIMIT),
    Bound("shared_keys", "utilized", 0.0, KUDOS_LIMIT),
    Bound("text_requests", "kudos_spent", 0.0, KUDOS_LIMIT),
    Bound("text_requests", "job_price", 0.0, KUDOS_LIMIT),
    Bound("generations", "reward", 0.0, KUDOS_LIMIT),
    Bound("workers", "kudos_earned", 0.0, KUDOS_LIMIT),
)
