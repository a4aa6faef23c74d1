"""What the dashboard's tests share: a real server's settings for a browser test, and an app with
the operator pages open."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from litestar.testing import AsyncTestClient

from horde_lite.app import create_app
from horde_lite.clock import ManualClock
from tests.conftest import make_settings
from tests.support.horde import HordeClient

# A `horde-lite run` for a browser test: pages shut (the sign-in form is used), no sweeper.
BROWSER_SERVER: dict[str, dict[str, object]] = {
    "http": {"open_operator_pages": False},
    "lease": {"sweep_seconds": 0},
    "database": {"null_pool": True},
}


@pytest.fixture
async def open_pages(db_url: str, clock: ManualClock) -> AsyncIterator[HordeClient]:
    """The app with `[http] open_operator_pages`: panels open to read, actions still shut."""
    app = create_app(make_settings(db_url, http={"open_operator_pages": True}), clock, run_sweeper=False)
    async with AsyncTestClient(app=app, timeout=30) as http:
        yield HordeClient(http, app.state.horde)
