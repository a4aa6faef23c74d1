"""Core inserts of rows built as ORM objects, for rows a transaction writes and never reads back as
objects (a queued request, its records, its hold): the unit of work's flush of such an object costs
more Python than the statement it sends. The objects stay transient, outside the session."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from sqlalchemy import Insert, Table, Update, bindparam, insert, inspect, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import get_history, set_committed_value

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
    conn = await session.connection()  # Core: the ORM has nothing to do with these rows
    for (table, _columns), values in batches.items():
        await conn.execute(_insert_into(table), values if len(values) > 1 else values[0])


_INSERTS: dict[Table, Insert] = {}


def _insert_into(table: Table) -> Insert:
    """`insert(table)`, built once per table: a statement built per call pays its cache key."""
    statement = _INSERTS.get(table)
    if statement is None:
        statement = _INSERTS[table] = insert(table)
    return statement


# One UPDATE by primary key per table and set of columns written (`write_changes`), built once.
_UPDATES: dict[tuple[Table, frozenset[str]], Update] = {}


def _update_of(table: Table, columns: frozenset[str]) -> Update:
    statement = _UPDATES.get((table, columns))
    if statement is None:
        [key] = table.primary_key.columns
        values = {table.c[c]: bindparam(f"v_{c}", type_=table.c[c].type) for c in sorted(columns)}
        statement = update(table).where(key == bindparam("v_pk", type_=key.type)).values(values)
        _UPDATES[(table, columns)] = statement
    return statement


async def write_changes(session: AsyncSession, row: Base, keys: Iterable[str]) -> None:
    """Write what of the attributes `keys` changed on `row`, a loaded object, with one Core UPDATE
    by its primary key, and tell the object its values are stored, so the flush at commit has
    nothing of them left to write (the unit of work costs more Python than the statement). The row
    must be locked already (or SQLite's one writer held), as for any read-then-write."""
    changed = {key: getattr(row, key) for key in keys if get_history(row, key).has_changes()}
    if not changed:
        return
    state = inspect(row)
    column_of = {key: state.mapper.get_property(key).columns[0].key for key in changed}  # type: ignore[attr-defined]
    [identity] = state.identity or (None,)
    values = {f"v_{column_of[key]}": value for key, value in changed.items()}
    table = cast(Table, row.__table__)
    conn = await session.connection()
    await conn.execute(_update_of(table, frozenset(column_of.values())), {"v_pk": identity, **values})
    for key, value in changed.items():
        set_committed_value(row, key, value)
