"""`horde-lite`: the operator's command line (docs/reference/cli.md).

The root group is horde_lite's own, so `--help` lists only what applies to a horde and needs no
settings or database to show. Litestar's `run` (the server) and `routes` are added as they are:
`run` stays the object `litestar.cli.commands.core.run_command`. They read the app from the
context's object, which Litestar's root group (`litestar.cli.litestar_group`) sets for its
`--app` option: horde-lite's root runs that group's own callback with horde_lite's app, so the app
is loaded only by those two commands, when they need it. Every command that opens the database
says which one on stderr (`announce_database`).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click
import rich_click
from litestar.cli import litestar_group
from litestar.cli.commands.core import routes_command, run_command

from horde_lite import __version__
from horde_lite.demo.command import demo as demo_command
from horde_lite.policies.kinds import PolicyKind
from horde_lite.settings import KUDOS_LIMIT, Settings, SettingsError, load_settings, masked
from horde_lite.startup import StartupError, check_database, fail, guard_run
from horde_lite.worker.command import worker as worker_command

if TYPE_CHECKING:
    from horde_lite.core.modes import HordeModes

T = TypeVar("T")
APP = "horde_lite.app:create_app"


# --- shared helpers ---------------------------------------------------------------------------------


def _settings() -> Settings:
    """The settings, or the start-up message naming what is wrong (exit status 2)."""
    try:
        return load_settings()
    except SettingsError as e:
        fail(StartupError(str(e)))


def announce_database(url: str) -> str:
    """Say on stderr which database this command uses (one line, before anything else); returns
    `url` so a caller can announce where it picks it."""
    click.echo(f"database: {masked(url)}", err=True)
    return url


def _with_engine(work: Callable[..., Awaitable[T]]) -> T:
    """Run `work(engine, settings)` on the configured database, migrated first when behind. A
    refusal of the lifecycle (HordeError) and an unreachable database are clean errors."""
    from horde_lite.api.db_errors import database_unavailable
    from horde_lite.core.errors import HordeError
    from horde_lite.db import migrate
    from horde_lite.db.engine import make_engine

    settings = _settings()
    url = announce_database(settings.database.url)
    try:
        check_database(settings)  # reached before anything is written: a plain message if not
    except StartupError as e:
        fail(e)

    async def run() -> T:
        engine = make_engine(url, null_pool=True, pgbouncer=settings.database.pgbouncer)
        try:
            return await work(engine, settings)
        finally:
            await engine.dispose()

    try:
        if migrate.is_behind(url, pgbouncer=settings.database.pgbouncer):
            migrate.upgrade(url, pgbouncer=settings.database.pgbouncer)
        return asyncio.run(run())
    except HordeError as e:
        raise click.ClickException(e.message) from e
    except Exception as e:
        if database_unavailable(e):
            raise click.ClickException(f"the database is unavailable: {e}") from e
        raise


def _with_session(work: Callable[..., Awaitable[T]]) -> T:
    """Run `work(session, settings, now)` in one transaction on the configured database."""
    from horde_lite.clock import Clock
    from horde_lite.db.engine import make_sessionmaker

    async def in_session(engine: Any, settings: Settings) -> T:
        async with make_sessionmaker(engine)() as session, session.begin():
            return await work(session, settings, Clock().now())

    return _with_engine(in_session)


def version_text() -> str:
    from litestar import __version__ as litestar_version

    litestar = f"{litestar_version.major}.{litestar_version.minor}.{litestar_version.patch}"
    return f"horde-lite {__version__}\nLitestar {litestar}, Python {platform.python_version()}"


# --- database ---------------------------------------------------------------------------------------


@click.group(help="The database schema.")
def database() -> None:
    pass


@database.command("upgrade", help="Apply migrations up to the newest revision.")
def database_upgrade() -> None:
    from horde_lite.db import migrate

    database = _settings().database
    migrate.upgrade(announce_database(database.url), pgbouncer=database.pgbouncer)
    click.echo(f"database at revision {', '.join(sorted(migrate.heads()))}")


# --- users ------------------------------------------------------------------------------------------


class Amount(click.ParamType):
    """A number of kudos within the horde's bounds; negative ones are written as they are (-5000)."""

    name = "amount"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        import math

        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a number of kudos (e.g. 250, -5000, 12.5)", param, ctx)
        if abs(number) > KUDOS_LIMIT:
            self.fail(f"{value!r} is beyond the horde's bound of +-{KUDOS_LIMIT:g} kudos", param, ctx)
        return number


