"""Start-up as an operator meets it (docs/reference/operators.md, "Start-up checks"): the real
`horde-lite` console script in a subprocess, one failure at a time. Each failure exits with status 2
before anything is written, in at most two plain lines that name the cause; a good start says first
which version, address, database and policies it runs."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import asyncpg
import httpx
import pytest
from sqlalchemy.engine import make_url

from horde_lite import __version__
from horde_lite.db import migrate
from horde_lite.heap import FULL_EVERY
from tests.conftest import is_postgres
from tests.support.fake_backend import free_port

HORDE_LITE = Path(sys.executable).with_name("horde-lite")


def clean_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    """No HORDE_LITE_ variables from the test run; the user's data directory under tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORDE_LITE_")}
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    env.update(settings)
    return env


def on_database(tmp_path: Path, url: str) -> subprocess.CompletedProcess[str]:
    """`horde-lite run` on a free port with the database URL from the environment."""
    return start(tmp_path, clean_env(tmp_path, HORDE_LITE_DATABASE__URL=url), *run_args(free_port()))


def start(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HORDE_LITE), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )


def run_on(tmp_path: Path, url: str) -> subprocess.CompletedProcess[str]:
    """`horde-lite run` on a free port, the database URL from the environment."""
    return start(tmp_path, clean_env(tmp_path, HORDE_LITE_DATABASE__URL=url), *run_args(free_port()))


