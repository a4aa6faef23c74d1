"""The filters as moderators read and change them: PUT, GET, PATCH and DELETE /api/v2/filters and
the dashboard's filters panel. A pattern is checked (patterns.check) before anything is written,
outside any transaction (the check runs a child process); writes on PostgreSQL take one advisory
lock, so the count bound and the one-filter-per-pattern-and-type rule hold under concurrent
changes (SQLite has one writer already). This process's copy is read again at once after a change;
the other processes' within `[filters] reload_seconds`."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.accounts.users import display_name, user_id_part
from horde_lite.core.context import Horde
from horde_lite.core.errors import HordeError
from horde_lite.db.models import PromptFilter, User
from horde_lite.filters import patterns
from horde_lite.filters.patterns import Action, action_of
from horde_lite.inputs import FilterInput, FilterPatch
from horde_lite.rc import Rc

# A transaction-level advisory lock (PostgreSQL) taken by every filter write: "hl", then "fi".
_ADVISORY_FILTERS = select(func.pg_advisory_xact_lock(0x686C, 0x6669))


@dataclass(frozen=True, slots=True)
class FilterRecord:
    """A filter as the API and the dashboard show it."""

    id: int
    regex: str
    filter_type: int
    description: str | None
    replacement: str
    user: str  # "name#id": the moderator who added it or changed it last
    action: Action


def _record(row: PromptFilter, user: User) -> FilterRecord:
    return FilterRecord(
        id=row.id, regex=row.regex, filter_type=row.filter_type, description=row.description,
        replacement=row.replacement, user=display_name(user), action=action_of(row.filter_type),
    )  # fmt: skip


def regex_hash(pattern: str) -> str:
    return hashlib.sha256(pattern.encode("utf-8", "surrogatepass")).hexdigest()


def _not_found(filter_id: str) -> HordeError:
    return HordeError(Rc.FilterNotFound, f"Filter with ID '{filter_id[:40]}' not found.")


def _id_of(filter_id: str) -> int:
    """A filter's id from the path: ASCII digits (upstream's rule); anything else names none."""
    found = user_id_part(filter_id)
    if found is None:
        raise _not_found(filter_id)
    return found


async def _serialized(session: AsyncSession) -> None:
    if session.get_bind().dialect.name == "postgresql":
        await session.execute(_ADVISORY_FILTERS)


async def _with_user(session: AsyncSession, row: PromptFilter) -> FilterRecord:
    user = await session.get(User, row.user_id)
    assert user is not None  # a foreign key; users are never removed, only renamed
    return _record(row, user)


_LISTED = select(PromptFilter, User).join(User, User.id == PromptFilter.user_id).order_by(PromptFilter.id)


async def listing(
    horde: Horde, filter_type: int | None = None, contains: str | None = None
) -> list[FilterRecord]:
    """Every filter in id order; of one type, and holding `contains` in its pattern or description
    (case-sensitive, as upstream's PostgreSQL compares), when given. The filters are few (at most
    `[filters] max_filters`), so the choice is made here, alike on both databases."""
    async with horde.reading() as session:
        rows = (await session.execute(_LISTED)).tuples().all()
    found = [_record(row, user) for row, user in rows]
    if filter_type is not None:
        found = [f for f in found if f.filter_type == filter_type]
    if contains:
        found = [f for f in found if contains in f.regex or contains in (f.description or "")]
    return found


async def show(horde: Horde, filter_id: str) -> FilterRecord:
    number = _id_of(filter_id)
    async with horde.reading() as session:
        row = await session.get(PromptFilter, number)
        if row is None:
            raise _not_found(filter_id)
        return await _with_user(session, row)


async def _same(session: AsyncSession, filter_type: int, pattern: str) -> PromptFilter | None:
    query = select(PromptFilter).where(
        PromptFilter.filter_type == filter_type, PromptFilter.regex_hash == regex_hash(pattern)
    )
    return (await session.execute(query)).scalar_one_or_none()


async def create(horde: Horde, moderator_id: int, body: FilterInput) -> FilterRecord:
    """A new filter, or, as upstream, the one that already has this pattern and type (unchanged)."""
    async with horde.reading() as session:
        there = await _same(session, body.filter_type, body.regex)
        if there is not None:
            return await _with_user(session, there)
    settings = horde.settings.filters
    await patterns.check(body.regex)
    now = horde.clock.now()
    async with horde.transaction() as session:
        await _serialized(session)
        there = await _same(session, body.filter_type, body.regex)
        if there is not None:  # written meanwhile
            return await _with_user(session, there)
        held = (await session.execute(select(func.count(PromptFilter.id)))).scalar_one()
        if held >= settings.max_filters:
            raise HordeError(
                Rc.TooManyFilters,
                f"This horde holds {held} filters, its most ([filters] max_filters); delete one first.",
            )
        row = PromptFilter(
            regex=body.regex, regex_hash=regex_hash(body.regex), filter_type=body.filter_type,
            description=body.description or None, replacement=body.replacement, user_id=moderator_id,
            created_at=now, updated_at=now,
        )  # fmt: skip
        session.add(row)
        await session.flush()
        made = await _with_user(session, row)
    horde.filters.invalidate()
    return made


async def change(horde: Horde, moderator_id: int, filter_id: str, body: FilterPatch) -> FilterRecord:
    """Only the fields sent change (a description of "" removes it); the moderator becomes its
    `user`. Nothing sent is NoFilterModSelected, as upstream."""
    number = _id_of(filter_id)
    async with horde.reading() as session:
        row = await session.get(PromptFilter, number)
        if row is None:
            raise _not_found(filter_id)
        pattern, filter_type = row.regex, row.filter_type
    if all(v is None for v in (body.regex, body.filter_type, body.description, body.replacement)):
        raise HordeError(Rc.NoFilterModSelected, "No filter patching selected!")
    if body.regex is not None and body.regex != pattern:
        await patterns.check(body.regex)
    new_pattern = pattern if body.regex is None else body.regex
    new_type = filter_type if body.filter_type is None else body.filter_type
    async with horde.transaction() as session:
        await _serialized(session)
        row = await session.get(PromptFilter, number, with_for_update=True)
        if row is None:  # deleted meanwhile
            raise _not_found(filter_id)
        if row.regex != pattern and body.regex is None:
            raise HordeError(Rc.BadRequest, "The filter changed meanwhile; send the change again.")
        other = await _same(session, new_type, new_pattern)
        if other is not None and other.id != row.id:
            taken = f"Filter {other.id} already has this regex and type; change or delete that one."
            raise HordeError(Rc.BadRequest, taken)
        row.regex, row.regex_hash, row.filter_type = new_pattern, regex_hash(new_pattern), new_type
        if body.description is not None:
            row.description = body.description or None
        if body.replacement is not None:
            row.replacement = body.replacement
        row.user_id, row.updated_at = moderator_id, horde.clock.now()
        await session.flush()
        changed = await _with_user(session, row)
    horde.filters.invalidate()
    return changed


async def remove(horde: Horde, filter_id: str) -> None:
    number = _id_of(filter_id)
    async with horde.transaction() as session:
        await _serialized(session)
        row = await session.get(PromptFilter, number, with_for_update=True)
        if row is None:
            raise _not_found(filter_id)
        await session.delete(row)
    horde.filters.invalidate()


async def combined(horde: Horde, filter_type: int | None = None) -> list[tuple[int, str]]:
    """GET /filters/regex: per type that has filters, their patterns joined by `|` in id order, as
    upstream shows the expression it compiles per type (horde_lite matches each filter alone)."""
    by_type: dict[int, list[str]] = {}
    for f in await listing(horde, filter_type):
        by_type.setdefault(f.filter_type, []).append(f.regex)
    return [(t, "|".join(by_type[t])) for t in sorted(by_type)]