@click.group(help="Users: create, list, kudos, flags, keys, deletion.")
def users() -> None:
    pass


@users.command("list", help="Every user: name#id, kudos, flags, live workers, created (UTC).")
@click.option("--json", "as_json", is_flag=True, help="One JSON array instead of the table.")
@click.option("--deleted", is_flag=True, help="Include deleted users (named deleted#ID).")
def users_list(as_json: bool, deleted: bool) -> None:
    from horde_lite.accounts.users import summaries

    async def work(session, settings, now):  # type: ignore[no-untyped-def]
        return await summaries(session, include_deleted=deleted)

    rows = _with_session(work)
    if as_json:
        click.echo(json.dumps([_summary_json(r) for r in rows], indent=2))
    else:
        click.echo(_table(rows))


def _summary_json(row: Any) -> dict[str, Any]:
    return {"id": row.id, "name": row.name, "kudos": row.kudos, "trusted": row.trusted,
            "moderator": row.moderator, "anonymous": row.anonymous, "deleted": row.deleted,
            "workers": row.workers, "created_at": row.created_at}  # fmt: skip


def _table(rows: Sequence[Any]) -> str:
    """A plain aligned table: no colour, no box, so it greps and pipes."""
    head = ("USER", "KUDOS", "TRUSTED", "MODERATOR", "WORKERS", "CREATED")
    body = [
        (r.name, f"{r.kudos:,.2f}".rstrip("0").rstrip("."), "yes" if r.trusted else "no",
         "yes" if r.moderator else "no", str(r.workers), _utc(r.created_at))
        for r in rows
    ]  # fmt: skip
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    numeric = {1, 4}  # right-aligned
    lines = ["  ".join(c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in
                       enumerate(zip(line, widths, strict=True))).rstrip()
             for line in [head, *body]]  # fmt: skip
    return "\n".join(lines) if body else "\n".join([*lines, "(no users)"])


@users.command("create", help="Create a user and print its API key (shown once) on the last line.")
@click.argument("name")
@click.option("--kudos", type=Amount(), default=0.0, help="Starting kudos, through the ledger.")
@click.option("--trusted", is_flag=True, help="Mark the user trusted.")
@click.option("--moderator", is_flag=True, help="Make the user a moderator.")
def users_create(name: str, kudos: float, trusted: bool, moderator: bool) -> None:
    from horde_lite.accounts import kudos as ledger
    from horde_lite.accounts.users import create_user, display_name

    async def work(session, settings, now):  # type: ignore[no-untyped-def]
        user, key = await create_user(session, name, now, trusted=trusted, moderator=moderator)
        if kudos:
            await ledger.record(session, user.id, kudos, "grant" if kudos > 0 else "debit", "cli", now)
        return display_name(user), key

    who, key = _with_session(work)
    click.echo(f"created user {who} with {kudos:g} kudos; API key (shown once):")
    click.echo(key)


# Unknown options pass through as arguments, so `users kudos bob -5000` reads -5000 as AMOUNT (a
# mistyped option then fails as an AMOUNT that is not a number or an extra argument).
@users.command("kudos", context_settings={"ignore_unknown_options": True},
               help="Set a user's kudos to AMOUNT (or add AMOUNT with --add), through the ledger. "
               "AMOUNT may be negative: `users kudos bob -5000 --add`.")  # fmt: skip
