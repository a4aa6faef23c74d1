"""Start-up checks: everything `horde-lite run` can find wrong is found before it changes anything.

In order: the settings (file and variables), the policies they select, the port, then the database
(reached, not written: no file created, no migration). Each failure is a `StartupError` whose
message is one or two plain lines naming the file or variable, the key, the URL (password masked)
and the fix; the CLI prints it and exits with status 2 instead of a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import re
import socket
import sqlite3
import sys
from pathlib import Path
from typing import Any, NoReturn

import click
from sqlalchemy.engine import URL, make_url

from horde_lite import __version__
from horde_lite.requests.prices import ModelSizes
from horde_lite.settings import (
    CONFIG_ENV,
    Settings,
    SettingsError,
    default_database_url,
    former_policy_options,
    load_settings,
    masked,
    settings_file,
)

CONNECT_TIMEOUT = 10.0  # seconds to reach PostgreSQL before calling it unreachable
# `horde-lite run --verbose` sets it, so that every server process it starts (--wc, --reload) sees
# it; set by hand it does the same. A flag, not a setting: it changes what is said, never what runs.
VERBOSE_ENV = "HORDE_LITE_VERBOSE"


def verbose() -> bool:
    """Whether start-up says each step in full (each migration applied) instead of in one line."""
    return os.environ.get(VERBOSE_ENV, "").strip().lower() in {"1", "true", "yes"}


class StartupError(Exception):
    """A problem found before start-up; the message is what the operator reads."""


def _settings_file_read() -> Path | None:
    """The settings file this process reads (absolute, as load_settings names it), if any."""
    path, _ = settings_file()
    return path.absolute() if path.exists() else None


def settings_source() -> str:
    """Which settings file this process reads, as the operator should see it."""
    path = _settings_file_read()
    if path is not None:
        return str(path)
    return f"defaults (no {settings_file()[0]} in {Path.cwd()}; {CONFIG_ENV} names another file)"


def database_source(settings: Settings) -> str:
    """The database as a log line shows it: the URL (password masked) and where it was set."""
    url = settings.database.url
    if "HORDE_LITE_DATABASE__URL" in os.environ:
        where = "HORDE_LITE_DATABASE__URL"
    elif url == default_database_url():
        where = "the default"
    else:
        where = "[database] url"
    return f"{masked(url)} ({where})"


def checked_settings() -> Settings:
    """The settings and the policies they select, or a StartupError saying what is wrong."""
    from horde_lite.policies.registry import load_policies

    try:
        settings = load_settings()
    except SettingsError as e:
        raise StartupError(str(e)) from None
    try:
        load_policies(settings.policies)  # a name not installed or a bad option
    except SettingsError as e:
        raise StartupError(f"{_policy_source(str(e))}: {e}") from None
    try:
        ModelSizes.from_settings(settings.kudos)  # the model reference file, if one is named
    except SettingsError as e:
        raise StartupError(f"{settings_source()}: {e}") from None
    return settings


def _policy_source(message: str) -> str:
    """Where the policy a message names was selected: its variable, else the settings file."""
    named = re.match(r"\[policies\] (\w+)", message)
    variable = f"HORDE_LITE_POLICIES__{named[1].upper()}" if named else ""
    if variable in os.environ:
        return variable
    path = _settings_file_read()
    return "the defaults" if path is None else str(path)


# --- the port --------------------------------------------------------------------------------


def check_port(host: str, port: int) -> None:
    """Bind (as uvicorn will, with SO_REUSEADDR) and let go: a port in use fails here, before the
    database is touched, instead of after migrations ran."""
    if not 1 <= port <= 65535:
        # The resolver takes the port modulo 65536 (99999 listens on 34463) and 0 picks any free
        # port: either way the server would answer somewhere the operator did not ask for.
        raise StartupError(f"--port {port}: not a TCP port; choose one from 1 to 65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise StartupError(f"--host {host}: not an address this machine has ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise StartupError(
                    f"port {port} on {host} is already in use (another horde-lite or another server);\n"
                    f"stop it or choose another port with --port"
                ) from None
            if e.errno == errno.EACCES:
                raise StartupError(
                    f"port {port} on {host}: permission denied (ports below 1024 need privileges); "
                    "choose another with --port"
                ) from None
            if e.errno == errno.EADDRNOTAVAIL:
                raise StartupError(f"--host {host}: not an address of this machine") from None
            raise StartupError(f"cannot listen on {host}:{port}: {e.strerror}") from None


# --- the database ----------------------------------------------------------------------------


def check_database(settings: Settings) -> None:
    """Reach the database without writing to it."""
    url = make_url(settings.database.url)
    if url.get_backend_name() == "sqlite":
        _check_sqlite(settings, url)
    else:
        asyncio.run(_check_postgres(settings, url))


def _check_sqlite(settings: Settings, url: URL) -> None:
    if not url.database or url.database == ":memory:":
        return
    path = Path(url.database)
    source = database_source(settings)
    if settings.database.url == default_database_url() and not path.parent.exists():
        return  # created on first use
    if not path.parent.is_dir():
        raise StartupError(
            f"the database {source}: the directory {path.parent.resolve()} does not exist;\n"
            "create it, or set [database] url / HORDE_LITE_DATABASE__URL to a file in an existing directory"
        )
    file_ok = not path.exists() or os.access(path, os.R_OK | os.W_OK)
    if not os.access(path.parent, os.W_OK | os.X_OK) or not file_ok:
        raise StartupError(
            f"the database {source}: {path.resolve()} is not writable by this user; "
            "fix its permissions or choose another file"
        )
    if path.exists():  # read-only: a file that is not a database is reported, not overwritten
        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
                conn.execute("select count(*) from sqlite_master").fetchone()
        except sqlite3.DatabaseError as e:
            raise StartupError(
                f"the database {source}: {path.resolve()} cannot be read as SQLite ({e})"
            ) from None


async def _check_postgres(settings: Settings, url: URL) -> None:
    import asyncpg

    where = f"{url.host or 'localhost'}:{url.port or 5432}"
    source = database_source(settings)
    try:
        conn = await asyncpg.connect(
            host=url.host, port=url.port, user=url.username, password=url.password,
            database=url.database, timeout=CONNECT_TIMEOUT, **_query_options(url),
        )  # fmt: skip
    except (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError) as e:
        raise StartupError(
            f"the database {source}: PostgreSQL at {where} refused the login: {e};\n"
            "fix the user or password in the URL"
        ) from None
    except asyncpg.InvalidCatalogNameError:
        raise StartupError(
            f"the database {source}: PostgreSQL at {where} has no database {url.database!r};\n"
            f"create it (createdb -h {url.host or 'localhost'} -U {url.username or 'postgres'} "
            f"{url.database}) or fix the URL"
        ) from None
    except TimeoutError:
        raise StartupError(
            f"the database {source}: no answer from {where} within {CONNECT_TIMEOUT:g} s;\n"
            "is PostgreSQL running there, and does a firewall let this machine in?"
        ) from None
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
        raise StartupError(
            f"the database {source}: cannot connect to PostgreSQL at {where}: {_root_cause(e)};\n"
            "is PostgreSQL running there? fix [database] url or HORDE_LITE_DATABASE__URL"
        ) from None
    await conn.close()


def _query_options(url: URL) -> dict[str, str]:
    """The URL's query options asyncpg understands the same way (ssl=require etc.)."""
    return {k: str(v) for k, v in url.query.items() if k in ("ssl", "sslmode")}


