"""The shared counts behind the rate limits (api/ratelimit.py): every server process and host of a
horde counts in the same place, in one atomic call per counted request, so a limit holds whatever
the number of processes.

A window is fixed and begins with a key's first call, as in Litestar's own middleware. In the
database it is one upsert that starts a new window or adds to the current one and says where the
count stands (the same statement on SQLite and PostgreSQL); in Redis it is INCR with EXPIRE NX in
one MULTI. Neither reads before it writes, so two processes can never both take the last call.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from sqlalchemy import text

from horde_lite.api.errors import DATABASE_RETRY_AFTER
from horde_lite.core.errors import HordeError
from horde_lite.db.engine import connect_to_read
from horde_lite.rc import Rc

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from horde_lite.core.context import Horde

log = logging.getLogger("horde_lite.ratelimit")

# Starts a new window when the key's has ended, else counts one more call in it. In an upsert's SET
# every column reads the row as it was, on both databases, so the two CASEs agree.
_HIT = text(
    "INSERT INTO rate_counts (key, window_end, hits) VALUES (:key, :window_end, 1)"
    " ON CONFLICT (key) DO UPDATE SET"
    " hits = CASE WHEN rate_counts.window_end <= :now THEN 1 ELSE rate_counts.hits + 1 END,"
    " window_end = CASE WHEN rate_counts.window_end <= :now"
    " THEN excluded.window_end ELSE rate_counts.window_end END"
    " RETURNING hits, window_end"
)
# At most `batch` rows whose window has ended: a purge never holds the database for long, however
# many one-off callers came by.
_PURGE = text(
    "DELETE FROM rate_counts WHERE key IN (SELECT key FROM rate_counts WHERE window_end <= :now LIMIT :batch)"
)
# Each process purges this often (the horde's clock), and at once again while a purge finds a full batch.
PURGE_SECONDS = 300.0
PURGE_BATCH = 5000

# A Redis that does not answer within this holds a counted call no longer.
REDIS_TIMEOUT_SECONDS = 2.0


class SharedCounts(Protocol):
    async def hit(self, key: str, seconds: int) -> tuple[int, float]:
        """Count one call under `key` in a window of `seconds` that begins with the key's first
        call: the calls counted in the window (this one included) and the seconds until it ends."""
        ...


class DatabaseCounts:
    """Counts in the horde's `rate_counts` table outside any request's transaction: on PostgreSQL
    one autocommitted statement, on SQLite a short transaction in the process's turn to write."""

    def __init__(self) -> None:
        self._horde: Horde | None = None
        self._next_purge = 0.0

    def bind(self, horde: Horde) -> None:
        """The running horde whose database counts (the app's start-up: the engine is made then)."""
        self._horde = horde

    async def hit(self, key: str, seconds: int) -> tuple[int, float]:
        horde = self._horde
        if horde is None:
            raise RuntimeError("DatabaseCounts used before the app started")
        now = horde.clock.now()
        values = {"key": key, "window_end": now + seconds, "now": now}
        if horde.engine.dialect.name == "postgresql":
            # One statement is atomic on its own: in autocommit it costs one round trip, not a
            # BEGIN and a COMMIT besides.
            async with connect_to_read(horde.engine) as conn:
                hits, window_end = (await conn.execute(_HIT, values)).one()
        else:  # SQLite: in the process's turn to write, as every write there
            async with horde.transaction() as session:
                hits, window_end = (await session.execute(_HIT, values)).one()
        if now >= self._next_purge:
            await self.purge(horde, now)
        return hits, window_end - now

    async def purge(self, horde: Horde, now: float) -> int:
        """Delete one batch of counts whose window has ended; how many went."""
        self._next_purge = now + PURGE_SECONDS
        try:
            async with horde.transaction() as session:
                deleted = (await session.execute(_PURGE, {"now": now, "batch": PURGE_BATCH})).rowcount
        except Exception as exc:  # the call was counted; the next purge takes these rows
            log.warning("rate count purge failed: %s", exc)
            return 0
        if deleted >= PURGE_BATCH:
            self._next_purge = now
        return deleted


def redis_client(url: str) -> Redis:
    """A client of the Redis at `url` (connected at its first command)."""
    from redis.asyncio import Redis

    timeout = REDIS_TIMEOUT_SECONDS
    return Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)


class RedisCounts:
    """Counts in Redis under `<namespace>:<key>`, each key expiring when its window ends."""

    def __init__(self, client: Redis, namespace: str) -> None:
        self._client = client
        self._namespace = namespace

    async def hit(self, key: str, seconds: int) -> tuple[int, float]:
        from redis.exceptions import RedisError

        name = f"{self._namespace}:{key}"
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.incr(name).expire(name, seconds, nx=True).pttl(name)
                hits, _, left_ms = await pipe.execute()
        except (RedisError, OSError) as exc:
            # Closed: a call is refused, never let through uncounted, while Redis is away.
            log.warning("rate limit store unavailable (Redis): %s", exc)
            raise HordeError(
                Rc.DatabaseUnavailable,
                "The rate-limit store is unavailable; retry in a few seconds.",
                retry_after=DATABASE_RETRY_AFTER,
            ) from None
        return int(hits), left_ms / 1000 if left_ms > 0 else float(seconds)
