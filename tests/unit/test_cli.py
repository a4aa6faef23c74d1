"""The operator commands (docs/reference/cli.md) against a real database of each kind: `database
upgrade`, `users create`, `users kudos`, `policies list`, and the line naming the database each one
uses. Most run the click commands in-process with click's CliRunner; one runs the installed
`horde-lite` console script (more in tests/integration/test_cli_process.py)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import select, text
from sqlalchemy.engine import make_url

from horde_lite import cli
from horde_lite.accounts.users import hash_key
from horde_lite.db import migrate
from horde_lite.db.engine import make_engine, make_sessionmaker
from horde_lite.db.models import InviteCode, KudosEvent, User, Worker
from horde_lite.settings import masked
from tests.support.cli import point_settings_at, query

HORDE_LITE = Path(sys.executable).with_name("horde-lite")


@pytest.fixture
def run(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Invoke a click command with the settings pointing at the test database."""
    point_settings_at(db_url, tmp_path, monkeypatch)

    def invoke(command: Any, *args: str) -> Result:
        return CliRunner().invoke(command, list(args), catch_exceptions=False)

    return invoke


def _user(url: str, name: str) -> User:
    rows = query(url, select(User).where(User.username == name))
    assert len(rows) == 1
    return rows[0][0]


def _ledger(url: str, user_id: int) -> list[tuple[float, str]]:
    events = select(KudosEvent.amount, KudosEvent.kind).where(KudosEvent.user_id == user_id)
    rows = query(url, events.order_by(KudosEvent.id))
    return [(amount, kind) for amount, kind in rows]


def test_users_create_prints_the_key_alone_on_the_last_line(run: Any, db_url: str) -> None:
    result = run(cli.users, "create", "alice", "--kudos", "250", "--trusted", "--moderator")
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    key = lines[-1]
    assert len(key) == 22
    assert key.strip() == key
    assert " " not in key
    user = _user(db_url, "alice")
    assert user.trusted is True
    assert user.moderator is True
    assert user.anonymous is False
    assert user.kudos == 250
    assert user.api_key_hash == hash_key(key)
    # The starting kudos went through the ledger.
    assert _ledger(db_url, user.id) == [(250.0, "grant")]
    # Nothing in the users table holds the key in clear.
    for row in query(db_url, text("SELECT * FROM users")):
        assert all(key not in str(value) for value in row)


def test_users_create_defaults_and_distinct_keys(run: Any, db_url: str) -> None:
    first = run(cli.users, "create", "bob").output.strip().splitlines()[-1]
    second = run(cli.users, "create", "carol").output.strip().splitlines()[-1]
    assert first != second
    bob = _user(db_url, "bob")
    assert (bob.kudos, bob.trusted, bob.moderator) == (0, False, False)
    assert _ledger(db_url, bob.id) == []


def test_users_create_refuses_a_taken_name(run: Any, db_url: str) -> None:
    assert run(cli.users, "create", "dave").exit_code == 0
    again = run(cli.users, "create", "dave")
    assert again.exit_code != 0
    assert "already exists" in again.output
    assert len(query(db_url, select(User.id).where(User.username == "dave"))) == 1


