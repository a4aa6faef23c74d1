"""The installed `horde-lite` console script as an operator runs it (docs/reference/cli.md): its
own help (horde_lite's commands first, Litestar's unrelated ones gone), its version, negative kudos,
the database it names on stderr, and clean errors, each in a real process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

HORDE_LITE = Path(sys.executable).with_name("horde-lite")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _env(db_url: str | None = None, **extra: str) -> dict[str, str]:
    """The test process's environment without horde_lite's settings, colour or a Litestar app."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORDE_LITE_", "LITESTAR_"))}
    env.pop("FORCE_COLOR", None)
    env["PYTHONIOENCODING"] = "utf-8"  # rich draws its boxes with Unicode lines then
    if db_url is not None:
        env["HORDE_LITE_DATABASE__URL"] = db_url
    env.update(extra)
    return env


def horde_lite(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(HORDE_LITE), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    done.stdout, done.stderr = ANSI.sub("", done.stdout), ANSI.sub("", done.stderr)
    return done


def _commands_listed(help_text: str) -> list[str]:
    """The command names of the help's panels, in the order shown (rich_click's boxed rows)."""
    names = []
    for line in help_text.splitlines():
        found = re.match(r"^[│|] ([a-z][a-z-]*)\s{2,}", line)
        if found:
            names.append(found.group(1))
    return names


@pytest.mark.slow
def test_help_lists_horde_lites_commands_first_and_no_unrelated_ones(tmp_path: Path) -> None:
    shown = horde_lite("--help", cwd=tmp_path, env=_env())
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "horde_lite: a self-hosted broker for crowd-sourced text generation" in text
    assert "Litestar CLI" not in text
    assert "--app" not in text
    assert _commands_listed(text) == [
        "run", "users", "invites", "usage", "worker", "demo", "policies", "modes", "whatif", "database",
        "openapi", "routes", "version",
    ]  # fmt: skip
    assert text.index("Run and operate") < text.index("Tools") < text.index("Options")
    assert horde_lite("-h", cwd=tmp_path, env=_env()).stdout == shown.stdout
    for gone in ("sessions", "schema", "info"):
        refused = horde_lite(gone, cwd=tmp_path, env=_env())
        assert refused.returncode == 2, gone
        assert f"No such command '{gone}'" in refused.stderr


@pytest.mark.slow
def test_help_needs_neither_good_settings_nor_a_database(tmp_path: Path) -> None:
    """The help loads no app: wrong settings do not stop it (they used to, with a traceback)."""
    env = _env(
        HORDE_LITE_LEASE__BASE_SECS="3", HORDE_LITE_DATABASE__URL="postgresql+asyncpg://nobody@127.0.0.1:1/x"
    )
    shown = horde_lite("--help", cwd=tmp_path, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "users" in shown.stdout
    assert shown.stderr == ""
    users_help = horde_lite("users", "--help", cwd=tmp_path, env=env)
    assert users_help.returncode == 0, users_help.stderr
    for command in ("list", "create", "kudos", "set", "rotate-key", "delete"):
        assert re.search(rf"^  {command}\s", users_help.stdout, re.M), command
    # A command that needs the settings says what is wrong, in one line, without a traceback.
    refused = horde_lite("users", "list", cwd=tmp_path, env=env)
    assert refused.returncode == 2
    assert "HORDE_LITE_LEASE__BASE_SECS" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.mark.slow
def test_version_is_horde_lites(tmp_path: Path) -> None:
    expected = f"horde-lite {version('horde-lite')}"
    for args in (["--version"], ["version"]):
        shown = horde_lite(*args, cwd=tmp_path, env=_env())
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[0] == expected, args
        assert lines[1].startswith("Litestar 2.25"), args
        assert f"Python {sys.version_info.major}.{sys.version_info.minor}" in lines[1]
        assert len(lines) == 2


@pytest.mark.slow
def test_routes_loads_horde_lites_app(tmp_path: Path) -> None:
    """Whatever LITESTAR_APP the shell has, `horde-lite` serves horde_lite's app."""
    env = _env(f"sqlite+aiosqlite:///{tmp_path / 'r.db'}", LITESTAR_APP="elsewhere.app:app")
    shown = horde_lite("routes", cwd=tmp_path, env=env)
    assert shown.returncode == 0, shown.stderr
    for path in ("/api/v2/generate/text/async", "/v1/chat/completions", "/metrics"):
        assert path in shown.stdout, path
    assert not (tmp_path / "r.db").exists()  # listing the routes opens no database


@pytest.mark.slow
def test_negative_kudos_and_the_database_line(db_url: str, tmp_path: Path) -> None:
    env = _env(db_url)
    line = f"database: {make_url(db_url).render_as_string(hide_password=True)}"
    created = horde_lite("users", "create", "bob", "--kudos", "100", cwd=tmp_path, env=env)
    assert created.returncode == 0, created.stderr
    assert created.stderr.splitlines() == [line]
    for args, balance in [
        (["bob", "-5000"], -5000),
        (["bob", "-5000", "--add"], -10000),
        (["--add", "bob", "-1.5"], -10001.5),
        (["bob", "--", "-5000"], -5000),
        (["bob", "-5000", "--add"], -10000),
    ]:
        moved = horde_lite("users", "kudos", *args, cwd=tmp_path, env=env)
        assert moved.returncode == 0, (args, moved.stderr)
        assert moved.stdout.strip() == f"bob#1 now has {balance:g} kudos", args
        assert moved.stderr.splitlines() == [line]
    listed = horde_lite("users", "list", "--json", cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr
    assert [(r["name"], r["kudos"]) for r in json.loads(listed.stdout)] == [("bob#1", -10000)]


@pytest.mark.slow
def test_rotate_key_prints_the_new_key_last(db_url: str, tmp_path: Path) -> None:
    env = _env(db_url)
    old = horde_lite("users", "create", "carol", cwd=tmp_path, env=env).stdout.splitlines()[-1]
    rotated = horde_lite("users", "rotate-key", "carol", cwd=tmp_path, env=env)
    assert rotated.returncode == 0, rotated.stderr
    new = rotated.stdout.splitlines()[-1]
    assert len(new) == 22
    assert new != old
    assert old not in rotated.stdout


@pytest.mark.slow
def test_delete_asks_unless_told_yes(db_url: str, tmp_path: Path) -> None:
    env = _env(db_url)
    assert horde_lite("users", "create", "dan", cwd=tmp_path, env=env).returncode == 0
    no_answer = horde_lite("users", "delete", "dan", cwd=tmp_path, env=env)  # stdin: nothing
    assert no_answer.returncode == 1
    assert no_answer.stderr == "horde-lite: aborted\n"
    listed = json.loads(horde_lite("users", "list", "--json", cwd=tmp_path, env=env).stdout)
    assert [r["name"] for r in listed] == ["dan#1"]
    deleted = horde_lite("users", "delete", "dan", "--yes", cwd=tmp_path, env=env)
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.startswith("deleted dan#1:")
    assert json.loads(horde_lite("users", "list", "--json", cwd=tmp_path, env=env).stdout) == []


@pytest.mark.slow
@pytest.mark.parametrize("args", [["users", "kudos", "nobody", "-5"], ["users", "delete", "nobody", "-y"]])
def test_refusals_are_one_clean_message(db_url: str, tmp_path: Path, args: list[str]) -> None:
    refused = horde_lite(*args, cwd=tmp_path, env=_env(db_url))
    assert refused.returncode == 1
    assert "No user named 'nobody'" in refused.stderr
    assert "Traceback" not in refused.stderr
