"""Schema migrations: one Alembic history for SQLite and PostgreSQL, driven by advanced-alchemy."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from advanced_alchemy.alembic.commands import AlembicCommands
from advanced_alchemy.config import AlembicAsyncConfig, SQLAlchemyAsyncConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from horde_lite.db.engine import connect_to_read, make_engine

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLE = "horde_lite_alembic_version"
# Alembic says each migration it runs (and its context) on this logger at INFO.
ALEMBIC_LOGGER = "alembic.runtime.migration"


def _commands(url: str, pgbouncer: bool = False) -> AlembicCommands:
    config = SQLAlchemyAsyncConfig(
        engine_instance=make_engine(url, pgbouncer=pgbouncer),
        alembic_config=AlembicAsyncConfig(
            script_location=str(MIGRATIONS),
            version_table_name=VERSION_TABLE,
            render_as_batch=True,
        ),
    )
    return AlembicCommands(sqlalchemy_config=config)


def upgrade(url: str, revision: str = "head", *, pgbouncer: bool = False) -> None:
    """Apply migrations up to `revision`. Runs its own event loop: call it outside one. Each
    migration runs in one transaction, so PgBouncer's transaction mode (`pgbouncer`) serves it."""
    _commands(url, pgbouncer).upgrade(revision)


def revision(url: str, message: str) -> None:
    """Autogenerate a new revision from the models (a developer command)."""
    _commands(url, False).revision(message=message, autogenerate=True)


@functools.cache
def heads() -> frozenset[str]:
    """The code's newest revisions (one, while the history stays linear). Alembic compiles every
    migration script to find them, and they are the installed code's, so a process asks once."""
    return frozenset(ScriptDirectory(str(MIGRATIONS)).get_heads())


async def current(url: str, *, pgbouncer: bool = False) -> str | None:
    """The database's applied revision, or None for a fresh database (no version table yet). Read
    by Alembic's MigrationContext outside any transaction, so on SQLite the check takes no write
    lock and waits for no writer."""
    engine = make_engine(url, null_pool=True, pgbouncer=pgbouncer)
    try:
        async with connect_to_read(engine) as conn:
            applied = await conn.run_sync(_applied)
    finally:
        await engine.dispose()
    return applied[0] if applied else None


def _applied(connection: Connection) -> tuple[str, ...]:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_heads()


def is_behind(url: str, *, pgbouncer: bool = False) -> bool:
    return asyncio.run(current(url, pgbouncer=pgbouncer)) not in heads()


def pending(applied: str | None) -> list[str]:
    """The revisions `upgrade` would apply to a database at `applied` (None: empty), oldest first."""
    scripts = ScriptDirectory(str(MIGRATIONS))
    return [script.revision for script in reversed(list(scripts.iterate_revisions("heads", applied)))]


@contextlib.contextmanager
def alembic_lines(shown: bool) -> Iterator[None]:
    """Alembic's own INFO lines (one per migration, each with its whole message) only when `shown`;
    its warnings and errors always."""
    logger = logging.getLogger(ALEMBIC_LOGGER)
    level = logger.level
    if not shown:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)
