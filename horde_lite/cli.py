"""`horde-lite`: the Litestar CLI preset to this app, plus the operator commands
(database upgrade, users create/kudos, policies list/use/history)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import click

from horde_lite.demo.command import demo as demo_command
from horde_lite.settings import Settings, SettingsError, load_settings
from horde_lite.worker.command import worker as worker_command

T = TypeVar("T")
APP = "horde_lite.app:create_app"


def _settings() -> Settings:
    try:
        return load_settings()
    except SettingsError as e:
        raise click.ClickException(str(e)) from e


def _with_session(work: Callable[..., Awaitable[T]]) -> T:
    """Run `work(session, settings, now)` in one transaction on the configured database."""
    from horde_lite.clock import Clock
    from horde_lite.db import migrate
    from horde_lite.db.engine import make_engine, make_sessionmaker

    settings = _settings()
    if migrate.is_behind(settings.database.url):
        migrate.upgrade(settings.database.url)

    async def run() -> T:
        engine = make_engine(settings.database.url)
        try:
            async with make_sessionmaker(engine)() as session, session.begin():
                return await work(session, settings, Clock().now())
        finally:
            await engine.dispose()

    return asyncio.run(run())


def register_commands(cli: click.Group) -> None:
    cli.add_command(database)
    cli.add_command(users)
    cli.add_command(policies)
    cli.add_command(worker_command)
    cli.add_command(demo_command)
    cli.add_command(whatif)


@click.group(help="The database schema.")
def database() -> None:
    pass


@database.command("upgrade", help="Apply migrations up to the newest revision.")
def database_upgrade() -> None:
    from horde_lite.db import migrate

    url = _settings().database.url
    migrate.upgrade(url)
    click.echo(f"database at revision {', '.join(sorted(migrate.heads()))}")


@click.group(help="Users and their kudos.")
def users() -> None:
    pass


@users.command("create", help="Create a user and print its API key (shown once) on the last line.")
@click.argument("name")
@click.option("--kudos", type=float, default=0.0, help="Starting kudos, granted through the ledger.")
@click.option("--trusted", is_flag=True, help="Mark the user trusted.")
@click.option("--moderator", is_flag=True, help="Make the user a moderator.")
def users_create(name: str, kudos: float, trusted: bool, moderator: bool) -> None:
    from horde_lite.lifecycle import kudos as ledger
    from horde_lite.lifecycle.errors import HordeError
    from horde_lite.lifecycle.users import create_user, display_name

    async def work(session, settings, now):  # type: ignore[no-untyped-def]
        user, key = await create_user(session, name, now, trusted=trusted, moderator=moderator)
        if kudos:
            await ledger.record(session, user.id, kudos, "grant", "cli", now)
        return display_name(user), key

    try:
        who, key = _with_session(work)
    except HordeError as e:
        raise click.ClickException(e.message) from e
    click.echo(f"created user {who} with {kudos:g} kudos; API key (shown once):")
    click.echo(key)


@users.command("kudos", help="Set a user's kudos to N (or add N with --add), through the ledger.")
@click.argument("name")
@click.argument("amount", type=float)
@click.option("--add", is_flag=True, help="Add AMOUNT instead of setting the balance to it.")
def users_kudos(name: str, amount: float, add: bool) -> None:
    from horde_lite.lifecycle import kudos as ledger
    from horde_lite.lifecycle.errors import HordeError
    from horde_lite.lifecycle.users import display_name, find_by_name

    async def work(session, settings, now):  # type: ignore[no-untyped-def]
        user = await find_by_name(session, name)
        await session.refresh(user, with_for_update=True)  # the balance read is the one moved
        delta = amount if add else amount - user.kudos
        await ledger.record(session, user.id, delta, "grant" if delta >= 0 else "debit", "cli", now)
        await session.refresh(user)
        return display_name(user), user.kudos

    try:
        who, balance = _with_session(work)
    except HordeError as e:
        raise click.ClickException(e.message) from e
    click.echo(f"{who} now has {balance:g} kudos")


@users.command("set", help="Change a user's trusted or moderator flag.")
@click.argument("name")
@click.option("--trusted/--untrusted", default=None, help="Trust the user's workers (or stop).")
@click.option("--moderator/--no-moderator", default=None, help="Make the user a moderator (or stop).")
def users_set(name: str, trusted: bool | None, moderator: bool | None) -> None:
    from horde_lite.lifecycle.errors import HordeError
    from horde_lite.lifecycle.users import display_name, find_by_name, set_flags

    async def work(session, settings, now):  # type: ignore[no-untyped-def]
        user = await find_by_name(session, name)
        await set_flags(session, user, trusted=trusted, moderator=moderator)
        return display_name(user), user.trusted, user.moderator

    try:
        who, is_trusted, is_moderator = _with_session(work)
    except HordeError as e:
        raise click.ClickException(e.message) from e
    click.echo(f"{who}: trusted={is_trusted} moderator={is_moderator}")


POLICY_KINDS = ("speed_gate", "allowance_curve", "shadow_metrics")


@click.group(help="Policy plugins: the installed ones, the one in force, switching.",
             invoke_without_command=True)  # fmt: skip
def policies() -> None:
    ctx = click.get_current_context()  # not pass_context: Litestar's CLI passes its own `ctx`
    if ctx.invoked_subcommand is None:
        ctx.invoke(policies_list)


@policies.command("list", help="Every installed policy by kind and name, which one the settings select (*), "
                  "and the one in force in the database.")  # fmt: skip
def policies_list() -> None:
    from horde_lite.policies.registry import listing

    settings = _settings()
    for kind, name, dist, selected in listing(settings.policies):
        click.echo(f"{'*' if selected else ' '} {kind:16} {name:18} ({dist})")
    state, reason = _policy_state(settings)
    if state is None:
        click.echo(f"in force: unknown ({reason})")
        return
    for kind in POLICY_KINDS:
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
    from horde_lite.lifecycle.policy_state import read_state

    url = make_url(settings.database.url)
    if url.get_backend_name() == "sqlite" and not (url.database and os.path.exists(url.database)):
        return None, "no database file yet"

    async def read() -> dict:  # type: ignore[type-arg]
        engine = make_engine(settings.database.url, null_pool=True)
        try:
            async with make_sessionmaker(engine)() as session:
                return await read_state(session)
        finally:
            await engine.dispose()

    try:
        return asyncio.run(read()), ""
    except Exception as e:  # a database that is behind or away: the listing still stands
        return None, f"the database could not be read: {e}"


def _with_engine(work: Callable[..., Awaitable[T]]) -> T:
    """Run `work(engine, settings)` on the configured database (migrated first when behind)."""
    from horde_lite.db import migrate
    from horde_lite.db.engine import make_engine

    settings = _settings()
    if migrate.is_behind(settings.database.url):
        migrate.upgrade(settings.database.url)

    async def run() -> T:
        engine = make_engine(settings.database.url, null_pool=True)
        try:
            return await work(engine, settings)
        finally:
            await engine.dispose()

    return asyncio.run(run())


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
@click.argument("kind", type=click.Choice(POLICY_KINDS))
@click.argument("name")
@click.option("--option", "raw_options", multiple=True, metavar="KEY=VALUE",
              help="An option of the policy (repeat); the options given replace the old ones.")  # fmt: skip
def policies_use(kind: str, name: str, raw_options: tuple[str, ...]) -> None:
    from horde_lite.lifecycle import policy_state
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


@policies.command("history", help="The policy switches, newest first.")
@click.option("--limit", type=int, default=20, show_default=True, help="How many to show.")
def policies_history(limit: int) -> None:
    from datetime import UTC, datetime

    from horde_lite.lifecycle import policy_state

    async def work(engine, settings):  # type: ignore[no-untyped-def]
        return await policy_state.history(engine, limit)

    for change in _with_engine(work):
        at = datetime.fromtimestamp(change.at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        click.echo(f"{at}  v{change.id:<4} {change.kind:16} {change.old_name or '(none)'} -> "
                   f"{change.new_name} {change.options}  ({change.source})")  # fmt: skip


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
    url = db or settings.database.url
    now = Clock().now()
    try:
        start = report.parse_time(since, now)
        end = None if until is None else report.parse_time(until, now)
        options = report.parse_options(pairs)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    if migrate.is_behind(url):  # a report never migrates the database it reads
        raise click.ClickException("the database is behind: run `horde-lite database upgrade` first")

    async def run() -> str:
        engine = make_engine(url, null_pool=True)
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


def main() -> None:
    """The console script: `horde-lite ...` is `litestar --app horde_lite.app:create_app ...`."""
    os.environ.setdefault("LITESTAR_APP", APP)
    from litestar.cli.main import litestar_group

    sys.exit(litestar_group())
