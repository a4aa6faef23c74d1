"""A real PgBouncer in transaction pooling mode in front of the suite's PostgreSQL, for the tests
(and the bench) that must see what a pooler in front of the database does to the app.

`start_pgbouncer(url)` writes an ini, a userlist and a log in a temp dir, starts `pgbouncer` on a
free 127.0.0.1 port and returns the same database's URL through it. Trust auth (the suite's
server trusts loopback logins too); `default_pool_size` is small so a handful of server
connections really are shared between many app connections. PgBouncer refuses to run as root: as
root it runs as `postgres` (via runuser or su, as tests/support/postgres.py runs the server).

`require_pgbouncer()` reads `HORDE_LITE_REQUIRE_PGBOUNCER` (CI sets it): when true, a missing
binary fails the tests that need it instead of skipping them.
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
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.support.postgres import _as_user_prefix

ENV_REQUIRE = "HORDE_LITE_REQUIRE_PGBOUNCER"
SEARCHED = ("/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/bin/pgbouncer")
START_TIMEOUT = 20.0
# Server connections per (database, user) pair: fewer than the app's concurrent transactions.
POOL_SIZE = 3


def require_pgbouncer() -> bool:
    return os.environ.get(ENV_REQUIRE, "").strip().lower() in {"1", "true", "yes"}


def find_pgbouncer() -> str | None:
    found = shutil.which("pgbouncer")
    if found:
        return found
    return next((path for path in SEARCHED if os.access(path, os.X_OK)), None)


@dataclass(frozen=True)
class Bouncer:
    url: str  # the database's SQLAlchemy URL through PgBouncer
    port: int
    log: Path

    def pid(self) -> int:
        """PgBouncer's own process (not runuser's)."""
        return int((self.log.parent / "pgbouncer.pid").read_text().strip())

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ini(*, port: int, host: str, server_port: int, root: Path, ignored: tuple[str, ...], pool: int) -> str:
    return f"""\
[databases]
* = host={host} port={server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {root / "userlist.txt"}
pool_mode = transaction
default_pool_size = {pool}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
max_db_connections = {pool}
server_reset_query = DISCARD ALL
ignore_startup_parameters = {", ".join(("extra_float_digits", *ignored))}
logfile = {root / "pgbouncer.log"}
pidfile = {root / "pgbouncer.pid"}
"""


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@contextmanager
def start_pgbouncer(
    db_url: str, *, ignore_startup: tuple[str, ...] = (), pool_size: int = POOL_SIZE
) -> Iterator[Bouncer]:
    """PgBouncer (transaction mode) in front of `db_url`'s server; yields the URL through it.
    `ignore_startup`: startup parameters it accepts (and drops) beyond the usual one; `pool_size`:
    its server connections."""
    binary = find_pgbouncer()
    if binary is None:
        raise FileNotFoundError("no pgbouncer binary on PATH or in /usr/sbin (apt-get install pgbouncer)")
    prefix = _as_user_prefix()
    if isinstance(prefix, str):
        raise RuntimeError(prefix)
    as_user, account = prefix
    url = make_url(db_url)
    root = Path(tempfile.mkdtemp(prefix="horde-lite-pgb-", dir="/tmp"))
    port = _free_port()
    (root / "userlist.txt").write_text(f'"{url.username or "postgres"}" ""\n')
    ini = root / "pgbouncer.ini"
    host, server_port = url.host or "127.0.0.1", url.port or 5432
    ini.write_text(
        _ini(port=port, host=host, server_port=server_port, root=root, ignored=ignore_startup, pool=pool_size)
    )
    if account is not None:
        for path in (root, root / "userlist.txt", ini):
            os.chown(path, account.pw_uid, account.pw_gid)
    process = subprocess.Popen(
        as_user([binary, str(ini)]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    through = url.set(port=port).render_as_string(hide_password=False)
    bouncer = Bouncer(url=through, port=port, log=root / "pgbouncer.log")
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _answers(port):
            if process.poll() is not None:
                out = process.stdout.read().decode(errors="replace") if process.stdout else ""
                raise RuntimeError(f"pgbouncer exited ({process.returncode}): {out} {bouncer.log_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer not listening after {START_TIMEOUT:g} s: {bouncer.log_text()}")
            time.sleep(0.05)
        yield bouncer
    finally:
        _signal_group(process, signal.SIGTERM)  # pgbouncer itself, not only runuser
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait(10)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def bouncer(pg_url: str) -> Iterator[Bouncer]:
    """PgBouncer in front of the suite's PostgreSQL test database (skipped, or failed when
    required, without the binary)."""
    if find_pgbouncer() is None:
        reason = "no pgbouncer binary (apt-get install pgbouncer)"
        if require_pgbouncer():
            pytest.fail(f"PgBouncer is required ({ENV_REQUIRE}) but missing: {reason}")
        pytest.skip(f"PgBouncer tests skipped: {reason}")
    with start_pgbouncer(pg_url) as started:
        yield started