@click.argument("name")
@click.argument("amount", type=Amount())
@click.option("--add", is_flag=True, help="Add AMOUNT instead of setting the balance to it.")
def users_kudos(name: str, amount: float, add: bool) -> None:
    from horde_lite.accounts import kudos as ledger
    from horde_lite.accounts.users import display_name, find_by_name

    async def work(session, settings, now):  # type: ignore[no-untyped-def]
        user = await find_by_name(session, name)
        await session.refresh(user, with_for_update=True)  # the balance read is the one moved
        delta = amount if add else amount - user.kudos
        if abs(user.kudos + delta) > KUDOS_LIMIT:
            after = user.kudos + delta
            raise click.ClickException(
                f"{display_name(user)} would have {after:g} kudos, past +-{KUDOS_LIMIT:g}; nothing changed"
            )
        await ledger.record(session, user.id, delta, "grant" if delta >= 0 else "debit", "cli", now)
        await session.refresh(user)
        return display_name(user), user.kudos

    who, balance = _with_session(work)
    click.echo(f"{who} now has {balance:g} kudos")


@users.command("set", help="Change a user's trusted or moderator flag.")
@click.argument("name")
@click.option("--trusted/--untrusted", default=None, help="Trust the user's workers (or stop).")
@click.option("--moderator/--no-moderator", default=None, help="Make the user a moderator (or stop).")
def users_set(name: str, trusted: bool | None, moderator: bool | None) -> None:
    from horde_lite.accounts.users import display_name, find_by_name, set_flags

    async def work(session, settings, now):  # type: ignore[no-untyped-def]
        user = await find_by_name(session, name)
        await set_flags(session, user, trusted=trusted, moderator=moderator)
        return display_name(user), user.trusted, user.moderator

    who, is_trusted, is_moderator = _with_session(work)
    click.echo(f"{who}: trusted={is_trusted} moderator={is_moderator}")


@users.command("rotate-key", help="Give a user a new API key, printed (once) on the last line; the old "
               "key stops working at once, for the user's workers and dashboard sessions too.")  # fmt: skip
@click.argument("name")
def users_rotate_key(name: str) -> None:
    from horde_lite.accounts.users import display_name, find_by_name, rotate_key

    async def work(session, settings, now):  # type: ignore[no-untyped-def]
        user = await find_by_name(session, name)
        return display_name(user), await rotate_key(session, user)

    who, key = _with_session(work)
    click.echo(f"new API key for {who} (shown once; the old key no longer works):")
    click.echo(key)


@users.command("delete", help="Delete a user: its key, shared keys and workers stop working; its kudos "
               "history and records stay. Refused while it has jobs running on "
               "its workers or waiting requests.")  # fmt: skip
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def users_delete(name: str, yes: bool) -> None:
    from horde_lite.accounts.users import delete_user, find_by_name

    if not yes:
        click.confirm(f"Delete the user {name}? Its key, shared keys and workers stop working", abort=True)

    async def work(session, settings, now):  # type: ignore[no-untyped-def]
        return await delete_user(session, await find_by_name(session, name), now)

    gone = _with_session(work)
    click.echo(f"deleted {gone.name}: {gone.workers} worker(s) deleted, {gone.shared_keys} shared key(s) "
               f"removed; its {gone.kudos:g} kudos and its history stay")  # fmt: skip


# --- invite codes -----------------------------------------------------------------------------------


@click.group(help="Invite codes for registration in invite mode ([accounts] registration).")
def invites() -> None:
    pass


@invites.command("create", help="Make an invite code and print it (shown once) on the last line.")
@click.option(
    "--uses",
    type=click.IntRange(1, 10_000),
    default=1,
    show_default=True,
    help="Registrations the code allows.",
)
@click.option("--days", type=click.IntRange(0, 36_500), default=7, show_default=True,
              help="Days until it expires (0: never).")  # fmt: skip