def test_invites_create_list_and_revoke(run: Any, db_url: str) -> None:
    made = run(cli.invites, "create", "--uses", "3", "--days", "0")
    assert made.exit_code == 0, made.output
    code = made.output.strip().splitlines()[-1]
    assert len(code) == 22
    assert "never expires" in made.output
    [(stored_hash, uses, expires)] = query(
        db_url, select(InviteCode.code_hash, InviteCode.uses, InviteCode.expires_at)
    )
    assert (stored_hash, uses, expires) == (hash_key(code), 3, None)
    assert code not in run(cli.invites, "list").output  # listed by its first characters only
    assert code[:4] in run(cli.invites, "list").output
    second = run(cli.invites, "create").output.strip().splitlines()[-1]
    listed = json.loads(run(cli.invites, "list", "--json").stdout)
    assert [(i["id"], i["state"], i["uses_left"]) for i in listed] == [(2, "active", 1), (1, "active", 3)]
    assert all(i["code"] is None for i in listed)

    assert run(cli.invites, "revoke", code).exit_code == 0  # by the code
    assert run(cli.invites, "revoke", "2").exit_code == 0  # by the id a listing shows
    listed = json.loads(run(cli.invites, "list", "--json").stdout)
    assert [i["state"] for i in listed] == ["revoked", "revoked"]
    assert second not in run(cli.invites, "list").output
    for bad in (("revoke", "nope"), ("create", "--uses", "0"), ("create", "--days", "-1")):
        refused = run(cli.invites, *bad)
        assert refused.exit_code != 0, bad
    assert len(query(db_url, select(InviteCode.id))) == 2


def test_users_kudos_sets_and_adds_through_the_ledger(run: Any, db_url: str) -> None:
    run(cli.users, "create", "erin", "--kudos", "100")
    user_id = _user(db_url, "erin").id

    added = run(cli.users, "kudos", "erin", "40", "--add")
    assert added.exit_code == 0, added.output
    assert "140" in added.output
    assert _user(db_url, "erin").kudos == 140

    lowered = run(cli.users, "kudos", f"erin#{user_id}", "30")
    assert lowered.exit_code == 0, lowered.output
    assert _user(db_url, "erin").kudos == 30

    events = _ledger(db_url, user_id)
    assert events == [(100.0, "grant"), (40.0, "grant"), (-110.0, "debit")]
    assert sum(amount for amount, _ in events) == _user(db_url, "erin").kudos


def test_users_kudos_unknown_user(run: Any) -> None:
    result = run(cli.users, "kudos", "nobody", "5")
    assert result.exit_code != 0
    assert "nobody" in result.output


def test_users_kudos_name_and_id_must_agree(run: Any, db_url: str) -> None:
    run(cli.users, "create", "frank")
    frank = _user(db_url, "frank")
    result = run(cli.users, "kudos", f"someone-else#{frank.id}", "5")
    assert result.exit_code != 0
    assert _user(db_url, "frank").kudos == 0


def test_users_set_changes_flags_and_the_workers_trust(run: Any, db_url: str) -> None:
    key = run(cli.users, "create", "gina").output.strip().splitlines()[-1]
    gina = _user(db_url, "gina")

    async def add_worker() -> None:
        engine = make_engine(db_url, null_pool=True)
        try:
            async with make_sessionmaker(engine)() as session, session.begin():
                session.add(
                    Worker(id="11111111-1111-4111-8111-111111111111", name="gina-w", owner_id=gina.id,
                           last_check_in=0.0, created_at=0.0, speed_samples=[])
                )  # fmt: skip
        finally:
            await engine.dispose()

    asyncio.run(add_worker())
    result = run(cli.users, "set", "gina", "--trusted", "--moderator")
    assert result.exit_code == 0, result.output
    assert (_user(db_url, "gina").trusted, _user(db_url, "gina").moderator) == (True, True)
    assert query(db_url, select(Worker.trusted).where(Worker.name == "gina-w")) == [(True,)]
    result = run(cli.users, "set", "gina", "--untrusted")
    assert result.exit_code == 0, result.output
    assert (_user(db_url, "gina").trusted, _user(db_url, "gina").moderator) == (False, True)
    assert query(db_url, select(Worker.trusted).where(Worker.name == "gina-w")) == [(False,)]
    assert _user(db_url, "gina").api_key_hash == hash_key(key)


def test_database_upgrade_reaches_head(run: Any, db_url: str) -> None:
    result = run(cli.database, "upgrade")
    assert result.exit_code == 0, result.output
    heads = migrate.heads()
    assert any(head in result.output for head in heads)
    assert asyncio.run(migrate.current(db_url)) in heads


