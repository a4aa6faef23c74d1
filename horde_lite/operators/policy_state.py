"""The policy in force, shared by every process of the horde through the database.

`policy_state` holds one row per kind (speed_gate, allowance_curve, shadow_metrics): the policy's
name, its options and a version that grows by one at each switch; `policy_changes` logs every
switch with its source (`cli`, `sighup`, `start-up`).

The rule, settings file against database: the database's row is the policy in force. At start-up a
process seeds the row of a kind that has none from its settings (source `start-up`); a kind that
has one keeps it, and a process whose settings name another policy runs the database's and logs a
WARNING saying how to switch (`horde-lite policies use ...`, or SIGHUP after editing the file). So
a restart never undoes a switch, and two processes with different files still run one policy.

Each server process watches the table (`PolicyWatcher`): every `[policies] reload_seconds` (and
at once for a switch it made itself) it reads the rows and, for each kind whose version differs
from the one it applies, builds the new policy through the registry and replaces `horde.policies`
as a whole (one attribute assignment: a request holds whichever object it read). A policy that
fails to build in this process keeps the old one and logs an ERROR once per version. The same poll
applies the horde's modes (operators/horde_modes.py), kept in the database the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import aliased

from horde_lite.clock import Clock
from horde_lite.core.context import Horde, transaction_on
from horde_lite.db.models import PolicyChange, PolicyState
from horde_lite.operators import horde_modes
from horde_lite.policies.kinds import PolicyKind
from horde_lite.policies.registry import build, load_policies
from horde_lite.settings import Settings, SettingsError, load_settings

log = logging.getLogger("horde_lite.policies")
# The watch task's name (tests tell its timed reads from a call's own statements by it).
WATCH_TASK = "horde_lite-policy-watch"


@dataclass(frozen=True, slots=True)
class KindState:
    """One policy_state row."""

    kind: str
    name: str
    options: dict[str, Any]
    version: int
    changed_at: float


@dataclass(frozen=True, slots=True)
class SwitchResult:
    """What `switch` did. `changed` is False when the policy asked for was already in force."""

    kind: str
    old_name: str | None
    old_options: dict[str, Any] | None
    name: str
    options: dict[str, Any]
    version: int
    changed: bool


@dataclass(frozen=True, slots=True)
class KindView:
    """One kind: the database's policy in force, and what this process applies."""

    kind: str
    name: str | None  # None: no row yet (no process has started on this database)
    options: dict[str, Any]
    version: int
    changed_at: float | None
    applied_name: str
    applied_options: dict[str, Any]
    applied_version: int  # 0: the settings' policy, not matched with the database yet

    @property
    def in_sync(self) -> bool:
        return self.applied_version == self.version


@dataclass(frozen=True, slots=True)
class PoliciesView:
    pid: int
    reload_seconds: float
    kinds: list[KindView]


@dataclass(frozen=True, slots=True)
class ChangeView:
    """One policy_changes row."""

    id: int
    at: float
    kind: str
    old_name: str | None
    new_name: str
    options: dict[str, Any]
    source: str
    version: int  # the kind's version this switch made (policy_state's, as `policies use` says)


def _state(row: PolicyState) -> KindState:
    return KindState(row.kind, row.name, dict(row.options or {}), row.version, row.changed_at)


async def read_state(session: AsyncSession) -> dict[str, KindState]:
    rows = (await session.execute(select(PolicyState))).scalars().all()
    return {row.kind: _state(row) for row in rows}


async def _insert_if_missing(
    session: AsyncSession, kind: str, name: str, options: dict[str, Any], now: float
) -> bool:
    """Insert a kind's first row unless another process just did (True: this one inserted it)."""
    dialect = session.get_bind().dialect.name
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    statement = (
        insert(PolicyState)
        .values(kind=kind, name=name, options=options, version=1, changed_at=now)
        .on_conflict_do_nothing(index_elements=["kind"])
    )
    result = await session.execute(statement)
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def switch(
    target: Horde | AsyncEngine,
    kind: str,
    name: str,
    options: dict[str, Any],
    source: str,
    *,
    now: float | None = None,
) -> SwitchResult:
    """Make `name` with `options` the `kind` policy of every process of the horde.

    `target` is a running horde (a server process, which applies it at once) or an engine (the
    CLI). The policy is first built exactly as start-up builds it (registry.build): a name that is
    not installed here, or a bad option, raises `PolicyError` with the registry's message and
    nothing is written. Otherwise, under the kind's row lock, the row gets version + 1, the options
    and `changed_at`, and a policy_changes row records the switch with `source`; a kind with no row
    yet gets version 1. Asking for the policy already in force (same name and options) writes
    nothing and returns `changed=False`. The other processes apply it at their next poll.
    """
    build(kind, name, options)  # refuse before writing anything
    if now is None:
        now = target.clock.now() if isinstance(target, Horde) else Clock().now()
    async with transaction_on(target) as session:
        query = select(PolicyState).where(PolicyState.kind == kind).with_for_update()
        row = (await session.execute(query)).scalar_one_or_none()
        if row is None and await _insert_if_missing(session, kind, name, options, now):
            old_name, old_options, version = None, None, 1
        else:
            if row is None:  # another process seeded it meanwhile: switch that row
                row = (await session.execute(query)).scalar_one()
            old_name, old_options = row.name, dict(row.options or {})
            if (old_name, old_options) == (name, options):
                return SwitchResult(kind, old_name, old_options, name, options, row.version, False)
            row.name, row.options, row.version, row.changed_at = name, dict(options), row.version + 1, now
            version = row.version
        session.add(PolicyChange(at=now, kind=kind, old_name=old_name, new_name=name, options=options,
                                 source=source))  # fmt: skip
    if isinstance(target, Horde):
        await apply_changes(target)  # this process at once; the others at their next poll
    return SwitchResult(kind, old_name, old_options, name, dict(options), version, True)


