"""What horde_lite uses of Litestar's CLI internals (horde_lite/litestar_cli.py) is still there and
still behaves as the CLI needs: a failure here names the piece a new Litestar moved or changed."""

from __future__ import annotations

import inspect

import click

from horde_lite.cli import cli
from horde_lite.litestar_cli import LitestarEnv, LitestarGroup


def test_the_group_class_is_a_click_group_that_hands_commands_the_app() -> None:
    assert issubclass(LitestarGroup, click.Group), "litestar.cli._utils.LitestarGroup is no click group"
    assert isinstance(cli, LitestarGroup)
    # Litestar's run and routes are registered on horde-lite's group as on litestar's own.
    assert {"run", "routes"} <= set(cli.list_commands(click.Context(cli)))


def test_the_environment_is_made_from_an_app_path() -> None:
    from_env = getattr(LitestarEnv, "from_env", None)
    assert callable(from_env), "litestar.cli._utils.LitestarEnv.from_env is gone"
    parameters = list(inspect.signature(from_env).parameters)
    assert parameters[:1] == ["app_path"], f"LitestarEnv.from_env takes {parameters} now"
    assert {"app", "cwd"} <= {f for f in getattr(LitestarEnv, "__dataclass_fields__", {})}, (
        "LitestarEnv no longer carries the app it loaded"
    )
