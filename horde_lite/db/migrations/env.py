"""Alembic environment, run through advanced-alchemy's AlembicCommands (see horde_lite/db/migrate.py)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

from alembic import context
from sqlalchemy import pool
from sqlalchemy.ext.asyncio import AsyncEngine, async_engine_from_config

from horde_lite.db.models import Base

if TYPE_CHECKING:
    from advanced_alchemy.alembic.commands import AlembicCommandConfig
    from sqlalchemy.engine import Connection

config: AlembicCommandConfig = context.config  # type: ignore[assignment]


def _include_name(name: str | None, type_: str, parent_names: object) -> bool:
    # The change log is written by triggers, not by the models (horde_lite/db/change_log.py).
    return not (type_ == "table" and name == "change_log")


def _configure(**kwargs: object) -> None:
    context.configure(
        target_metadata=Base.metadata,
        include_name=_include_name,
        compare_type=config.compare_type,
        version_table=config.version_table_name,
        render_as_batch=config.render_as_batch,
        user_module_prefix=config.user_module_prefix,
        **kwargs,  # type: ignore[arg-type]
    )


def run_migrations_offline() -> None:
    _configure(url=config.db_url, literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


async def run_migrations_online() -> None:
    configuration = config.get_section(config.config_ini_section) or {}
    configuration["sqlalchemy.url"] = config.db_url
    connectable = cast(
        "AsyncEngine",
        config.engine
        or async_engine_from_config(configuration, prefix="sqlalchemy.", poolclass=pool.NullPool),
    )
    async with connectable.connect() as connection:
        await connection.run_sync(do_run_migrations)
    await connectable.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(run_migrations_online())
