"""The fleet bench's HTTP client (bench/raw_http.py) against a real `horde-lite run` process: JSON
answers and errors, one connection kept alive across calls."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.raw_http import RawConnection
from bench.soak_servers import LOOPBACK
from tests.support.server import served


@pytest.mark.slow
async def test_calls_share_one_connection_and_read_json_answers(
    sqlite_template: Path, tmp_path: Path
) -> None:
    path = tmp_path / "horde_lite.db"
    shutil.copy(sqlite_template, path)
    with served(f"sqlite+aiosqlite:///{path}", {}, tmp_path) as server:
        conn = RawConnection(LOOPBACK, server.port)
        try:
            status, body = await conn.request("GET", "/api/v2/status/heartbeat")
            assert status == 200
            assert isinstance(body, dict)
            writer = conn.writer

            status, body = await conn.request("POST", "/api/v2/generate/text/pop", {"name": ""},
                                              {"apikey": "0000000000"})  # fmt: skip

            assert status == 400
            assert set(body) >= {"message", "rc"}, body  # the API's own error, read whole
            assert conn.writer is writer  # the same connection, kept alive
            status, _ = await conn.request("GET", "/api/v2/status/heartbeat")
            assert status == 200
        finally:
            conn.close()
