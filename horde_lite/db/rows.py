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

from sqlalchemy import (
    Executable,
    Insert,
    Table,
    TextClause,
    TextualSelect,
    Update,
    bindparam,
    insert,
    inspect,
    text,
    update,
)
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


async def insert_rows(session: AsyncSession, rows: Iterable[Base], *, after: After | None = None) -> None:
    """Insert `rows` in the order their tables first appear, the rows of a table given the same
    columns together (`write_rows`: one statement on PostgreSQL, else an executemany each), then
    send `after`."""
    batches: dict[tuple[Table, frozenset[str]], list[Write]] = {}
    for row in rows:
        write = Write(cast(Table, row.__table__), values_of(row))
        batches.setdefault((write.table, frozenset(write.values)), []).append(write)
    await write_rows(session, [write for batch in batches.values() for write in batch], after=after)


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
    in the row with that primary key, or, given `adds`, an insert that adds those columns' values
    to the stored row's instead when a row with its primary key exists."""

    table: Table
    values: dict[str, Any]
    key: Any = None  # None: an insert (no primary key is NULL)
    adds: tuple[str, ...] = ()  # an insert's columns added up on a conflict of primary keys

    def shape(self) -> tuple[Table, frozenset[str], bool, tuple[str, ...]]:
        return self.table, frozenset(self.values), self.key is not None, self.adds


def _adding(table: Table, columns: frozenset[str], adds: tuple[str, ...], prefix: str) -> TextClause:
    """INSERT ... ON CONFLICT (primary key) DO UPDATE SET c = c + excluded.c for each of `adds`, as
    text both databases take as written: SQLAlchemy's dialect constructs for it have no cache key,
    so they would be compiled again at every execution. Its parameters carry the columns' types."""
    names = sorted(columns)
    key = ", ".join(c.name for c in table.primary_key.columns)
    added = ", ".join(f"{c} = {table.name}.{c} + excluded.{c}" for c in adds)
    params = ", ".join(f":{prefix}_{c}" for c in names)
    sql = (
        f"INSERT INTO {table.name} ({', '.join(names)}) VALUES ({params}) "
        f"ON CONFLICT ({key}) DO UPDATE SET {added}"
    )
    return text(sql).bindparams(*(bindparam(f"{prefix}_{c}", type_=table.c[c].type) for c in names))


@cache
def _adding_of(table: Table, columns: frozenset[str], adds: tuple[str, ...]) -> TextClause:
    """One adding insert per table, columns and columns added (`write_rows`), built once."""
    return _adding(table, columns, adds, "v")


def _statement(table: Table, columns: frozenset[str], updates: bool, prefix: str) -> Insert | Update:
    """INSERT into `table` of `columns`, or UPDATE of them by primary key, its parameters named
    `prefix`_column and `prefix`_pk."""
    values = {table.c[c]: bindparam(f"{prefix}_{c}", type_=table.c[c].type) for c in sorted(columns)}
    if not updates:
        return insert(table).values(values)
    [key] = table.primary_key.columns
    return update(table).where(key == bindparam(f"{prefix}_pk", type_=key.type)).values(values)


@dataclass(frozen=True, slots=True)
class After:
    """A statement that reads nothing back, sent after a step's writes (`write_rows`); on
    PostgreSQL the one statement they are CTEs of (the jobs' NOTIFY: core/notify.py)."""

    statement: TextualSelect  # built once: its text is part of the combined statement's cache key
    params: dict[str, Any]


# The most writes sent as one statement: each sequence of shapes is a statement text of its own,
# which asyncpg prepares anew and caches beside the hot path's statements. Each row is a part of its
# own: SQLAlchemy gives a multi-row VALUES no cache key, so it would be compiled at every execution.
WRITES_TOGETHER = 12
_Shape = tuple[Table, frozenset[str], bool, tuple[str, ...]]


