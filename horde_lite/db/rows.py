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
        statement = _UPDATES[(table, columns)] = _prefixed(table, columns, "v")
    return statement


async def write_changes(session: AsyncSession, row: Base, keys: Iterable[str]) -> None:
    """Write what of the attributes `keys` changed on `row`, a loaded object, with one Core UPDATE
    by its primary key, and tell the object its values are stored, so the flush at commit has
    nothing of them left to write (the unit of work costs more Python than the statement). The row
    must be locked already (or SQLite's one writer held), as for any read-then-write."""
    table, values, changed = _changes(row, keys)
    if not changed:
        return
    params = {f"v_{column}": value for column, value in values.items()}
    conn = await session.connection()
    await conn.execute(_update_of(table, frozenset(values) - {"pk"}), params)
    for key, value in changed.items():
        set_committed_value(row, key, value)


# Several rows' changes in one statement on PostgreSQL (`write_all_changes`), built once per
# sequence of (table, columns written): each UPDATE but the last a data-modifying CTE of the last.
_UPDATES_TOGETHER: dict[tuple[tuple[Table, frozenset[str]], ...], Update] = {}


def _prefixed(table: Table, columns: frozenset[str], prefix: str) -> Update:
    """UPDATE `table` SET `columns` by primary key, its parameters named `prefix`_column and
    `prefix`_pk."""
    [key] = table.primary_key.columns
    values = {table.c[c]: bindparam(f"{prefix}_{c}", type_=table.c[c].type) for c in sorted(columns)}
    return update(table).where(key == bindparam(f"{prefix}_pk", type_=key.type)).values(values)


def _updates_together(shapes: tuple[tuple[Table, frozenset[str]], ...]) -> Update:
    statement = _UPDATES_TOGETHER.get(shapes)
    if statement is None:
        *first, last = (_prefixed(table, columns, f"u{i}") for i, (table, columns) in enumerate(shapes))
        statement = last.add_cte(*(u.cte(f"u{i}") for i, u in enumerate(first)))
        _UPDATES_TOGETHER[shapes] = statement
    return statement


def _changes(row: Base, keys: Iterable[str]) -> tuple[Table, dict[str, Any], dict[str, Any]]:
    """`row`'s table, its primary key's value and what of `keys` changed, by column key, with the
    changed values by attribute key."""
    changed = {key: getattr(row, key) for key in keys if get_history(row, key).has_changes()}
    state = inspect(row)
    [identity] = state.identity or (None,)
    by_column = {state.mapper.get_property(key).columns[0].key: value for key, value in changed.items()}  # type: ignore[attr-defined]
    return cast(Table, row.__table__), {"pk": identity, **by_column}, changed


async def write_all_changes(session: AsyncSession, changes: Iterable[tuple[Base, Iterable[str]]]) -> None:
    """`write_changes` of several rows, in their order; on PostgreSQL one statement (one round trip,
    which costs the server more CPU than the statement's Python) whose UPDATEs are data-modifying
    CTEs. Every row must be locked already, and no row given twice: the parts of one statement do
    not see each other's writes, so they must not depend on one another (PostgreSQL's triggers on
    these tables run after the row is written and read only the new row)."""
    if session.get_bind().dialect.name != "postgresql":
        for row, keys in changes:
            await write_changes(session, row, keys)
        return
    written = [(row, *_changes(row, keys)) for row, keys in changes]
    written = [w for w in written if w[3]]
    if not written:
        return
    shapes = tuple((table, frozenset(values) - {"pk"}) for _row, table, values, _changed in written)
    params = {f"u{i}_{column}": value for i, (_row, _t, values, _c) in enumerate(written)
              for column, value in values.items()}  # fmt: skip
    conn = await session.connection()
    await conn.execute(_updates_together(shapes), params)
    for row, _table, _values, changed in written:
        for key, value in changed.items():
            set_committed_value(row, key, value)
