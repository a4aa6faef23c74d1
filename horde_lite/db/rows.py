"""Core inserts of rows built as ORM objects, for rows a transaction writes and never reads back as
objects (a queued request, its records, its hold): the unit of work's flush of such an object costs
more Python than the statement it sends. The objects stay transient, outside the session."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from sqlalchemy import Table, insert, inspect
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.db.models import Base


def values_of(row: Base) -> dict[str, Any]:
    """The column values `row` was given (by column key); columns it was not given take their
    defaults in the insert, as a flush would give them."""
    given = row.__dict__
    return {
        prop.columns[0].key: given[prop.key] for prop in inspect(row).mapper.column_attrs if prop.key in given
    }


async def insert_rows(session: AsyncSession, rows: Iterable[Base]) -> None:
    """Insert `rows` in the order their tables first appear, one statement for the rows of a table
    given the same columns (an executemany)."""
    batches: dict[tuple[Table, frozenset[str]], list[dict[str, Any]]] = {}
    for row in rows:
        values = values_of(row)
        batches.setdefault((cast(Table, row.__table__), frozenset(values)), []).append(values)
    for (table, _columns), values in batches.items():
        await session.execute(insert(table), values if len(values) > 1 else values[0])