@cache
def _together(shapes: tuple[_Shape, ...], after: TextualSelect | None) -> Executable:
    """Several rows' writes as one statement on PostgreSQL (`write_rows`), built once per sequence
    of shapes: `after`, or else the last plain INSERT or UPDATE, the statement, every other write a
    data-modifying CTE of it (where a write stands in the statement changes nothing: all run as one
    statement)."""
    main = -1 if after is not None else max(i for i, (*_, adds) in enumerate(shapes) if not adds)
    ctes = []
    for i, (table, columns, updates, adds) in enumerate(shapes):
        if i == main:
            continue
        if adds:  # a textual statement as a CTE: it returns nothing and nothing reads it
            ctes.append(_adding(table, columns, adds, f"u{i}").columns().cte(f"u{i}"))
        else:
            ctes.append(_statement(table, columns, updates, f"u{i}").cte(f"u{i}"))
    if after is not None:
        return after.add_cte(*ctes)
    table, columns, updates, _adds = shapes[main]
    return _statement(table, columns, updates, f"u{main}").add_cte(*ctes)


def _given_defaults(write: Write) -> Write:
    """An insert with the Python-side default of each column it was not given, as a flush would
    give it: SQLAlchemy names the parameters of the defaults it adds by column alone, so two parts
    of one statement whose tables have a column of the same name would share one."""
    if write.key is not None:
        return write
    defaults = _python_defaults(write.table)
    # Only scalar and callable defaults exist (SQLAlchemy wraps a callable to take a context).
    values = {key: d.arg(None) if d.is_callable else d.arg for key, d in defaults if key not in write.values}  # type: ignore[attr-defined]
    return Write(write.table, {**values, **write.values}, adds=write.adds) if values else write


@cache
def _python_defaults(table: Table) -> list[tuple[str, Any]]:
    """The columns of `table` with a Python-side default, and the defaults."""
    return [(c.key, c.default) for c in table.columns if c.default is not None]


def _named(prefix: str, values: dict[str, Any]) -> dict[str, Any]:
    return {f"{prefix}_{column}": value for column, value in values.items()}


async def write_rows(session: AsyncSession, writes: Sequence[Write], *, after: After | None = None) -> None:
    """Send `writes` in their order, then `after`; on PostgreSQL as one statement (a round trip
    costs the server more CPU than a statement's Python), each write a data-modifying CTE of it,
    when there are at most `WRITES_TOGETHER` writes and `after` or a plain insert or update to be
    the statement. The rows updated must be locked already (or SQLite's one writer held), and no row
    written twice: the parts of one statement do not see each other's writes (PostgreSQL checks
    foreign keys and runs the after-row triggers these tables have at the statement's end, so a row
    may refer to one inserted beside it). Otherwise each run of writes of one shape is one statement
    (an executemany), and `after` one more."""
    conn = await session.connection()
    if (
        len(writes) + (after is not None) > 1
        and len(writes) <= WRITES_TOGETHER
        and conn.dialect.name == "postgresql"
        and (after is not None or any(not w.adds for w in writes))
    ):
        given = [_given_defaults(w) for w in writes]
        params: dict[str, Any] = {}
        for i, w in enumerate(given):
            params |= _named(f"u{i}", w.values)
            if w.key is not None:
                params[f"u{i}_pk"] = w.key
        if after is not None:
            params |= after.params
        shapes = tuple(w.shape() for w in given)
        await conn.execute(_together(shapes, None if after is None else after.statement), params)
        return
    for shape, group in groupby(writes, Write.shape):
        table, columns, updates, adds = shape
        if adds:
            await conn.execute(_adding_of(table, columns, adds), [_named("v", w.values) for w in group])
        elif updates:
            keyed = [{"v_pk": w.key, **_named("v", w.values)} for w in group]
            await conn.execute(_update_of(table, columns), keyed)
        else:  # the rows of a table given the same columns in one executemany, as `insert_rows`
            await conn.execute(_insert_into(table), [w.values for w in group])
    if after is not None:
        await conn.execute(after.statement, after.params)


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


async def write_all_changes(
    session: AsyncSession, rows: Iterable[tuple[Base, Iterable[str]]], *, first: Sequence[Write] = ()
) -> None:
    """Write `first`, then what of the attributes named changed on each of `rows` (loaded objects,
    each with the attribute keys it may have changed), in their order, with `write_rows`, and tell
    the objects their values are stored. An object with nothing else changed then leaves the session:
    the session still counts it as modified, and at commit would run a whole flush to find nothing
    to write (one with another change stays, and the flush writes that)."""
    found = [(row, found) for row, keys in rows if (found := changes(row, keys)) is not None]
    await write_rows(session, [*first, *(write for _row, (write, _changed) in found)])
    for row, (_write, changed) in found:
        committed(row, changed)
        if not session.is_modified(row):
            session.expunge(row)
