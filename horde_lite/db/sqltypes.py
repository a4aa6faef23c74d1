"""Column types and SQL constructs that read the same on SQLite and PostgreSQL.

JSON arrays are `jsonb` on PostgreSQL (so `@>` and GIN indexes work) and JSON text on SQLite.
The constructs below compile per dialect with `sqlalchemy.ext.compiler.compiles`, the way
advanced-alchemy compiles its own vector type.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, String
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal
from sqlalchemy.types import Boolean

# A flat JSON list of scalars (strings). Keep it flat: the constructs below assume it.
JsonList = JSON().with_variant(JSONB(), "postgresql")
JsonDoc = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")
# A list of strings bound as one parameter (see `OneOf`): an array on PostgreSQL, JSON on SQLite.
TextList = JSON().with_variant(ARRAY(String()), "postgresql")


class OneOf(ColumnElement[bool]):
    """True when `column` equals one of the strings of `values`, a list bound as one parameter
    (`TextList`), where `IN` would bind one parameter per string.

    One statement text and one prepared statement serve every length of the list. And PostgreSQL's
    generic plan (chosen after five runs of a prepared statement) answers the semi-join on the
    unnested list (below) with lookups of the values or one hash of them, where with
    `IN ($1, ..., $n)` it rebuilt the list for every row it read and tested each row against all
    of it, a cost that grew with the queue (bench/README.md has the figures)."""

    inherit_cache = True
    # What the statement cache keys on (see TextArrayHas).
    _traverse_internals = [
        ("column", InternalTraversal.dp_clauseelement),
        ("values", InternalTraversal.dp_clauseelement),
    ]
    type = Boolean()

    def __init__(self, column: ColumnElement[Any], values: ColumnElement[Any]) -> None:
        self.column = column
        self.values = values


class TextArrayContainsAll(ColumnElement[bool]):
    """True when every element of `needles` is in `haystack` (both JSON string lists).

    PostgreSQL: `haystack @> needles` on jsonb. SQLite: an anti-join over `json_each`, i.e. no
    element of `needles` is missing from `haystack`. An empty `needles` is contained in anything.
    """

    inherit_cache = True
    # What the statement cache keys on: without it SQLAlchemy cannot cache any statement holding
    # this construct, and recompiles every pop and wait estimate from scratch.
    _traverse_internals = [
        ("haystack", InternalTraversal.dp_clauseelement),
        ("needles", InternalTraversal.dp_clauseelement),
    ]
    type = Boolean()

    def __init__(self, haystack: ColumnElement[Any], needles: ColumnElement[Any]) -> None:
        self.haystack = haystack
        self.needles = needles


class TextArrayHas(ColumnElement[bool]):
    """True when the JSON string list `array` holds the scalar `value`."""

    inherit_cache = True
    # What the statement cache keys on: without it SQLAlchemy cannot cache any statement holding
    # this construct, and recompiles every pop and wait estimate from scratch.
    _traverse_internals = [
        ("array", InternalTraversal.dp_clauseelement),
        ("value", InternalTraversal.dp_clauseelement),
    ]
    type = Boolean()

    def __init__(self, array: ColumnElement[Any], value: ColumnElement[Any]) -> None:
        self.array = array
        self.value = value


class TextArraysOverlap(ColumnElement[bool]):
    """True when the JSON string lists `left` and `right` share an element (row-local: no table
    access, so a planner cannot turn it into a hashed subplan over a whole link table)."""

    inherit_cache = True
    # What the statement cache keys on: without it SQLAlchemy cannot cache any statement holding
    # this construct, and recompiles every pop and wait estimate from scratch.
    _traverse_internals = [
        ("left", InternalTraversal.dp_clauseelement),
        ("right", InternalTraversal.dp_clauseelement),
    ]
    type = Boolean()

    def __init__(self, left: ColumnElement[Any], right: ColumnElement[Any]) -> None:
        self.left = left
        self.right = right


@compiles(TextArrayContainsAll, "postgresql")
def _contains_all_pg(element: TextArrayContainsAll, compiler: SQLCompiler, **kw: Any) -> str:
    return f"({compiler.process(element.haystack, **kw)} @> {compiler.process(element.needles, **kw)})"


@compiles(TextArrayContainsAll)
def _contains_all_sqlite(element: TextArrayContainsAll, compiler: SQLCompiler, **kw: Any) -> str:
    haystack = compiler.process(element.haystack, **kw)
    needles = compiler.process(element.needles, **kw)
    # json_array_length first: a scalar call, where json_each is a table scan set up per row, and
    # most rows ask for nothing (no features, no transports).
    return (
        f"(json_array_length({needles}) = 0 OR NOT EXISTS (SELECT 1 FROM json_each({needles}) AS needle "
        f"WHERE needle.value NOT IN (SELECT hay.value FROM json_each({haystack}) AS hay)))"
    )


@compiles(TextArrayHas, "postgresql")
def _has_pg(element: TextArrayHas, compiler: SQLCompiler, **kw: Any) -> str:
    return (
        f"({compiler.process(element.array, **kw)} ? CAST({compiler.process(element.value, **kw)} AS TEXT))"
    )


@compiles(TextArrayHas)
def _has_sqlite(element: TextArrayHas, compiler: SQLCompiler, **kw: Any) -> str:
    array = compiler.process(element.array, **kw)
    value = compiler.process(element.value, **kw)
    # An empty list (no allow-list, no deny-list: nearly every request) is answered without a scan.
    return (
        f"(json_array_length({array}) > 0 AND "
        f"EXISTS (SELECT 1 FROM json_each({array}) AS item WHERE item.value = {value}))"
    )


@compiles(TextArraysOverlap, "postgresql")
def _overlap_pg(element: TextArraysOverlap, compiler: SQLCompiler, **kw: Any) -> str:
    left = compiler.process(element.left, **kw)
    right = compiler.process(element.right, **kw)
    return f"({left} ?| ARRAY(SELECT jsonb_array_elements_text({right})))"


@compiles(TextArraysOverlap)
def _overlap_sqlite(element: TextArraysOverlap, compiler: SQLCompiler, **kw: Any) -> str:
    left = compiler.process(element.left, **kw)
    right = compiler.process(element.right, **kw)
    return (
        f"(EXISTS (SELECT 1 FROM json_each({left}) AS overlap_left, json_each({right}) AS overlap_right "
        f"WHERE overlap_left.value = overlap_right.value))"
    )


@compiles(OneOf, "postgresql")
def _one_of_pg(element: OneOf, compiler: SQLCompiler, **kw: Any) -> str:
    # A semi-join against the unnested list, not `= ANY($1)`: planned as lookups of the values in
    # the column's index even in a generic plan, which tested `= ANY` against every row of
    # another index's range.
    column = compiler.process(element.column, **kw)
    return f"({column} IN (SELECT unnest({compiler.process(element.values, **kw)})))"


@compiles(OneOf)
def _one_of_sqlite(element: OneOf, compiler: SQLCompiler, **kw: Any) -> str:
    column = compiler.process(element.column, **kw)
    return f"({column} IN (SELECT value FROM json_each({compiler.process(element.values, **kw)})))"
