"""Running the CLI in-process against a test database, and reading that database back."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from horde_lite.db.engine import make_engine, make_sessionmaker


def point_settings_at(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings as a CLI command will read them: no ./litestar.toml from the repository, no
    HORDE_LITE_ variables from the test run, the database the test's."""
    monkeypatch.chdir(tmp_path)
    for key in [k for k in os.environ if k.startswith("HORDE_LITE_") and "__" in k]:
        monkeypatch.delenv(key)
    monkeypatch.delenv("HORDE_LITE_CONFIG", raising=False)
    monkeypatch.setenv("HORDE_LITE_DATABASE__URL", db_url)


def query(url: str, statement: Any) -> list[Any]:
    """The rows of one statement, on a connection of its own (the CLI has its own event loop)."""

    async def go() -> list[Any]:
        engine = make_engine(url, null_pool=True)
        try:
            async with make_sessionmaker(engine)() as session:
                return list((await session.execute(statement)).all())
        finally:
            await engine.dispose()

    return asyncio.run(go())