async def history(target: Horde | AsyncEngine, limit: int = 50) -> list[ChangeView]:
    """The newest `limit` switches, newest first."""
    # Every version a kind's row takes is written with a policy_changes row (the first by `seed` or
    # `switch`, at version 1), so a switch's version is its rank among its kind's changes.
    version = func.row_number().over(partition_by=PolicyChange.kind, order_by=PolicyChange.id)
    numbered = select(PolicyChange, version.label("version")).subquery()
    change = aliased(PolicyChange, numbered)
    query = select(change, numbered.c.version).order_by(numbered.c.id.desc()).limit(limit)
    async with transaction_on(target) as session:
        rows = (await session.execute(query)).all()
    return [ChangeView(r.id, r.at, r.kind, r.old_name, r.new_name, dict(r.options or {}), r.source, v)
            for r, v in rows]  # fmt: skip


async def policies_view(horde: Horde) -> PoliciesView:
    """The database's policy in force per kind, next to what this process applies."""
    async with horde.reading() as session:
        state = await read_state(session)
    applied = horde.policies  # read once: the view describes one object even if a swap follows
    kinds = []
    for kind in PolicyKind:
        row = state.get(kind)
        kinds.append(
            KindView(
                kind=kind,
                name=row.name if row else None,
                options=row.options if row else {},
                version=row.version if row else 0,
                changed_at=row.changed_at if row else None,
                applied_name=applied.names[kind],
                applied_options=applied.options.get(kind, {}),
                applied_version=applied.versions.get(kind, 0),
            )
        )
    return PoliciesView(pid=os.getpid(), reload_seconds=horde.settings.policies.reload_seconds, kinds=kinds)


async def apply_changes(horde: Horde, failed: dict[str, int] | None = None) -> list[str]:
    """One step of the watch: read policy_state and swap in every kind whose version changed.

    Returns the kinds switched. `failed` remembers (kind -> version) builds that failed, so each
    failure is logged once; a kind that fails keeps its old policy (and its old version)."""
    async with horde.reading() as session:
        state = await read_state(session)
    current = horde.policies
    built: dict[str, Any] = {}
    names, options, versions = dict(current.names), dict(current.options), dict(current.versions)
    switched: list[str] = []
    for kind in PolicyKind:
        row = state.get(kind)
        if row is None or row.version == versions.get(kind, 0):
            continue
        if (row.name, row.options) == (current.names[kind], current.options.get(kind, {})):
            versions[kind] = row.version  # the same policy: adopt the version, keep the object
            continue
        try:
            built[kind] = build(kind, row.name, row.options)
        except Exception as exc:  # a plugin missing on this host: keep the old one, say so once
            if failed is None or failed.get(kind) != row.version:
                log.error(
                    "policy switch NOT applied in process %d: %s %s -> %s (version %d) failed to "
                    "build here, keeping %s: %s",
                    os.getpid(), kind, current.names[kind], row.name, row.version, current.names[kind], exc,
                )  # fmt: skip
            if failed is not None:
                failed[kind] = row.version
            continue
        log.warning(
            "policy switch: %s %s -> %s (version %d -> %d, options %s) in process %d",
            kind, current.names[kind], row.name, versions.get(kind, 0), row.version, row.options, os.getpid(),
        )  # fmt: skip
        names[kind], options[kind], versions[kind] = row.name, row.options, row.version
        switched.append(kind)
        if failed is not None:
            failed.pop(kind, None)
    if built or versions != current.versions:
        # One assignment: a request that read the old object keeps it to its end.
        horde.policies = replace(current, names=names, options=options, versions=versions, **built)
    if switched:
        horde.pop_waiters.wake_all()  # a new gate may let waiting pops take jobs refused before
    return switched


