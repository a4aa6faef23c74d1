"""`horde-lite demo --seconds N` as a person runs it, in a real process (docs/reference/worker.md,
"The demo"): its start-up steps, the decision lines naming the policies with their numbers, and
every line within 80 columns. On the configured database, SQLite and PostgreSQL."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fake_backend import CONTEXT, MODEL_ID, FakeBackend, Served

ROOT = Path(__file__).resolve().parents[2]
SECONDS = 15


def run_demo(db_url: str, cwd: Path, *extra: str, seconds: int = SECONDS) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORDE_LITE_", "LITESTAR_"))}
    env.update(HORDE_LITE_DATABASE__URL=db_url, PYTHONPATH=str(ROOT), COLUMNS="80")
    args = ["demo", "--seconds", str(seconds), "--configured-database", *extra]
    return subprocess.run(
        [sys.executable, "-m", "horde_lite", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def decision_lines(out: str, kind: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if line.startswith(f"  {kind}")]


@pytest.mark.slow
def test_the_demo_explains_its_decisions_in_80_columns(db_url: str, tmp_path: Path) -> None:
    done = run_demo(db_url, tmp_path)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    too_wide = [line for line in (out + done.stderr).splitlines() if len(line) > 80]
    assert too_wide == []
    # The start-up, step by step, before the first board.
    steps = [re.sub(r"^\[\s*[\d.]+ s\] ", "", line) for line in out.splitlines() if line.startswith("[")]
    assert steps[1:3] == ["database: postgresql+asyncpg, migrating", "database: migrated"] or steps[1:3] == [
        "database: sqlite+aiosqlite, migrating",
        "database: migrated",
    ], steps
    assert any(s.startswith("server: up at http://127.0.0.1:") for s in steps), steps
    assert [s for s in steps if s.startswith("workers:")][-1].endswith("registered (4 of 4)"), steps
    assert out.index("clients: starting") < out.index("decisions, newest last")
    # The allowance curve's decisions, with their numbers (the first requests show each once).
    refused = decision_lines(out, "refused:")
    assert refused, out
    wait = r"at a wait of \d+ s \(estimated_wait\)"
    assert re.fullmatch(rf"refused: 6,000 > allowance [\d,]+, {wait}", refused[0]), refused
    downgraded = decision_lines(out, "downgraded:")
    assert downgraded, out
    assert re.fullmatch(rf"downgraded: 6,000 to the allowance [\d,]+, {wait}", downgraded[0]), downgraded
    # The speed gate's: a worker kept from a big chat job, or an over-capacity job shadow-recorded.
    kept = decision_lines(out, "kept from")
    shadow = decision_lines(out, "shadow:")
    assert kept or shadow, out
    for line in kept:
        assert re.fullmatch(r"kept from [\w-]+: capacity [\d,]+ < [\d,]+ asked \(prefer_capable\)", line)
    for line in shadow:
        assert re.fullmatch(
            r"shadow: [\w-]+: [\d,]+ > capacity [\d,]+(, none capable|, capable online)? \(over_capacity\)",
            line,
        ), line
    assert "policies: gate prefer_capable, allowance estimated_wait, shadow over_capacity" in out
    assert re.search(r"^decisions explained: .*refused \d+", out, re.MULTILINE), out
    assert "last answer (" in out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("url", "said"),
    [("http://127.0.0.1:9/v1", "does not answer"), ("127.0.0.1:9/v1", "cannot be read")],
)
def test_an_unusable_model_server_is_one_clear_line(db_url: str, tmp_path: Path, url: str, said: str) -> None:
    done = run_demo(db_url, tmp_path, "--model-server", url, seconds=5)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"the model server at {url} {said}" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert all(len(line) <= 80 for line in (done.stdout + done.stderr).splitlines())


@pytest.mark.slow
def test_model_server_the_fleet_bridges_it(db_url: str, tmp_path: Path) -> None:
    """--model-server: the workers bridge an OpenAI-compatible server with the worker's own
    backend (here the fake one the worker tests use; the real model's test is marked real_model)."""
    with Served(FakeBackend()) as fake:
        done = run_demo(db_url, tmp_path, "--model-server", f"{fake.url}/v1", seconds=10)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert all(len(line) <= 80 for line in (out + done.stderr).splitlines())
    assert f"model server: {MODEL_ID}, context {CONTEXT:,} tokens" in out
    assert re.search(r"workers: model-(chat|legacy)-\w+ registered \(2 of 2\)", out), out
    served = re.search(r"^demo finished: served (\d+),", out, re.MULTILINE)
    assert served, out
    assert int(served.group(1)) > 0, out
    assert "last answer (" in out
    assert "horde hummed" in out or "happily ever after" in out  # the model server's own words
    # The 6,000-token requests: no worker of this 8,192-token context can take them.
    assert "  refused: 6,000 > allowance 512, no eligible worker (estimated_wait)" in out
