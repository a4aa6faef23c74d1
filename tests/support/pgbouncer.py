"""A real PgBouncer in transaction pooling mode in front of a PostgreSQL server, for the tests that
must see what a pooler in front of the database does to the app, and for the bench (the
rehearsal's stack, bench/perf_pgbouncer.py): the one place that writes PgBouncer's ini, finds its
binary, starts it, waits for its port and stops it.

`Bouncer(server_url)` holds an ini, a userlist and a log in a temp dir of its own; `start()` runs
`pgbouncer` on a free 127.0.0.1 port and `url` is the same database's URL through it (its ini
serves every database of the server: `url_for`). Trust auth (the suite's server trusts loopback
logins too). PgBouncer refuses to run as root: as root it runs as `postgres` (via runuser or su,
as tests/support/postgres.py runs the server). `start_pgbouncer(url)` is the same as a context
manager, and `bouncer` the suite's fixture.

`require_pgbouncer()` reads `HORDE_LITE_REQUIRE_PGBOUNCER` (CI sets it): when true, a missing
binary fails the tests that need it instead of skipping them (`skip_or_fail`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import pytest
from sqlalchemy.engine import make_url

from tests.support.postgres import _as_user_prefix
from tests.support.required import required
from tests.support.required import skip_or_fail as required_or_skipped

ENV_REQUIRE = "HORDE_LITE_REQUIRE_PGBOUNCER"
SEARCHED = ("/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/bin/pgbouncer")
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
# Server connections per (database, user) pair: fewer than the app's concurrent transactions.
POOL_SIZE = 3
MAX_CLIENT_CONN = 1000


def require_pgbouncer() -> bool:
    return required(ENV_REQUIRE)


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test for want of `reason`; fail it instead when PgBouncer's tests are required."""
    required_or_skipped(ENV_REQUIRE, reason)


def find_pgbouncer() -> str | None:
    found = shutil.which("pgbouncer")
    if found:
        return found
    return next((path for path in SEARCHED if os.access(path, os.X_OK)), None)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class Bouncer:
    """PgBouncer (transaction mode) in front of `server_url`'s server. `pool_size`: its server
    connections per database; `login_retry`: seconds before it logs in again after a failed login
    (a server restarting), None for PgBouncer's default (15); `ignore_startup`: startup parameters
    it accepts and drops beyond `extra_float_digits` (asyncpg sends it)."""

    server_url: str
    pool_size: int = POOL_SIZE
    login_retry: int | None = None
    ignore_startup: tuple[str, ...] = ()
    port: int = field(default_factory=_free_port)
    root: Path = field(init=False)
    process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="horde-lite-pgb-", dir="/tmp"))

    @property
    def url(self) -> str:
        """`server_url`'s database through PgBouncer."""
        return make_url(self.server_url).set(port=self.port).render_as_string(hide_password=False)

    def url_for(self, database: str) -> str:
        return make_url(self.url).set(database=database).render_as_string(hide_password=False)

    @property
    def ini(self) -> Path:
        return self.root / "pgbouncer.ini"

    @property
    def log(self) -> Path:
        return self.root / "pgbouncer.log"

    @property
    def console(self) -> Path:
        """What it writes to stdout and stderr (the log's lines again, and any error at start)."""
        return self.root / "pgbouncer.out"

    def pid(self) -> int:
        """PgBouncer's own process (not runuser's)."""
        return int((self.root / "pgbouncer.pid").read_text().strip())

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def config(self) -> str:
        server = make_url(self.server_url)
        retry = [] if self.login_retry is None else [f"server_login_retry = {self.login_retry}"]
        return "\n".join([
            "[databases]",
            f"* = host={server.host or '127.0.0.1'} port={server.port or 5432}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {self.root / 'userlist.txt'}",
            "pool_mode = transaction",
            f"default_pool_size = {self.pool_size}",
            "min_pool_size = 0",
            "reserve_pool_size = 0",
            f"max_client_conn = {MAX_CLIENT_CONN}",
            f"max_db_connections = {self.pool_size}",
            "server_reset_query = DISCARD ALL",
            *retry,
            f"ignore_startup_parameters = {', '.join(('extra_float_digits', *self.ignore_startup))}",
            f"logfile = {self.log}",
            f"pidfile = {self.root / 'pgbouncer.pid'}",
            "",
        ])  # fmt: skip

    def start(self) -> None:
        """Start it and wait for its port; RuntimeError (with its log) when it does not listen."""
        binary = find_pgbouncer()
        if binary is None:
            raise FileNotFoundError("no pgbouncer binary on PATH or in /usr/sbin (apt-get install pgbouncer)")
        prefix = _as_user_prefix()
        if isinstance(prefix, str):
            raise RuntimeError(prefix)
        as_user, account = prefix
        user = make_url(self.server_url).username or "postgres"
        (self.root / "userlist.txt").write_text(f'"{user}" ""\n')
        self.ini.write_text(self.config())
        if account is not None:
            for path in (self.root, self.root / "userlist.txt", self.ini):
                os.chown(path, account.pw_uid, account.pw_gid)
        # Its console output goes to a file, never to a pipe: PgBouncer in the foreground writes every
        # log line to stderr as well, and once a pipe nobody reads holds 64 KiB (a database restart
        # logs hundreds of lines) its write blocks and the whole pooler stops answering.
        with self.console.open("wb") as console:
            self.process = subprocess.Popen(
                as_user([binary, str(self.ini)]), stdout=console, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while not _answers(self.port):
            if self.process.poll() is not None:
                out = self.console.read_text(errors="replace")
                raise RuntimeError(f"pgbouncer exited ({self.process.returncode}): {out} {self.log_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer not listening after {START_TIMEOUT:g} s: {self.log_text()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop it (if started) and remove its directory; safe to call more than once."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            self._signal(process, signal.SIGTERM)  # pgbouncer itself, not only runuser
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self._signal(process, signal.SIGKILL)
                process.wait(STOP_TIMEOUT)
        shutil.rmtree(self.root, ignore_errors=True)

    @staticmethod
    def _signal(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)


@contextmanager
def start_pgbouncer(
    db_url: str, *, ignore_startup: tuple[str, ...] = (), pool_size: int = POOL_SIZE
) -> Iterator[Bouncer]:
    """A started `Bouncer` in front of `db_url`'s server (its `url`: `db_url` through it), stopped
    at the end."""
    bouncer = Bouncer(db_url, pool_size=pool_size, ignore_startup=ignore_startup)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture(scope="module")
def bouncer(pg_url: str) -> Iterator[Bouncer]:
    """PgBouncer in front of the suite's PostgreSQL test database (skipped, or failed when
    required, without the binary)."""
    if find_pgbouncer() is None:
        skip_or_fail("no pgbouncer binary (apt-get install pgbouncer)")
    with start_pgbouncer(pg_url) as started:
        yield started
