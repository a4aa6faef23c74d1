"""The schema the migrations build is the one the models declare (tables, columns, indexes, keys),
on SQLite and PostgreSQL: a model changed without its migration, or the reverse, fails here."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from horde_lite.db.engine import make_engine
from horde_lite.db.models import Base

# Tables only the migrations know: the change log (its triggers write it; db/change_log.py reads
# it through a table of its own) and Alembic's revision table.
OWN_TABLES = {"change_log", "horde_lite_alembic_version"}


def _ours(diff: Any) -> bool:
    """Whether a difference is about a table the models declare."""
    if isinstance(diff, list):  # column changes come as lists of tuples
        return any(_ours(d) for d in diff)
    for part in diff[1:]:
        table = getattr(part, "table", part)
        name = getattr(table, "name", None)
        if isinstance(name, str) and name in OWN_TABLES:
            return False
    return True


async def test_the_migrated_schema_is_the_models(db_url: str) -> None:
    engine = make_engine(db_url, null_pool=True)
    try:
        async with engine.connect() as conn:
            diff = await conn.run_sync(
                lambda sync: compare_metadata(MigrationContext.configure(sync), Base.metadata)
            )
    finally:
        await engine.dispose()
    assert [d for d in diff if _ours(d)] == []