def invites_create(uses: int, days: int) -> None:
    from horde_lite.accounts import invites as codes

    async def work(session, settings, now):  # type: ignore[no-untyped-def]
        return await codes.create_in(session, now, uses=uses, days=days, creator=None)

    made = _with_session(work)
    until = "never expires" if made.expires_at is None else f"expires {_utc(made.expires_at)} UTC"
    click.echo(f"invite {made.id}: {made.uses} registration(s), {until}; the code (shown once):")
    click.echo(made.code)


def _utc(at: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M")


@invites.command("list", help="Every invite code, newest first: id, its first characters, state, uses left.")
@click.option("--json", "as_json", is_flag=True, help="One JSON array instead of the table.")
def invites_list(as_json: bool) -> None:
    import dataclasses

    from horde_lite.accounts import invites as codes

    async def work(session, settings, now):  # type: ignore[no-untyped-def]
        return await codes.listing_in(session, now)

    rows = _with_session(work)
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
        return
    if not rows:
        click.echo("(no invite codes)")
    for r in rows:
        until = "never" if r.expires_at is None else _utc(r.expires_at)
        click.echo(f"{r.id:>6}  {r.hint}...  {r.state:<8}  {r.uses_left}/{r.uses} left  expires {until}  "
                   f"by {r.created_by or 'CLI'}")  # fmt: skip


@invites.command("revoke", help="Revoke an invite code, named by the code or by its id (from `list`).")
@click.argument("code")
def invites_revoke(code: str) -> None:
    from horde_lite.accounts import invites as codes

    async def work(session, settings, now):  # type: ignore[no-untyped-def]
        return await codes.revoke_in(session, code, now)

    gone = _with_session(work)
    used = gone.uses - gone.uses_left
    click.echo(f"invite {gone.id} ({gone.hint}...) is revoked; {used} registration(s) used it")


# --- usage ------------------------------------------------------------------------------------------


class When(click.ParamType):
    """A moment in UTC: YYYY-MM-DD (midnight), YYYY-MM-DDTHH:MM[:SS], or Nd (N days before now)."""

    name = "date"
    MOST_DAYS = 100_000

    def __init__(self, *, end_of_day: bool = False) -> None:
        self.end_of_day = end_of_day  # a bare date as --until takes in that whole day

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        import re
        import time
        from datetime import UTC, datetime, timedelta

        if isinstance(value, float):
            return value
        text = str(value).strip()
        if re.fullmatch(r"[0-9]{1,6}d", text):
            days = int(text[:-1])
            if days > self.MOST_DAYS:
                self.fail(f"{value!r} is more than {self.MOST_DAYS} days back", param, ctx)
            return time.time() - days * 86400
        try:
            if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}:[0-9]{2}(:[0-9]{2})?)?", text):
                raise ValueError(text)
            moment = datetime.fromisoformat(text).replace(tzinfo=UTC)
            if self.end_of_day and len(text) == 10:
                moment += timedelta(days=1)
        except (ValueError, OverflowError):
            self.fail(
                f"{value!r} is not a date: write YYYY-MM-DD, YYYY-MM-DDTHH:MM (UTC) or Nd (N days ago)",
                param,
                ctx,
            )
        return moment.timestamp()


USAGE_COLUMNS = ("requests", "jobs", "tokens", "kudos_spent", "kudos_earned")


@click.command("usage", help="The usage history (docs/reference/usage.md): requests, jobs, output tokens and "
               "kudos spent and earned, grouped by user (the requester), model, worker or day, between "
               "--since and --until (UTC; counted by whole clock hours), as a table or CSV.")  # fmt: skip
@click.option(
    "--since", required=True, type=When(), help="From this date: YYYY-MM-DD, YYYY-MM-DDTHH:MM or Nd."
)
@click.option("--until", type=When(end_of_day=True), default=None,
              help="Up to this date (a bare date: to the end of that day). Default: now.")  # fmt: skip
@click.option("--by", "by", type=click.Choice(["user", "model", "worker", "day"]), default="user",
              show_default=True, help="What each row is.")  # fmt: skip