def refused(result: subprocess.CompletedProcess[str]) -> str:
    """The error as the operator sees it: status 2, no traceback, at most two lines."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("horde-lite: ")
    return result.stderr.strip()


def run_args(port: int) -> tuple[str, ...]:
    return ("run", "--host", "127.0.0.1", "--port", str(port))


def default_db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "horde-lite" / "horde_lite.db"


# --- configuration ---------------------------------------------------------------------------


@pytest.mark.slow
def test_an_unknown_key_in_the_settings_file(tmp_path: Path) -> None:
    (tmp_path / "litestar.toml").write_text("[database]\nurll = 'sqlite+aiosqlite:///x.db'\n")
    message = refused(start(tmp_path, clean_env(tmp_path), *run_args(free_port())))
    assert message == (
        f"horde-lite: {tmp_path / 'litestar.toml'}: unknown key 'urll' in [database] "
        "(its keys: url, echo, null_pool, pgbouncer, listen_url)"
    )
    assert not default_db(tmp_path).exists()


@pytest.mark.slow
def test_a_bad_variable_is_blamed_on_the_variable(tmp_path: Path) -> None:
    env = clean_env(tmp_path, HORDE_LITE_LEASE__BASE_SECONDS="soon")
    message = refused(start(tmp_path, env, *run_args(free_port())))
    assert message == (
        "horde-lite: HORDE_LITE_LEASE__BASE_SECONDS='soon': [lease] base_seconds: "
        "expected a number, got a string"
    )


@pytest.mark.slow
def test_postgres_scheme_gets_the_driver_hint(tmp_path: Path) -> None:
    env = clean_env(tmp_path, HORDE_LITE_DATABASE__URL="postgres://horde:s3cret@127.0.0.1:5432/horde")
    message = refused(start(tmp_path, env, *run_args(free_port())))
    assert "write postgresql+asyncpg://horde:***@127.0.0.1:5432/horde" in message
    assert "s3cret" not in message


@pytest.mark.slow
def test_an_uninstalled_policy_lists_the_installed_ones(tmp_path: Path) -> None:
    env = clean_env(tmp_path, HORDE_LITE_POLICIES__SPEED_GATE="fastest")
    message = refused(start(tmp_path, env, *run_args(free_port())))
    assert message.startswith(
        "horde-lite: HORDE_LITE_POLICIES__SPEED_GATE: [policies] speed_gate = 'fastest' is not installed; "
    )
    assert "prefer_capable" in message
    (tmp_path / "litestar.toml").write_text("[policies.allowance_curve]\nname = 'steepest'\n")
    message = refused(start(tmp_path, clean_env(tmp_path), *run_args(free_port())))
    in_file = f"horde-lite: {tmp_path / 'litestar.toml'}: [policies] allowance_curve = 'steepest'"
    assert message.startswith(in_file)


# --- the database ----------------------------------------------------------------------------


@pytest.mark.slow
def test_unreachable_postgresql_names_the_masked_url(tmp_path: Path) -> None:
    url = f"postgresql+asyncpg://horde:s3cret@127.0.0.1:{free_port()}/horde"
    message = refused(run_on(tmp_path, url))
    assert make_url(url).render_as_string(hide_password=True) in message
    assert "connection refused" in message
    assert "HORDE_LITE_DATABASE__URL" in message
    assert "s3cret" not in message


def test_a_missing_postgresql_database_says_how_to_create_it(tmp_path: Path, pg_url: str) -> None:
    url = make_url(pg_url).set(database="horde_lite_no_such_database").render_as_string(hide_password=False)
    message = refused(run_on(tmp_path, url))
    assert "has no database 'horde_lite_no_such_database'" in message
    assert "createdb" in message


@pytest.mark.slow
def test_a_sqlite_file_in_a_missing_directory(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'nowhere' / 'horde.db'}"
    message = refused(run_on(tmp_path, url))
    assert f"the directory {tmp_path / 'nowhere'} does not exist" in message
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.slow
def test_a_port_in_use_is_found_before_the_database_is_touched(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        message = refused(start(tmp_path, clean_env(tmp_path), *run_args(port)))
    assert f"port {port} on 127.0.0.1 is already in use" in message
    assert not default_db(tmp_path).exists()  # no migration ran, no file was made


@pytest.mark.slow
@pytest.mark.parametrize("port", ["99999", "65536", "0", "-1", "abc", "80x", ""])
def test_a_port_outside_1_to_65535_is_refused(tmp_path: Path, port: str) -> None:
    """The resolver would take 99999 modulo 65536 and 0 as any port: the server would listen
    somewhere else, silently."""
    message = refused(start(tmp_path, clean_env(tmp_path), "run", "--host", "127.0.0.1", "--port", port))
    assert len(message.splitlines()) == 1, message
    if port.lstrip("-").isdigit():
        assert message == f"horde-lite: --port {port}: not a TCP port; choose one from 1 to 65535"
    else:
        assert f"'{port}' is not a valid integer" in message
    assert not default_db(tmp_path).exists()


# --- a good start ----------------------------------------------------------------------------


@contextmanager
def server(
    tmp_path: Path, env: dict[str, str], port: int, *extra: str
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    log = tmp_path / f"server-{port}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(HORDE_LITE), *run_args(port), *extra], cwd=tmp_path, env=env, stdout=out,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            try:
                if (
                    httpx.get(f"http://127.0.0.1:{port}/api/v2/status/heartbeat", timeout=2).status_code
                    == 200
                ):
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        yield process, log
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


@pytest.mark.slow
def test_two_servers_on_one_port(tmp_path: Path, db_url: str) -> None:
    port = free_port()
    env = clean_env(tmp_path, HORDE_LITE_DATABASE__URL=db_url)
    with server(tmp_path, env, port) as (process, log):
        first = log.read_text().splitlines()[0]
        masked = make_url(db_url).render_as_string(hide_password=True)
        assert first.startswith(f"horde-lite {__version__} on http://127.0.0.1:{port}; ")
        assert f"database {masked} (HORDE_LITE_DATABASE__URL)" in first
        assert "policies selected: speed_gate=prefer_capable allowance_curve=estimated_wait" in first
        # The server process itself (each one, with --wc) names what it runs, policies from the database.
        assert f"horde-lite {__version__} process {process.pid}: database {masked}; policies in force: " in (
            log.read_text()
        )

        message = refused(start(tmp_path, env, *run_args(port)))
        assert f"port {port} on 127.0.0.1 is already in use" in message
        # The first server is unharmed.
        assert httpx.get(f"http://127.0.0.1:{port}/api/v2/status/heartbeat", timeout=5).status_code == 200


@pytest.fixture
def fresh_url(db_url: str, tmp_path: Path) -> Iterator[str]:
    """An empty database of `db_url`'s kind, never migrated: a new SQLite file, or a new database
    on the suite's PostgreSQL server (dropped afterwards)."""
    if not is_postgres(db_url):
        yield f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}"
        return
    name = f"horde_lite_fresh_{uuid.uuid4().hex[:12]}"
    server_url = make_url(db_url)

    async def admin(statement: str) -> None:
        conn = await asyncpg.connect(
            host=server_url.host, port=server_url.port or 5432, user=server_url.username,
            password=server_url.password, database=server_url.database,
        )  # fmt: skip
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    try:
        yield server_url.set(database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


FORMER_OPTIONS = (
    '[policies]\ncandidate_allowance_curve = "horde_queue"\n'
    "[policies.options.candidate_allowance_curve]\nmaximum = 300\n"
)


@pytest.mark.slow
@pytest.mark.parametrize("verbose", [False, True], ids=["short", "verbose"])
def test_a_fresh_database_is_migrated_in_one_line_unless_verbose(
    tmp_path: Path, fresh_url: str, verbose: bool
) -> None:
    (tmp_path / "litestar.toml").write_text(FORMER_OPTIONS)
    env = clean_env(tmp_path, HORDE_LITE_DATABASE__URL=fresh_url)
    port = free_port()
    with server(tmp_path, env, port, *(["--verbose"] if verbose else [])) as (_, log):
        lines = log.read_text().splitlines()
    steps = migrate.pending(None)
    said = [line for line in lines if "migration(s) applied" in line]
    assert len(said) == 1, lines
    assert f"database created: {len(steps)} migration(s) applied, empty -> {steps[-1]}" in said[0]
    each = [line for line in lines if "Running upgrade" in line]
    alembic = [line for line in lines if "alembic" in line]
    if verbose:
        assert len(each) == len(steps), lines
        assert "--verbose" not in said[0]
    else:
        assert (each, alembic) == ([], []), lines
        assert "(`horde-lite run --verbose` or HORDE_LITE_VERBOSE=1 lists them)" in said[0]
    # Then where it listens and which database, after the migrations.
    listening = next(i for i, line in enumerate(lines) if f"running on http://127.0.0.1:{port}" in line)
    named = next(i for i, line in enumerate(lines) if "process" in line and "database" in line)
    assert lines.index(said[0]) < named < listening
    # The former place of a candidate's options is read, and named for moving, before the server starts.
    [warning] = [line for line in lines if line.startswith("horde-lite: warning: ")]
    assert "[policies.options.candidate_allowance_curve] is the former place" in warning
    assert lines.index(warning) < lines.index(said[0])


@pytest.mark.slow
def test_the_default_database_is_the_same_from_any_directory(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    created = start(tmp_path / "one", env, "users", "create", "alice")
    assert created.returncode == 0, created.stderr
    expected = f"sqlite+aiosqlite:///{default_db(tmp_path)}"
    assert expected in created.stderr
    # From another directory: the same file, so the same user.
    moved = start(tmp_path / "two", env, "users", "kudos", "alice", "50")
    assert moved.returncode == 0, moved.stderr
    assert expected in moved.stderr
    assert "now has 50 kudos" in moved.stdout


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.slow
def test_a_worker_names_itself_first(tmp_path: Path) -> None:
    # Started with SIGINT ignored, as a shell starts a background job: the first line comes once
    # the worker handles the signal itself, so the SIGINT sent right after it stops the worker.
    process = subprocess.Popen(
        [str(HORDE_LITE), "worker", "--horde", f"http://127.0.0.1:{free_port()}", "--key", "k" * 22,
         "--name", "first-line", "--simulate", "20", "--model", "m"],
        cwd=tmp_path, env=clean_env(tmp_path), stderr=subprocess.PIPE, text=True,
        preexec_fn=_ignore_sigint,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        first = process.stderr.readline()
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(30)
    assert f"horde-lite worker {__version__}: first-line for the horde at http://127.0.0.1:" in first
    assert "backend simulated at 20 tokens/s; models m" in first


_FREEZE_PROBE = """
import asyncio, gc, sys
import msgspec
from litestar.testing import AsyncTestClient
from horde_lite.app import create_app
from horde_lite.settings import Settings

async def main():
    counts = [gc.get_threshold()[2], gc.get_freeze_count()]
    for _ in range(2):  # a second app in the same process freezes nothing more (the count only
        # falls as frozen objects are freed)
        app = create_app(msgspec.convert({"database": {"url": sys.argv[1]}}, Settings), run_sweeper=False)
        async with AsyncTestClient(app) as client:
            assert (await client.get("/api/v2/status/heartbeat")).status_code == 200
            counts.append(gc.get_freeze_count())
    print(*counts, gc.get_threshold()[2])

asyncio.run(main())
"""


@pytest.mark.slow
def test_a_started_server_keeps_its_start_up_objects_out_of_full_collections(db_url: str) -> None:
    """horde_lite/heap.py: once started, a process freezes what it holds (modules, the app), so the
    cyclic collector's full passes skip them; once per process. Full collections are spaced out."""
    out = subprocess.run([sys.executable, "-c", _FREEZE_PROBE, db_url], capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    spacing_before, before, first, second, spacing = (int(n) for n in out.stdout.split())
    assert (spacing_before, spacing) == (10, FULL_EVERY)  # CPython's default, then the server's
    assert before == 0
    assert first > 50_000  # the imported modules and the app, not a handful
    assert second <= first
