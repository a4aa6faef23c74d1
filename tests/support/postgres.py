"""Find a PostgreSQL server for the test suite, or start a throwaway one.

`resolve_postgres()` is called once per test session (by tests/conftest.py). It tries, in order:

(a) `HORDE_LITE_TEST_POSTGRES_URL`, when set: that server and no other. If it does not answer, the
    result has no URL (the reason says so) rather than silently testing somewhere else.
(b) the default `postgresql+asyncpg://postgres@127.0.0.1:5432/test` (CI's service, and most
    developer setups), when a real login works.
(c) a throwaway server: `initdb` into a fresh temp dir and `pg_ctl start` on a free port of
    127.0.0.1, with durability off for speed. Binaries come from PATH or the newest
    /usr/lib/postgresql/*/bin. PostgreSQL refuses to run as root, so as root the server runs as the
    `postgres` user (via runuser or su). Takes about 2-5 s; `stop()` shuts it down and removes it.
(d) otherwise no URL, and a reason a human can act on.

Private knobs, for testing this module and for odd machines:
- `HORDE_LITE_TEST_POSTGRES_THROWAWAY=1` skips (b), so (c) is exercised even when a server runs.
- `HORDE_LITE_TEST_POSTGRES_THROWAWAY=0` skips (c): never start a server.

`require_postgres()` reads `HORDE_LITE_REQUIRE_POSTGRES` (CI sets it): when true, a missing
PostgreSQL must fail the run instead of skipping the PostgreSQL half.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import glob
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

import asyncpg
from sqlalchemy.engine import URL, make_url

from tests.support.required import required

ENV_URL = "HORDE_LITE_TEST_POSTGRES_URL"
ENV_REQUIRE = "HORDE_LITE_REQUIRE_POSTGRES"
ENV_THROWAWAY = "HORDE_LITE_TEST_POSTGRES_THROWAWAY"
DEFAULT_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
CONNECT_TIMEOUT = 5.0


def _noop() -> None:
    return None


@dataclass(frozen=True)
class PostgresTarget:
    """Where the PostgreSQL half of the suite runs.

    `url` is a SQLAlchemy async URL, or None when there is no usable server; `reason` is one human
    sentence saying where the URL came from or why there is none; `stop()` releases what was started
    (a no-op for servers we did not start; safe to call more than once).
    """

    url: str | None
    reason: str
    stop: Callable[[], None] = field(default=_noop)


def require_postgres() -> bool:
    """True when the environment demands PostgreSQL tests (CI): a missing server is then a failure."""
    return required(ENV_REQUIRE)


def _as_async_url(raw: str) -> URL:
    url = make_url(raw)
    if url.drivername in {"postgresql", "postgres"}:  # accept a plain libpq-style URL too
        url = url.set(drivername="postgresql+asyncpg")
    return url


def _shown(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def _run_coro(coro_factory: Callable[[], object]) -> object:
    """asyncio.run, but also usable when the caller is already inside an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_factory())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(coro_factory())).result()


def _connect_kwargs(url: URL) -> dict[str, object]:
    return {
        "host": url.host or "127.0.0.1",
        "port": url.port or 5432,
        "user": url.username or "postgres",
        "password": url.password,
        "database": url.database or "postgres",
        "timeout": CONNECT_TIMEOUT,
    }


def _login_error(url: URL) -> str | None:
    """None when a real login (not just a TCP connect) succeeds, else a short description of the error."""

    async def attempt() -> None:
        conn = await asyncpg.connect(**_connect_kwargs(url))
        try:
            await conn.fetchval("SELECT 1")
        finally:
            await conn.close()

    try:
        _run_coro(attempt)
    except Exception as exc:  # any failure means "not usable"; the message tells the human why
        return f"{type(exc).__name__}: {exc}".strip().rstrip(":")
    return None


# --------------------------------------------------------------------------- throwaway server


