"""Core writes instead of the unit of work's flush, whose Python costs more than the statements it
sends: inserts of rows built as ORM objects, for rows a transaction writes and never reads back as
objects (a queued request, its records, its hold; the objects stay transient, outside the session);
updates of what changed on loaded objects; and several rows' writes sent as one statement on
PostgreSQL, where each statement is a round trip."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import groupby
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
    """Insert `rows` in the order their tables first appear, the rows of a table given the same
    columns together (`write_rows`: one statement on PostgreSQL, else an executemany each)."""
    batches: dict[tuple[Table, frozenset[str]], list[Write]] = {}
    for row in rows:
        write = Write(cast(Table, row.__table__), values_of(row))
        batches.setdefault((write.table, frozenset(write.values)), []).append(write)
    await write_rows(session, [write for batch in batches.values() for write in batch])


@cache
def _insert_into(table: Table) -> Insert:
    """`insert(table)`, built once per table: a statement built per call pays its cache key."""
    return insert(table)


@cache
def _update_of(table: Table, columns: frozenset[str]) -> Update:
    """One UPDATE by primary key per table and set of columns written (`write_rows`), built once."""
    return _statement(table, columns, True, "v")  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class Write:
    """One row's write: an insert of `values` (by column key), or, given `key`, an update of them
    in the row with that primary key."""

    table: Table
    values: dict[str, Any]
    key: Any = None  # None: an insert (no primary key is NULL)

    def shape(self) -> tuple[Table, frozenset[str], bool]:
        return self.table, frozenset(self.values), self.key is not None


def _statement(
    table: Table, columns: frozenset[str], updates: bool, prefix: str, rows: int = 1
) -> Insert | Update:
    """INSERT into `table` of `columns` (`rows` rows), or UPDATE of them by primary key, its
    parameters named `prefix`_column and `prefix`_pk (an insert of several rows: `prefix`_row_column)."""

    def values(named: str) -> dict[Any, Any]:
        return {table.c[c]: bindparam(f"{named}_{c}", type_=table.c[c].type) for c in sorted(columns)}

    if not updates:
        return insert(table).values(
            values(prefix) if rows == 1 else [values(f"{prefix}_{r}") for r in range(rows)]
        )
    [key] = table.primary_key.columns
    return update(table).where(key == bindparam(f"{prefix}_pk", type_=key.type)).values(values(prefix))


# The most rows of one insert sent as a part of one statement: each number of rows is a statement
# text of its own, which asyncpg prepares anew and caches beside the hot path's statements.
ROWS_TOGETHER = 4
# A part of a statement of several writes: one UPDATE, or an INSERT of consecutive rows of one shape.
_Part = tuple[Table, frozenset[str], bool, int]


@cache
def _together(parts: tuple[_Part, ...]) -> Insert | Update:
    """Several rows' writes as one statement on PostgreSQL (`write_rows`), built once per sequence
    of parts: each part but the last a data-modifying CTE of the last."""
    *first, last = (_statement(t, c, u, f"u{i}", rows) for i, (t, c, u, rows) in enumerate(parts))
    return last.add_cte(*(w.cte(f"u{i}") for i, w in enumerate(first)))


def _given_defaults(write: Write) -> Write:
    """An insert with the Python-side default of each column it was not given, as a flush would
    give it: SQLAlchemy names the parameters of the defaults it adds by column alone, so two parts
    of one statement whose tables have a column of the same name would share one."""
    if write.key is not None:
        return write
    defaults = _python_defaults(write.table)
    # Only scalar and callable defaults exist (SQLAlchemy wraps a callable to take a context).
    values = {key: d.arg(None) if d.is_callable else d.arg for key, d in defaults if key not in write.values}  # type: ignore[attr-defined]
    return Write(write.table, {**values, **write.values}) if values else write


@cache
def _python_defaults(table: Table) -> list[tuple[str, Any]]:
    """The columns of `table` with a Python-side default, and the defaults."""
    return [(c.key, c.default) for c in table.columns if c.default is not None]


def _parts(writes: Sequence[Write]) -> list[list[Write]]:
    """`writes` in parts: each update alone, consecutive inserts of one shape together."""
    parts: list[list[Write]] = []
    for w in writes:
        if parts and w.key is None and parts[-1][0].shape() == w.shape():
            parts[-1].append(w)
        else:
            parts.append([w])
    return parts


async def write_rows(session: AsyncSession, writes: Sequence[Write]) -> None:
    """Send `writes` in their order; on PostgreSQL as one statement (a round trip costs the server
    more CPU than a statement's Python), its parts data-modifying CTEs, when no table is written by
    two of its parts (SQLAlchemy compiles no such statement) and no part inserts more than
    `ROWS_TOGETHER` rows. The rows updated must be locked already (or SQLite's one writer held),
    and no row written twice: the parts of one statement do not see each other's writes
    (PostgreSQL checks foreign keys and runs the after-row triggers these tables have at the
    statement's end, so a row may refer to one inserted beside it)."""
    conn = await session.connection()
    together = len(writes) > 1 and conn.dialect.name == "postgresql"
    parts = _parts([_given_defaults(w) for w in writes] if together else writes)
    tables = [part[0].table for part in parts]
    if (
        together
        and len(parts) > 1
        and len(set(tables)) == len(tables)
        and all(len(part) <= ROWS_TOGETHER for part in parts)
    ):
        params: dict[str, Any] = {}
        for i, part in enumerate(parts):
            for r, w in enumerate(part):
                named = f"u{i}" if len(part) == 1 else f"u{i}_{r}"
                params |= {f"{named}_{column}": value for column, value in w.values.items()}
            if part[0].key is not None:
                params[f"u{i}_pk"] = part[0].key
        await conn.execute(_together(tuple((*part[0].shape(), len(part)) for part in parts)), params)
        return
    for shape, group in groupby(writes, Write.shape):
        table, columns, updates = shape
        if updates:
            keyed = [{"v_pk": w.key, **{f"v_{c}": v for c, v in w.values.items()}} for w in group]
            await conn.execute(_update_of(table, columns), keyed)
        else:  # the rows of a table given the same columns in one executemany, as `insert_rows`
            await conn.execute(_insert_into(table), [w.values for w in group])


def changes(row: Base, keys: Iterable[str]) -> tuple[Write, dict[str, Any]] | None:
    """What of the attributes `keys` changed on `row`, a loaded object: its update, and the changed
    values by attribute key for `committed` (None: nothing changed)."""
    changed = {key: getattr(row, key) for key in keys if get_history(row, key).has_changes()}
    if not changed:
        return None
    state = inspect(row)
    [identity] = state.identity or (None,)
    by_column = {state.mapper.get_property(key).columns[0].key: value for key, value in changed.items()}  # type: ignore[attr-defined]
    return Write(cast(Table, row.__table__), by_column, identity), changed


def committed(row: Base, changed: dict[str, Any]) -> None:
    """Tell `row` its `changed` values are stored: the flush at commit has nothing of them to write."""
    for key, value in changed.items():
        set_committed_value(row, key, value)


async def write_all_changes(session: AsyncSession, rows: Iterable[tuple[Base, Iterable[str]]]) -> None:
    """Write what of the attributes named changed on each of `rows` (loaded objects, each with the
    attribute keys it may have changed), in their order, with `write_rows`, and tell the objects
    their values are stored, so the flush at commit has nothing of them left to write."""
    found = [(row, found) for row, keys in rows if (found := changes(row, keys)) is not None]
    await write_rows(session, [write for _row, (write, _changed) in found])
    for row, (_write, changed) in found:
        committed(row, changed)
