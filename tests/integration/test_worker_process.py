"""The worker and the demo as real processes, on SQLite only (the worker is database-agnostic;
the demo makes its own throwaway SQLite file): `python -m horde_lite.worker` (the `horde-lite
worker` command without loading the server app) and `python -m horde_lite demo`."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.worker_rig import MODEL, PATIENCE, Rig, sqlite_rig


@pytest.fixture
async def lite(tmp_path: Path, sqlite_template: Path) -> AsyncIterator[Rig]:
    """The rig on SQLite only."""
    async with sqlite_rig(tmp_path, sqlite_template) as r:
        yield r


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "horde_lite", *args]


def _spawn_worker(lite: Rig, log: Path) -> subprocess.Popen[bytes]:
    args = ["--horde", lite.horde_url, "--name", "sim", "--simulate", "20", "--model", MODEL, "--no-chat"]
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "horde_lite.worker", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=log.parent,
            env={**os.environ, "HORDE_LITE_WORKER_KEY": lite.key},
        )


@pytest.mark.slow
async def test_sigterm_stops_popping_finishes_the_job_in_hand_and_exits_0(lite: Rig, tmp_path: Path) -> None:
    created = await lite.http.post(
        "/api/v2/generate/text/async",
        json={"prompt": "Hi", "params": {"max_length": 40}, "models": [MODEL]},  # 2 s at 20 tokens/s
        headers={"apikey": lite.key},
    )
    request_id = created.json()["id"]
    log = tmp_path / "worker.log"
    process = _spawn_worker(lite, log)
    try:
        deadline = time.monotonic() + PATIENCE
        while (await lite.status(request_id))["processing"] == 0:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.05)
        process.send_signal(signal.SIGTERM)  # mid-job
        code = await asyncio.to_thread(process.wait, PATIENCE)
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert code == 0, text
    for line in ("stopping: no more pops", "submitted (text)", "sim: stopped"):
        assert line in text
    status = await lite.status(request_id)
    assert (status["finished"], status["done"], status["faulted"]) == (1, True, False), text
    record = await lite.worker_record("sim")
    assert record is not None
    assert record["faulted_jobs"] == 0


@pytest.mark.slow
def test_demo_runs_for_a_bounded_time_and_completes_jobs(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORDE_LITE_")}
    result = subprocess.run(
        _cli("demo", "--seconds", "10", "--refresh", "3"),
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    finished = re.search(r"demo finished: served (\d+), refused (\d+), failed (\d+)", out)
    assert finished is not None, out
    assert int(finished.group(1)) > 0, out
    assert int(finished.group(3)) == 0, out
    assert "workers stopped by an error: 0" in out
    assert "capacity" in out
    assert "allowance (/metrics)" in out
    assert "Traceback" not in out, out


def test_a_missing_key_names_its_environment_variable(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HORDE_LITE_WORKER_KEY"}
    args = ["--horde", "http://127.0.0.1:9", "--name", "keyless", "--simulate", "20", "--model", MODEL]
    result = subprocess.run(
        [sys.executable, "-m", "horde_lite.worker", *args],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "give --key KEY or set HORDE_LITE_WORKER_KEY" in result.stderr
    assert "Traceback" not in result.stderr