def _root_cause(error: BaseException) -> str:
    """The innermost reason, out of asyncpg's per-address ExceptionGroups and chained errors."""
    seen: BaseException = error
    while True:
        if isinstance(seen, BaseExceptionGroup) and seen.exceptions:
            seen = seen.exceptions[0]
        elif isinstance(seen, OSError) and seen.strerror is None and seen.__cause__ is not None:
            seen = seen.__cause__
        else:
            break
    if isinstance(seen, ConnectionRefusedError):
        return "connection refused"
    if isinstance(seen, socket.gaierror):
        return f"unknown host ({seen.strerror})"
    if isinstance(seen, OSError) and seen.strerror:
        return seen.strerror.lower()
    return str(seen) or type(seen).__name__


# --- what the process says first -------------------------------------------------------------


def first_line(settings: Settings, address: str) -> str:
    """The first line `horde-lite run` prints: version, address, database, settings, policies."""
    p = settings.policies
    policies = (
        f"speed_gate={p.speed_gate} allowance_curve={p.allowance_curve} shadow_metrics={p.shadow_metrics}"
    )
    return (
        f"horde-lite {__version__} on {address}; database {database_source(settings)}; "
        f"settings {settings_source()}; policies selected: {policies}"
    )


def server_address(host: str, port: int, fd: int | None, uds: str | None) -> str:
    if uds:
        return f"unix:{uds}"
    if fd is not None:
        return f"file descriptor {fd}"
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


# --- wiring into the CLI ---------------------------------------------------------------------


def fail(error: StartupError) -> NoReturn:
    """Print the error as the operator reads it and exit with status 2 (a usage/config error)."""
    click.echo(f"horde-lite: {error}", err=True)
    sys.exit(2)


def guard_run(run: click.Command) -> click.Command:
    """Put the checks in front of Litestar's `run`: settings, the port, the database, then the
    first line; only then does Litestar load the app (whose start-up may migrate)."""
    original = run.callback
    assert original is not None
    run.params.append(
        click.Option(
            ["--verbose"], is_flag=True, default=False,
            help=f"Say each migration applied at start-up on a line of its own ({VERBOSE_ENV}=1: the same).",
        )
    )  # fmt: skip

    @functools.wraps(original)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if kwargs.pop("verbose", False):
            os.environ[VERBOSE_ENV] = "1"
        try:
            settings = checked_settings()
            host, port, fd, uds = kwargs["host"], kwargs["port"], kwargs.get("fd"), kwargs.get("uds")
            if fd is None and not uds:
                check_port(host, port)
            check_database(settings)
        except StartupError as e:
            fail(e)
        click.echo(first_line(settings, server_address(host, port, fd, uds)), err=True)
        for warning in former_policy_options():
            click.echo(f"horde-lite: warning: {warning}", err=True)
        return original(*args, **kwargs)

    run.callback = checked
    return run
