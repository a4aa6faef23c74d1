"""The test run itself, as `scripts/test` starts it: `--sqlite-only` (`scripts/test --quick`) leaves
out exactly the PostgreSQL half and looks for no PostgreSQL server, and a run leaves nothing behind
in the temporary directory. Each test runs pytest on a small selection in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Fast tests that take `db_url` (one per database) and one marked postgres_only.
ON_BOTH = "tests/integration/test_whatif.py::test_whatif_over_an_empty_window_says_in_words_what_is_missing"
PG_ONLY = (
    "tests/integration/test_rehearsal_stack.py::test_pgbouncer_serves_again_after_a_fast_restart_of_postgres"
)


def pytest_in_a_process(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """pytest on `args` from the repository, its TMPDIR an empty directory of its own (returned),
    its basetemp elsewhere (pytest keeps those on purpose)."""
    scratch = tmp_path / "tmpdir"
    scratch.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HORDE_LITE_"))}
    env["TMPDIR"] = str(scratch)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "base"),
               "-q", *args]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return result, scratch


@pytest.mark.slow
def test_sqlite_only_deselects_the_postgresql_half_and_nothing_else(tmp_path: Path) -> None:
    both, _ = pytest_in_a_process(tmp_path / "both", "--collect-only", ON_BOTH, PG_ONLY)
    assert both.returncode == 0, both.stdout + both.stderr
    collected = [line for line in both.stdout.splitlines() if "::" in line]
    assert sum("[sqlite-" in line for line in collected) == 2, both.stdout
    assert sum("[postgresql-" in line for line in collected) == 2, both.stdout

    quick, _ = pytest_in_a_process(tmp_path / "quick", "--collect-only", "--sqlite-only", ON_BOTH, PG_ONLY)
    assert quick.returncode == 0, quick.stdout + quick.stderr
    kept = [line for line in quick.stdout.splitlines() if "::" in line]
    assert kept == [line for line in collected if "[sqlite-" in line], quick.stdout
    assert "3 deselected" in quick.stdout
    assert "SQLite only (--sqlite-only)" in quick.stdout  # the header says so, and names no server
    assert "horde_lite: PostgreSQL" not in quick.stdout


@pytest.mark.slow
@pytest.mark.parametrize("databases", [[], ["--sqlite-only"]], ids=["both", "sqlite-only"])
def test_a_run_leaves_no_directory_in_the_temporary_directory(tmp_path: Path, databases: list[str]) -> None:
    result, scratch = pytest_in_a_process(tmp_path, *databases, ON_BOTH)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed" in result.stdout
    assert sorted(p.name for p in scratch.iterdir()) == []