async def seed(horde: Horde) -> list[str]:
    """Start-up: write the settings' policy for each kind the database has no row for (source
    `start-up`), and warn about each kind where the settings name another policy than the
    database's (the database's stays in force). Returns the kinds seeded."""
    now = horde.clock.now()
    chosen = horde.settings.policies
    seeded: list[str] = []
    async with horde.transaction() as session:
        state = await read_state(session)
        for kind in PolicyKind:
            if kind in state:
                continue
            name, options = getattr(chosen, kind), dict(chosen.options.get(kind, {}))
            if await _insert_if_missing(session, kind, name, options, now):
                session.add(PolicyChange(at=now, kind=kind, old_name=None, new_name=name, options=options,
                                         source="start-up"))  # fmt: skip
                seeded.append(kind)
    for kind, row in state.items():
        wanted = (getattr(chosen, kind, None), chosen.options.get(kind, {}))
        # A set: `str in PolicyKind` raises TypeError before Python 3.12.
        if kind in set(PolicyKind) and (row.name, row.options) != wanted:
            log.warning(
                "[policies] %s: the settings name %s %s but the database's policy in force is %s %s "
                "(version %d); the database's applies. To switch every process to the settings' one: "
                "`horde-lite policies use %s %s` (with --option key=value for options), or SIGHUP a "
                "server process after editing the settings file",
                kind, wanted[0], wanted[1], row.name, row.options, row.version, kind, wanted[0],
            )  # fmt: skip
    return seeded


async def reload_settings_file(
    horde: Horde, loader: Callable[[], Settings] = load_settings, failed: dict[str, int] | None = None
) -> list[SwitchResult]:
    """SIGHUP: re-read the settings file (and environment, as start-up does) and write its
    [policies] selection to the database where it differs, so every process follows. A file that
    does not load, or a policy that does not build, is logged and changes nothing. Only the
    [policies] selection is taken from the file: every other setting still needs a restart."""
    try:
        settings = await asyncio.to_thread(loader)
        load_policies(settings.policies)  # the whole selection builds, or nothing is written
    except (SettingsError, OSError) as exc:
        log.error("SIGHUP: the settings were not reloaded; every policy is kept: %s", exc)
        return []
    chosen = settings.policies
    results = []
    for kind in PolicyKind:
        name, options = getattr(chosen, kind), dict(chosen.options.get(kind, {}))
        result = await switch(horde, kind, name, options, "sighup")
        if result.changed:
            results.append(result)
    if not results:
        log.warning("SIGHUP: the settings file's policies are already the ones in force")
    await apply_changes(horde, failed)
    return results


STOP_SECONDS = 5.0


class PolicyWatcher:
    """A server process's watch over policy_state, and its SIGHUP handler."""

    def __init__(self, horde: Horde, loader: Callable[[], Settings] = load_settings) -> None:
        self.horde = horde
        self.loader = loader
        self.failed: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._reloads: set[asyncio.Task[Any]] = set()
        self._sighup = False

    async def start(self) -> None:
        """Seed, apply the database's policies and modes, then watch (and take SIGHUP on the main
        thread)."""
        await seed(self.horde)
        await apply_changes(self.horde, self.failed)
        await horde_modes.apply(self.horde)
        self._task = asyncio.create_task(self._watch(), name=WATCH_TASK)
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError, AttributeError):
            loop.add_signal_handler(signal.SIGHUP, self.on_sighup)  # main thread, Unix only
            self._sighup = True

    def on_sighup(self) -> None:
        log.warning("SIGHUP: re-reading the settings' [policies] selection")
        task = asyncio.create_task(reload_settings_file(self.horde, self.loader, self.failed))
        self._reloads.add(task)
        task.add_done_callback(self._reloaded)

    def _reloaded(self, task: asyncio.Task[Any]) -> None:
        self._reloads.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("SIGHUP: reloading the policies failed: %s", task.exception())

    async def _watch(self) -> None:
        # A plain poll. Waking it early through the notifier (a NOTIFY, or the listener's
        # reconnection) let a watch step run beside requests just after the database had dropped
        # every connection, and one request then stalled until the next drop; the poll has no
        # such race, and `reload_seconds` (2 s) is the documented bound.
        interval = self.horde.settings.policies.reload_seconds
        while True:
            await asyncio.sleep(interval)
            try:
                await apply_changes(self.horde, self.failed)
                await horde_modes.apply(self.horde)
            except Exception as exc:  # the database may be away: try again at the next poll
                log.warning("policy watch: reading policy_state or horde_modes failed, retrying: %s", exc)

    async def stop(self) -> None:
        if self._sighup:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        tasks = [task for task in (self._task, *self._reloads) if task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            # Bounded: shutdown must not hang on a watch step stuck in the database.
            _, stuck = await asyncio.wait(tasks, timeout=STOP_SECONDS)
            if stuck:
                log.warning("policy watch: %d task(s) did not stop within %.0f s", len(stuck), STOP_SECONDS)
        self._task = None


async def start(horde: Horde) -> PolicyWatcher:
    """The app lifespan's entry: the policy in force from the database, then the watch."""
    watcher = PolicyWatcher(horde)
    await watcher.start()
    return watcher