def test_database_upgrade_creates_a_new_sqlite_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}"
    monkeypatch.setenv("HORDE_LITE_DATABASE__URL", url)
    assert asyncio.run(migrate.current(url)) is None
    result = CliRunner().invoke(cli.database, ["upgrade"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert asyncio.run(migrate.current(url)) in migrate.heads()
    assert query(url, select(User.id)) == []


def test_users_create_migrates_a_new_database_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"sqlite+aiosqlite:///{tmp_path / 'new.db'}"
    monkeypatch.setenv("HORDE_LITE_DATABASE__URL", url)
    result = CliRunner().invoke(cli.users, ["create", "first"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert _user(url, "first").api_key_hash == hash_key(result.output.strip().splitlines()[-1])


def test_policies_list_marks_the_selected_ones(run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HORDE_LITE_POLICIES__SPEED_GATE", "enforce_chat")
    result = run(cli.policies, "list")
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines() if line.strip()]
    selected = {(r[1], r[2]) for r in rows if r[0] == "*"}
    assert selected == {
        ("speed_gate", "enforce_chat"),
        ("allowance_curve", "estimated_wait"),
        ("shadow_metrics", "over_capacity"),
    }
    listed = {(r[-3], r[-2]) for r in rows}
    for kind, name in [
        ("speed_gate", "prefer_capable"),
        ("speed_gate", "enforce_all"),
        ("speed_gate", "off"),
        ("allowance_curve", "horde_queue"),
        ("allowance_curve", "jobs_per_thread"),
        ("shadow_metrics", "off"),
    ]:
        assert (kind, name) in listed
    assert "(horde-lite)" in result.output


def test_bad_settings_are_a_clean_cli_error(run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HORDE_LITE_LEASE__BASE_SECS", "3")
    result = CliRunner().invoke(cli.policies, ["list"])
    assert result.exit_code != 0
    assert "HORDE_LITE_LEASE__BASE_SECS" in result.output


@pytest.mark.slow
def test_console_script_users_create_and_policies_list(db_url: str, tmp_path: Path) -> None:
    """The installed `horde-lite` (the Litestar CLI preset to the app) carries our commands."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORDE_LITE_")}
    env["HORDE_LITE_DATABASE__URL"] = db_url
    created = subprocess.run(
        [str(HORDE_LITE), "users", "create", "grace", "--kudos", "7"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip().splitlines()[-1]
    assert len(key) == 22
    assert _user(db_url, "grace").api_key_hash == hash_key(key)
    listed = subprocess.run(
        [str(HORDE_LITE), "policies", "list"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert "prefer_capable" in listed.stdout


def test_users_create_refuses_reserved_names(run: Any, db_url: str) -> None:
    for name in ("Anonymous", "anonymous", "ann#3"):
        result = run(cli.users, "create", name)
        assert result.exit_code != 0, name
    assert query(db_url, select(User.id)) == []


# --- the database each command uses, named on stderr ------------------------------------------------


def _expected_line(db_url: str) -> str:
    return f"database: {make_url(db_url).render_as_string(hide_password=True)}"


@pytest.mark.parametrize(
    "args",
    [
        ("users", "create", "zoe"),
        ("users", "list"),
        ("users", "kudos", "zoe", "-5"),
        ("users", "set", "zoe", "--trusted"),
        ("users", "rotate-key", "zoe"),
        ("users", "delete", "zoe", "--yes"),
        ("database", "upgrade"),
        ("policies", "list"),
        ("policies", "history"),
        ("modes", "show"),
        ("modes", "set", "--invite-only"),
        ("modes", "history"),
        ("whatif", "--speed-gate", "off"),
    ],
)
def test_every_database_command_names_its_database_once_on_stderr(
    run: Any, db_url: str, args: tuple[str, ...]
) -> None:
    if args[:2] != ("users", "create"):
        assert run(cli.users, "create", "zoe").exit_code == 0
    result = CliRunner().invoke(cli.cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [_expected_line(db_url)]
    assert "database:" not in result.stdout


def test_commands_without_a_database_name_none(run: Any, tmp_path: Path) -> None:
    for args in (
        ["version"],
        ["--version"],
        ["users", "--help"],
        ["openapi", "-o", str(tmp_path / "s.json")],
    ):
        result = CliRunner().invoke(cli.cli, args, catch_exceptions=False)
        assert result.exit_code == 0, (args, result.output)
        assert "database:" not in result.output, args


def test_shown_url_masks_the_password_and_makes_sqlite_paths_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert masked("postgresql+asyncpg://horde:s3cret@db.example:5432/horde") == (
        "postgresql+asyncpg://horde:***@db.example:5432/horde"
    )
    assert masked("postgresql+asyncpg://horde@db.example/horde") == (
        "postgresql+asyncpg://horde@db.example/horde"
    )
    assert masked("sqlite+aiosqlite:///horde_lite.db") == f"sqlite+aiosqlite:///{tmp_path}/horde_lite.db"
    assert masked("sqlite+aiosqlite:///data/../x.db") == f"sqlite+aiosqlite:///{tmp_path}/x.db"
    assert masked("sqlite+aiosqlite:////var/lib/h.db") == "sqlite+aiosqlite:////var/lib/h.db"
    assert masked("not a url :pw@host") == "host"


def test_a_relative_sqlite_path_is_announced_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HORDE_LITE_DATABASE__URL", "sqlite+aiosqlite:///rel.db")
    result = CliRunner().invoke(cli.users, ["list"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [f"database: sqlite+aiosqlite:///{tmp_path / 'rel.db'}"]
    assert (tmp_path / "rel.db").exists()


def test_an_unreachable_database_is_a_clean_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HORDE_LITE_DATABASE__URL", f"postgresql+asyncpg://u:pw@127.0.0.1:{port}/none")
    result = CliRunner().invoke(cli.users, ["list"])
    assert result.exit_code == 2
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert f"cannot connect to PostgreSQL at 127.0.0.1:{port}: connection refused" in result.stderr
    assert len(result.stderr.splitlines()) == 3  # the database line, then the two-line error
    assert result.stderr.splitlines()[0] == f"database: postgresql+asyncpg://u:***@127.0.0.1:{port}/none"
    assert "pw@" not in result.output


async def test_openapi_writes_the_schema_the_server_serves(client: Any, run: Any, tmp_path: Path) -> None:
    served = await client.http.get("/api/swagger.json")
    assert served.status_code == 200
    written = run(cli.openapi, "--output", str(tmp_path / "openapi.json"))
    assert written.exit_code == 0, written.output
    assert json.loads((tmp_path / "openapi.json").read_text()) == served.json()
    to_stdout = run(cli.openapi)
    assert json.loads(to_stdout.stdout) == served.json()


def test_policies_history_numbers_each_switch_by_the_version_use_printed(run: Any) -> None:
    """Switches of two kinds interleave, so a kind's versions are not the log's row numbers."""
    said = []
    for kind, name in [("speed_gate", "enforce_all"), ("allowance_curve", "horde_queue"),
                       ("speed_gate", "off"), ("speed_gate", "enforce_chat")]:  # fmt: skip
        result = run(cli.cli, "policies", "use", kind, name)
        assert result.exit_code == 0, result.output
        version = re.search(r"\(version (\d+)\)", result.stdout)
        assert version is not None, result.stdout
        said.append(f"{kind} version {version[1]}: ")
    assert said[2:] == ["speed_gate version 2: ", "speed_gate version 3: "]
    history = run(cli.cli, "policies", "history")
    assert history.exit_code == 0, history.output
    lines = history.stdout.splitlines()
    assert len(lines) == 4
    for line, prefix in zip(lines, reversed(said), strict=True):  # newest first
        assert prefix in line, (prefix, history.stdout)
