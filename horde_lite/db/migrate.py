"""Schema migrations: one Alembic history for SQLite and PostgreSQL, driven by advanced-alchemy."""

from __future__ import annotations

import asyncio
from pathlib import Path

from advanced_alchemy.alembic.commands import AlembicCommands
from advanced_alchemy.config import AlembicAsyncConfig, SQLAlchemyAsyncConfig
from sqlalchemy import text

from horde_lite.db.engine import make_engine

MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLE = "horde_lite_alembic_version"


def _commands(url: str) -> AlembicCommands:
    config = SQLAlchemyAsyncConfig(
        engine_instance=make_engine(url),
        alembic_config=AlembicAsyncConfig(
            script_location=str(MIGRATIONS),
            version_table_name=VERSION_TABLE,
            render_as_batch=True,
        ),
    )
    return AlembicCommands(sqlalchemy_config=config)


def upgrade(url: str, revision: str = "head") -> None:
    """Apply migrations up to `revision`. Runs its own event loop: call it outside one."""
    _commands(url).upgrade(revision)


def revision(url: str, message: str) -> None:
    """Autogenerate a new revision from the models (a developer command)."""
    _commands(url).revision(message=message, autogenerate=True)


def heads() -> set[str]:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return set(ScriptDirectory.from_config(cfg).get_heads())


async def current(url: str) -> str | None:
    """The database's applied revision, or None for a fresh database."""
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            try:
                row = (await conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))).first()
            except Exception:
                return None
            return row[0] if row else None
    finally:
        await engine.dispose()


def is_behind(url: str) -> bool:
    return asyncio.run(current(url)) not in heads()
