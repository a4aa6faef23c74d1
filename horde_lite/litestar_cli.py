"""The one place horde_lite reaches into Litestar's CLI internals.

`horde-lite` is a click group of Litestar's own kind, so that Litestar's `run` and `routes`
commands get the app from it as they do under `litestar`. Litestar exports no public group that
does this (`litestar.cli` exports only its ready-made `litestar_group`), so the group class and the
environment it hands the commands come from `litestar.cli._utils`. Litestar is pinned; if a new
version moves or changes them, tests/unit/test_litestar_cli.py fails naming what changed, and this
module is the only one to mend.
"""

from __future__ import annotations

from litestar.cli._utils import LitestarEnv, LitestarGroup

__all__ = ["LitestarEnv", "LitestarGroup"]
