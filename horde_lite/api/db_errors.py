"""Which database errors mean "the database is unavailable" (a 503 the client may retry) rather than
a bug (a 500): a connection lost or refused, the server shutting down or out of connections, the
pool exhausted, SQLite still locked after its busy timeout."""

from __future__ import annotations

import asyncpg
from sqlalchemy import exc as sa_exc

# Raised unwrapped by the drivers when a connection cannot be opened: SQLAlchemy wraps only errors
# of the DB-API it adapts, and asyncpg's connect raises its own errors and OSError (refused, timed out).
DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.InterfaceError,
)

# SQLSTATE classes of an unusable connection: 08 connection exception, 57P operator intervention
# (pg_terminate_backend, shutdown, "cannot connect now"), 53 insufficient resources (too many
# connections, disk full, out of memory).
UNAVAILABLE_SQLSTATES = ("08", "57P", "53")
# sqlite3 messages of a database it cannot use right now.
SQLITE_UNAVAILABLE = ("database is locked", "database table is locked", "unable to open database", "disk i/o")


def database_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, sa_exc.TimeoutError):  # no pooled connection came free in time
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated or isinstance(exc, sa_exc.InterfaceError):
            return True
        orig = exc.orig
        sqlstate = str(getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or "")
        if sqlstate.startswith(UNAVAILABLE_SQLSTATES):
            return True
        if isinstance(orig, DRIVER_ERRORS):
            return True
        message = str(orig).lower()
        return isinstance(exc, sa_exc.OperationalError) and any(m in message for m in SQLITE_UNAVAILABLE)
    return isinstance(exc, DRIVER_ERRORS)
