"""Column types and SQL constructs that read the same on SQLite and PostgreSQL.

JSON arrays are `jsonb` on PostgreSQL (so `@>` and GIN indexes work) and JSON text on SQLite.
The constructs below compile per dialect with `sqlalchemy.ext.compiler.compiles`, the way
advanced-alchemy compiles its own vector type.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import Boolean

# A flat JSON list of scalars (strings). Keep it flat: the constructs below assume it.
JsonList = JSON().with_variant(JSONB(), "postgresql")
JsonDoc = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")


class TextArrayContainsAll(ColumnElement[bool]):
    """True when every element of `needles` is in `haystack` (both JSON string lists).

    PostgreSQL: `haystack @> needles` on jsonb. SQLite: an anti-join over `json_each`, i.e. no
    element of `needles` is missing from `haystack`. An empty `needles` is contained in anything.
    """

    inherit_cache = True
    type = Boolean()

    def __init__(self, haystack: ColumnElement[Any], needles: ColumnElement[Any]) -> None:
        self.haystack = haystack
        self.needles = needles


class TextArrayHas(ColumnElement[bool]):
    """True when the JSON string list `array` holds the scalar `value`."""

    inherit_cache = True
    type = Boolean()

    def __init__(self, array: ColumnElement[Any], value: ColumnElement[Any]) -> None:
        self.array = array
        self.value = value


@compiles(TextArrayContainsAll, "postgresql")
def _contains_all_pg(element: TextArrayContainsAll, compiler: SQLCompiler, **kw: Any) -> str:
    return f"({compiler.process(element.haystack, **kw)} @> {compiler.process(element.needles, **kw)})"


@compiles(TextArrayContainsAll)
def _contains_all_sqlite(element: TextArrayContainsAll, compiler: SQLCompiler, **kw: Any) -> str:
    haystack = compiler.process(element.haystack, **kw)
    needles = compiler.process(element.needles, **kw)
    return (
        f"(NOT EXISTS (SELECT 1 FROM json_each({needles}) AS needle "
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
    return f"(EXISTS (SELECT 1 FROM json_each({array}) AS item WHERE item.value = {value}))"