@click.option("--csv", "as_csv", is_flag=True, help="CSV (a header line, then one line per row).")
def usage(since: float, until: float | None, by: str, as_csv: bool) -> None:
    from horde_lite.operators import usage as history

    if until is not None and until <= since:
        raise click.BadParameter("--until must be after --since", param_hint="'--until'")

    async def work(session, settings, now):  # type: ignore[no-untyped-def]
        return await history.report(session, history.By(by), history.hour_of(since), until)

    rows = _with_session(work)
    lines = [(r.key or "(none)", *(_figure(getattr(r.totals, c)) for c in USAGE_COLUMNS)) for r in rows]
    if as_csv:
        import csv
        import io

        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow((by, *USAGE_COLUMNS))
        writer.writerows(lines)
        click.echo(out.getvalue(), nl=False)
        return
    head = (by.upper(), *(c.upper().replace("_", " ") for c in USAGE_COLUMNS))
    click.echo(_aligned([head, *lines]) if lines else _aligned([head]) + "\n(no usage in that period)")


def _figure(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.2f}"


def _aligned(lines: Sequence[Sequence[str]]) -> str:
    """A plain table, the first column left-aligned and the figures right-aligned."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in lines
    )


# --- policies ---------------------------------------------------------------------------------------


@click.group(help="Policy plugins: the installed ones, the one in force, switching.",
             invoke_without_command=True)  # fmt: skip
def policies() -> None:
    ctx = click.get_current_context()  # not pass_context: Litestar's group passes its own `ctx`
    if ctx.invoked_subcommand is None:
        ctx.invoke(policies_list)


@policies.command("list", help="Every installed policy by kind and name, which one the settings select (*), "
                  "and the one in force in the database.")  # fmt: skip
def policies_list() -> None:
    from horde_lite.policies.registry import listing

    settings = _settings()
    state, reason = _policy_state(settings)
    for kind, name, dist, selected in listing(settings.policies):
        click.echo(f"{'*' if selected else ' '} {kind:16} {name:18} ({dist})")
    if state is None:
        click.echo(f"in force: unknown ({reason})")
        return
    for kind in PolicyKind:
        row = state.get(kind)
        if row is None:
            click.echo(f"in force: {kind} = none yet (the first server process seeds it from its settings)")
            continue
        chosen = getattr(settings.policies, kind)
        note = "" if chosen == row.name else f"; the settings select {chosen}"
        click.echo(f"in force: {kind} = {row.name} options {row.options} version {row.version}{note}")


def _policy_state(settings: Settings) -> tuple[dict | None, str]:  # type: ignore[type-arg]
    """policy_state as it is, read without migrating or creating anything (None: with why not)."""
    from sqlalchemy.engine import make_url

    from horde_lite.db.engine import make_engine, make_sessionmaker
    from horde_lite.operators.policy_state import read_state

    url = make_url(announce_database(settings.database.url))
    if url.get_backend_name() == "sqlite" and not (url.database and os.path.exists(url.database)):
        return None, "no database file yet"

    async def read() -> dict:  # type: ignore[type-arg]
        engine = make_engine(settings.database.url, null_pool=True, pgbouncer=settings.database.pgbouncer)
        try:
            async with make_sessionmaker(engine)() as session:
                return await read_state(session)
        finally:
            await engine.dispose()

    try:
        return asyncio.run(read()), ""
    except Exception as e:  # a database that is behind or away: the listing still stands
        return None, f"the database could not be read: {e}"


def _option(text: str) -> tuple[str, object]:
    import tomllib

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise click.BadParameter(f"{text!r}: expected KEY=VALUE", param_hint="--option")
    try:  # TOML values, as in the settings file: 0.5, true, "text"; anything else is a string
        return key.strip(), tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return key.strip(), value


USE_HELP = ("Switch KIND to the policy NAME in every server process of this horde, through the database "
            "(each process applies it within [policies] reload_seconds).")  # fmt: skip


@policies.command("use", help=USE_HELP)
@click.argument("kind", type=click.Choice([kind.value for kind in PolicyKind]))
@click.argument("name")
@click.option("--option", "raw_options", multiple=True, metavar="KEY=VALUE",
              help="An option of the policy (repeat); the options given replace the old ones.")  # fmt: skip
def policies_use(kind: str, name: str, raw_options: tuple[str, ...]) -> None:
    from horde_lite.operators import policy_state
    from horde_lite.policies.registry import PolicyError

    options = dict(_option(o) for o in raw_options)

    async def work(engine, settings):  # type: ignore[no-untyped-def]
        return settings, await policy_state.switch(engine, kind, name, options, "cli")

    try:
        settings, result = _with_engine(work)
    except PolicyError as e:
        raise click.ClickException(f"{e}; nothing changed") from e
    if not result.changed:
        click.echo(f"{kind}: {name} {result.options} is already in force (version {result.version}); "
                   "nothing changed")  # fmt: skip
        return
    click.echo(f"{kind}: {result.old_name or '(none)'} {result.old_options or {}} -> {name} {result.options} "
               f"(version {result.version}); every server process switches within "
               f"{settings.policies.reload_seconds:g} s ([policies] reload_seconds)")  # fmt: skip


HISTORY_HELP = ("The policy switches, newest first, each with the version it made (as `policies use` and "
                "the dashboard number them).")  # fmt: skip


@policies.command("history", help=HISTORY_HELP)
@click.option("--limit", type=int, default=20, show_default=True, help="How many to show.")
def policies_history(limit: int) -> None:
    from datetime import UTC, datetime

    from horde_lite.operators import policy_state

    async def work(engine, settings):  # type: ignore[no-untyped-def]
        return await policy_state.history(engine, limit)

    for change in _with_engine(work):
        at = datetime.fromtimestamp(change.at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        click.echo(f"{at}  {change.kind} version {change.version}: {change.old_name or '(none)'} -> "
                   f"{change.new_name} {change.options}  ({change.source})")  # fmt: skip


# --- modes ------------------------------------------------------------------------------------------


@click.group(help="The horde's modes: maintenance, worker invite-only, raid (show, switch, history).",
             invoke_without_command=True)  # fmt: skip
def modes() -> None:
    ctx = click.get_current_context()  # not pass_context: Litestar's group passes its own `ctx`
    if ctx.invoked_subcommand is None:
        ctx.invoke(modes_show)


def _print_modes(found: HordeModes) -> None:
    for mode in ("maintenance", "invite_only", "raid"):
        click.echo(f"{mode:12} {'on' if getattr(found, mode) else 'off'}")
    click.echo(f"version {found.version}" + (" (never switched)" if found.version == 0 else ""))


@modes.command("show", help="The modes in force in the database (what every server process applies).")
def modes_show() -> None:
    from horde_lite.operators import horde_modes

    async def work(engine, settings):  # type: ignore[no-untyped-def]
        from horde_lite.db.engine import make_sessionmaker

        async with make_sessionmaker(engine)() as session:
            return await horde_modes.read(session)

    _print_modes(_with_engine(work))


@modes.command("set", help="Switch modes on or off for every server process of this horde, through the "
               "database (each process applies it within [policies] reload_seconds).")  # fmt: skip
@click.option("--maintenance/--no-maintenance", default=None, help="No new requests; queued work drains.")
@click.option("--invite-only/--no-invite-only", default=None,
              help="New workers only within a moderator's worker_invited.")  # fmt: skip
@click.option("--raid/--no-raid", default=None,
              help="Untrusted users' new workers need an invitation; registering needs a code.")  # fmt: skip
def modes_set(maintenance: bool | None, invite_only: bool | None, raid: bool | None) -> None:
    from horde_lite.operators import horde_modes

    sent: dict[horde_modes.Mode, bool | None] = {"maintenance": maintenance, "invite_only": invite_only,
                                                 "raid": raid}  # fmt: skip
    changes = {mode: on for mode, on in sent.items() if on is not None}
    if not changes:
        raise click.UsageError("name a mode to switch: --maintenance, --invite-only or --raid (or --no-...)")

    async def work(engine, settings):  # type: ignore[no-untyped-def]
        return settings, await horde_modes.switch(engine, changes, horde_modes.OPERATOR, "cli")

    settings, found = _with_engine(work)
    _print_modes(found)
    click.echo(f"every server process applies it within {settings.policies.reload_seconds:g} s "
               "([policies] reload_seconds)")  # fmt: skip


@modes.command("history", help="The mode switches, newest first.")
@click.option(
    "--limit", type=click.IntRange(1, 10_000), default=20, show_default=True, help="How many to show."
)
def modes_history(limit: int) -> None:
    from horde_lite.operators import horde_modes

    async def work(engine, settings):  # type: ignore[no-untyped-def]
        return await horde_modes.history(engine, limit)

    for change in _with_engine(work):
        click.echo(f"{_utc(change.at)}  {change.mode:12} {'on ' if change.enabled else 'off'}  "
                   f"by {change.changed_by} ({change.source})")  # fmt: skip


# --- whatif -----------------------------------------------------------------------------------------


@click.command(help="What a speed gate or allowance curve would have decided over the recorded history.")
@click.option("--speed-gate", "gate", metavar="NAME", help="An installed speed gate to judge.")
@click.option("--allowance-curve", "curve", metavar="NAME", help="An installed allowance curve to judge.")
@click.option("--option", "pairs", multiple=True, metavar="KEY=VALUE", help="The policy's options.")
@click.option("--since", default="7d", show_default=True, help="7d, 24h, 90m, a date or date-time (UTC).")
@click.option("--until", default=None, help="As --since (default: no end).")
@click.option("--db", default=None, metavar="URL", help="Database URL (default: [database] url).")
def whatif(gate: str | None, curve: str | None, pairs: tuple[str, ...], since: str, until: str | None,
           db: str | None) -> None:  # fmt: skip
    from horde_lite import whatif as report
    from horde_lite.clock import Clock
    from horde_lite.db import migrate
    from horde_lite.db.engine import make_engine, make_sessionmaker

    if (gate is None) == (curve is None):
        raise click.UsageError("name one policy: --speed-gate NAME or --allowance-curve NAME")
    settings = _settings()
    now = Clock().now()
    try:
        start = report.parse_time(since, now)
        end = None if until is None else report.parse_time(until, now)
        options = report.parse_options(pairs)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    url = announce_database(db or settings.database.url)
    if migrate.is_behind(url, pgbouncer=settings.database.pgbouncer):  # a report never migrates
        raise click.ClickException("the database is behind: run `horde-lite database upgrade` first")

    async def run() -> str:
        engine = make_engine(url, null_pool=True, pgbouncer=settings.database.pgbouncer)
        try:
            async with make_sessionmaker(engine)() as session:
                if gate is not None:
                    found = await report.speed_gate_whatif(session, gate, start, end, options)
                    return report.render_speed_gate(found)
                judged = await report.allowance_whatif(
                    session, curve or "", start, end, options, settings=settings.allowance
                )
                return report.render_allowance(judged)
        finally:
            await engine.dispose()

    try:
        click.echo(asyncio.run(run()))
    except SettingsError as e:  # PolicyError: a name not installed, a wrong option
        raise click.ClickException(str(e)) from e


# --- openapi, version -------------------------------------------------------------------------------


@click.command("openapi", help="Write the API's OpenAPI schema (what /api/swagger.json serves) as JSON.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, allow_dash=True), default="-",
              show_default=True, help="The file to write ('-': standard output).")  # fmt: skip
def openapi(output: str) -> None:
    import msgspec
    from litestar.serialization import encode_json

    from horde_lite.api.body_schemas import describe_bodies
    from horde_lite.app import create_app

    app = create_app(_settings())  # built, not started: no database
    describe_bodies(app)  # as the server does before it first serves the schema
    document = msgspec.json.format(encode_json(app.openapi_schema.to_schema()), indent=2)
    with click.open_file(output, "wb") as out:
        out.write(document + b"\n")
    if output != "-":
        click.echo(f"wrote {output}", err=True)


@click.command("version", help="Show horde-lite's version (and Litestar's and Python's).")
def version() -> None:
    click.echo(version_text())


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(version_text())
        ctx.exit()


# --- the root group ---------------------------------------------------------------------------------

# What `litestar --app horde_lite.app:create_app` gains through the plugin (register_commands), and
# horde-lite's own commands besides run/routes/version.
OPERATOR_COMMANDS: tuple[click.Command, ...] = (
    users, invites, usage, worker_command, demo_command, policies, modes, whatif, database, openapi
)  # fmt: skip


def register_commands(cli: click.Group) -> None:
    for command in OPERATOR_COMMANDS:
        cli.add_command(command)


ROOT_HELP = """horde_lite: a self-hosted broker for crowd-sourced text generation (the AI Horde's text
API and an OpenAI-compatible front on one queue).

