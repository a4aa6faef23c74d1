"""`horde-lite demo --model-server URL` against a real model server (llama-cpp-python serving
SmolLM2-135M, tests/support/model_server.py): the fleet bridges it and real generated text reaches
the demo's clients. Marked `real_model` (skipped without the `model` extra). Both databases."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.test_demo_process import run_demo
from tests.support.model_server import ModelServer

pytestmark = [pytest.mark.real_model, pytest.mark.slow]
SECONDS = 30  # a 135M model on two CPU threads answers a few requests of 16 to 128 tokens


def test_the_demo_bridges_a_real_model(model_server: ModelServer, db_url: str, tmp_path: Path) -> None:
    done = run_demo(
        db_url, tmp_path, "--model-server", model_server.url, "--model-context", str(model_server.n_ctx),
        seconds=SECONDS,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert all(len(line) <= 80 for line in (out + done.stderr).splitlines())
    assert f"model server: {model_server.model}, context {model_server.n_ctx:,} tokens" in out
    served = re.search(r"^demo finished: served (\d+),", out, re.MULTILINE)
    assert served, out
    assert int(served.group(1)) > 0, out
    # Real text: what the model wrote, as a client received it (not the simulator's words).
    # A long answer is cut at 80 columns, its cut marked "...".
    answers = re.findall(r'^(?:last answer|streaming) \([a-z ]+\): "(.+?)(?:"|\.\.\.)$', out, re.MULTILINE)
    assert any(len(a.split()) >= 2 for a in answers), out
    assert "  refused: 6,000 > allowance 512, no eligible worker (estimated_wait)" in out


def test_the_demo_asks_for_a_context_the_model_server_does_not_say(
    model_server: ModelServer, db_url: str, tmp_path: Path
) -> None:
    """llama-cpp-python's server says no context: the demo names --model-context, never guesses."""
    done = run_demo(db_url, tmp_path, "--model-server", model_server.url, seconds=5)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "says no context: give it with --model-context N" in done.stdout
    assert "server: up" not in done.stdout  # stopped before starting anything
