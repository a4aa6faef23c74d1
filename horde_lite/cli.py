"""`horde-lite`: the Litestar CLI preset to this app, plus the operator commands
(database upgrade, users create/kudos, policies list)."""

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


@click.group(help="Policy plugins.")
def policies() -> None:
    pass


@policies.command("list", help="Every installed policy by kind and name, and which one is selected.")
def policies_list() -> None:
    from horde_lite.policies.registry import listing

    settings = _settings()
    for kind, name, dist, selected in listing(settings.policies):
        click.echo(f"{'*' if selected else ' '} {kind:16} {name:18} ({dist})")


def main() -> None:
    """The console script: `horde-lite ...` is `litestar --app horde_lite.app:create_app ...`."""
    os.environ.setdefault("LITESTAR_APP", APP)
    from litestar.cli.main import litestar_group

    sys.exit(litestar_group())