Settings come from ./litestar.toml (or the file HORDE_LITE_CONFIG names) and HORDE_LITE_<TABLE>__<KEY>
variables. Commands that open the database name it on stderr. Every command: docs/reference/cli.md."""

# `--help` lists the commands in this order (a group of click's would sort them by name).
PANELS = {
    "Run and operate": (
        "run",
        "users",
        "invites",
        "usage",
        "worker",
        "demo",
        "policies",
        "modes",
        "whatif",
        "database",
    ),
    "Tools": ("openapi", "routes", "version"),
}
HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}


@rich_click.group(name="horde-lite", help=ROOT_HELP, context_settings=HELP_OPTIONS)
@rich_click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
                   help="Show horde-lite's version and exit.")  # fmt: skip
@rich_click.rich_config(help_config={"commands_before_options": True})
@rich_click.command_panel("Run and operate", commands=list(PANELS["Run and operate"]))
@rich_click.command_panel("Tools", commands=list(PANELS["Tools"]))
@click.pass_context
def cli(ctx: click.Context) -> None:
    # What `litestar --app horde_lite.app:create_app` does: a loader of the app in `ctx.obj`, which
    # Litestar's run and routes call when they need the app (whatever LITESTAR_APP says).
    ctx.invoke(litestar_group.callback, app_path=APP, app_dir=None)  # type: ignore[arg-type]


# Litestar's own help speaks of app discovery and the `litestar` command: say what they do here.
run_command.short_help = "Serve the horde, once the settings, the port and the database check out."
run_command.help = (
    "Serve the horde with uvicorn: the horde API (/api), the OpenAI front (/v1), /metrics and "
    "/dashboard. First the settings, the policies, the port and the database are checked, and a "
    "failure is a plain message (exit status 2) before anything is written; then a database that is "
    "behind is migrated. The options are Litestar's."
)
routes_command.short_help = routes_command.help = "List the HTTP routes the server answers."
for _command in (guard_run(run_command), *OPERATOR_COMMANDS, routes_command, version):
    cli.add_command(_command)  # Litestar's run and routes come wrapped to take the app from `ctx.obj`


def main() -> None:
    """The console script `horde-lite`. Errors are one or two plain lines on stderr (rich_click
    would draw each in a box): status 2 for a usage or settings error, 1 for a refusal."""
    try:
        code = cli.main(prog_name="horde-lite", standalone_mode=False)
    except click.UsageError as e:
        where = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
        click.echo(f"horde-lite: {e.format_message()}{where}", err=True)
        code = e.exit_code
    except click.ClickException as e:
        click.echo(f"horde-lite: {e.format_message()}", err=True)
        code = e.exit_code
    except SettingsError as e:  # met by a command that loads the app (routes; run checks them first)
        fail(StartupError(str(e)))
    except click.Abort:
        click.echo("horde-lite: aborted", err=True)
        code = 1
    sys.exit(code if isinstance(code, int) else 0)
