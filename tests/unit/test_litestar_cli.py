"""What horde-lite takes from Litestar's CLI, through its public objects: its root group's `--app`
callback and its `run` and `routes` commands. A failure here names what a new Litestar changed."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from litestar import Litestar
from litestar.cli import litestar_group
from litestar.cli.commands.core import routes_command, run_command

from horde_lite import cli


def test_litestars_root_callback_leaves_a_loader_of_the_app_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HORDE_LITE_DATABASE__URL", f"sqlite+aiosqlite:///{tmp_path / 'never.db'}")
    monkeypatch.setenv("LITESTAR_APP", "elsewhere.app:app")
    context = click.Context(cli.cli)
    with context:
        context.invoke(litestar_group.callback, app_path=cli.APP, app_dir=None)  # type: ignore[arg-type]
    assert callable(context.obj), "litestar_group's callback no longer leaves a loader in ctx.obj"
    env = context.obj()
    assert isinstance(env.app, Litestar), "the loader no longer returns the loaded app as `.app`"
    assert env.app_path == cli.APP  # the app given, not LITESTAR_APP's
    assert not (tmp_path / "never.db").exists()  # loading the app opens no database


def test_run_and_routes_are_litestars_and_take_the_app_from_the_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cli.cli.commands["run"] is run_command
    assert cli.cli.commands["routes"] is routes_command
    monkeypatch.setenv("HORDE_LITE_DATABASE__URL", f"sqlite+aiosqlite:///{tmp_path / 'never.db'}")
    shown = CliRunner().invoke(cli.cli, ["routes"])
    assert shown.exit_code == 0, shown.output
    for path in ("/api/v2/generate/text/async", "/v1/chat/completions", "/metrics"):
        assert path in shown.output, path


def test_routes_with_wrong_settings_is_one_plain_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HORDE_LITE_LEASE__BASE_SECS", "3")
    monkeypatch.setattr("sys.argv", ["horde-lite", "routes"])
    with pytest.raises(SystemExit) as ended:
        cli.main()
    assert ended.value.code == 2
    [said] = capsys.readouterr().err.strip().splitlines()
    assert said.startswith("horde-lite: ")
    assert "HORDE_LITE_LEASE__BASE_SECS" in said