def _find_binaries() -> tuple[str, str] | None:
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl:
        return initdb, pg_ctl

    def version(path: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", path.split("/")[-2])) or (0,)

    for bindir in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        initdb, pg_ctl = os.path.join(bindir, "initdb"), os.path.join(bindir, "pg_ctl")
        if os.access(initdb, os.X_OK) and os.access(pg_ctl, os.X_OK):
            return initdb, pg_ctl
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _as_user_prefix() -> tuple[Callable[[list[str]], list[str]], pwd.struct_passwd | None] | str:
    """How to run server binaries: directly, or (as root) as `postgres`. A string means: impossible."""
    if os.geteuid() != 0:
        return (lambda argv: argv), None
    try:
        account = pwd.getpwnam("postgres")
    except KeyError:
        return "running as root and there is no `postgres` user to run the server as"
    if shutil.which("runuser"):
        return (lambda argv: ["runuser", "-u", "postgres", "--", *argv]), account
    if shutil.which("su"):
        return (lambda argv: ["su", "postgres", "-s", "/bin/sh", "-c", shlex.join(argv)]), account
    return "running as root and neither runuser nor su is available to switch to `postgres`"


def _tail(path: str, lines: int = 8) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return "".join(fh.readlines()[-lines:]).strip()
    except OSError:
        return ""


# Durability off: a throwaway server's data is gone when it stops anyway.
FAST_OPTIONS = "-c fsync=off -c full_page_writes=off -c synchronous_commit=off"


@dataclass
class ThrowawayServer:
    """A private PostgreSQL server: `initdb` into a fresh temp dir, then `pg_ctl` start, restart and
    stop on a free port of 127.0.0.1 (as `postgres` when we are root). Also used by
    bench/rehearsal.py, which restarts it under load and runs PgBouncer beside it as the same user."""

    root: str
    pg_ctl: str
    as_user: Callable[[list[str]], list[str]]
    port: int
    options: str
    started: bool = False

    @property
    def data(self) -> str:
        return os.path.join(self.root, "data")

    @property
    def log(self) -> str:
        return os.path.join(self.root, "server.log")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}"

    @classmethod
    def create(cls, options: str = FAST_OPTIONS) -> ThrowawayServer | str:
        """`initdb` a new cluster (not started); a string says why it could not be made."""
        binaries = _find_binaries()
        if binaries is None:
            return "no initdb/pg_ctl on PATH or in /usr/lib/postgresql/*/bin to start a throwaway server"
        initdb, pg_ctl = binaries
        prefix = _as_user_prefix()
        if isinstance(prefix, str):
            return prefix
        as_user, account = prefix
        # /tmp keeps the socket path short (sockets are limited to ~100 bytes) and is reachable by
        # `postgres` even when root's TMPDIR is private.
        base = "/tmp" if os.access("/tmp", os.W_OK) else None
        root = tempfile.mkdtemp(prefix="horde-lite-pg-", dir=base)
        if account is not None:
            os.chown(root, account.pw_uid, account.pw_gid)
        server = cls(root=root, pg_ctl=pg_ctl, as_user=as_user, port=_free_port(), options=options)
        argv = [initdb, "-D", server.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale",
                "--no-sync"]  # fmt: skip
        try:
            subprocess.run(as_user(argv), capture_output=True, text=True, check=True, timeout=120)
        except Exception as exc:  # whatever went wrong, clean up and say why
            shutil.rmtree(root, ignore_errors=True)
            return f"a throwaway server failed at initdb: {str(getattr(exc, 'stderr', None) or exc).strip()}"
        return server

    def _pg_ctl(self, *argv: str, timeout: float = 90) -> None:
        subprocess.run(self.as_user([self.pg_ctl, "-D", self.data, *argv]), capture_output=True, text=True,
                       check=True, timeout=timeout)  # fmt: skip

    def _start_options(self) -> list[str]:
        # The log file too: without it the server would write to (and hold open) our pipes.
        return ["-l", self.log, "-o", f"-p {self.port} -h 127.0.0.1 -k {self.root} {self.options}"]

    def start(self) -> None:
        self.started = True  # from here on a (half-)started server must be stopped
        self._pg_ctl(*self._start_options(), "-w", "-t", "60", "start")

    def restart(self) -> None:
        """A fast restart (`-m fast`: sessions are disconnected, open transactions rolled back)."""
        self._pg_ctl(*self._start_options(), "-m", "fast", "-w", "-t", "60", "restart")

    def stop(self) -> None:
        """Stop the server (if started) and remove its directory; safe to call more than once."""
        if self.started:
            self.started = False
            argv = [self.pg_ctl, "-D", self.data, "-m", "fast", "-w", "-t", "30", "stop"]
            subprocess.run(self.as_user(argv), capture_output=True, check=False, timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)


def _start_throwaway() -> PostgresTarget | str:
    """Start a private server; the PostgresTarget on success, else a string saying why not."""
    server = ThrowawayServer.create()
    if isinstance(server, str):
        return server
    try:
        step = "pg_ctl start"
        server.start()
        step = "CREATE DATABASE test"

        async def create_test_db() -> None:
            conn = await asyncpg.connect(**_connect_kwargs(make_url(server.url())))
            try:
                await conn.execute("CREATE DATABASE test")
            finally:
                await conn.close()

        _run_coro(create_test_db)
    except Exception as exc:  # whatever went wrong, clean up and say why
        # pg_ctl says little on stderr; the server log says why it did not start.
        detail = " | ".join(
            filter(None, [str(getattr(exc, "stderr", None) or exc).strip(), _tail(server.log)])
        )
        server.stop()
        return f"a throwaway server failed at {step}: {detail}"

    atexit.register(server.stop)  # a safety net if the caller forgets; stop() is idempotent
    url = server.url("test")
    return PostgresTarget(
        url=url,
        reason=f"started a throwaway PostgreSQL ({os.path.dirname(server.pg_ctl)}) at {url}, "
        f"data in {server.root}",
        stop=server.stop,
    )


# --------------------------------------------------------------------------- entry point


def resolve_postgres() -> PostgresTarget:
    """Pick the PostgreSQL server for this test session (see the module docstring for the order)."""
    explicit = os.environ.get(ENV_URL, "").strip()
    if explicit:
        url = _as_async_url(explicit)
        error = _login_error(url)
        if error is None:
            return PostgresTarget(
                url=url.render_as_string(hide_password=False), reason=f"{ENV_URL}={_shown(url)}"
            )
        return PostgresTarget(url=None, reason=f"{ENV_URL}={_shown(url)} is unreachable ({error})")

    throwaway = os.environ.get(ENV_THROWAWAY, "").strip().lower()
    default_error = f"the default server was not tried ({ENV_THROWAWAY}={throwaway})"
    if throwaway not in {"1", "true", "yes"}:
        default = make_url(DEFAULT_URL)
        error = _login_error(default)
        if error is None:
            return PostgresTarget(url=DEFAULT_URL, reason=f"the default server at {DEFAULT_URL} answered")
        default_error = f"nothing usable at {DEFAULT_URL} ({error})"

    if throwaway in {"0", "false", "no"}:
        return PostgresTarget(url=None, reason=f"no PostgreSQL: {default_error}; {ENV_THROWAWAY}=0")
    started = _start_throwaway()
    if isinstance(started, PostgresTarget):
        return started
    return PostgresTarget(
        url=None,
        reason=f"no PostgreSQL: {default_error}; {started}; set {ENV_URL} to a server to test on",
    )
