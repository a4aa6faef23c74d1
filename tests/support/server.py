"""A real `horde-lite run` process on a free loopback port, for the tests that need what only a
served app has: uvicorn's access log, a browser, raw request lines."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.soak_servers import LOOPBACK, free_port, server_command, server_env

START_TIMEOUT = 60.0


@dataclass(frozen=True)
class Served:
    base: str  # http://127.0.0.1:PORT
    port: int
    log: Path  # the process's stdout and stderr: its access log among them


@contextmanager
def served(db_url: str, overrides: dict[str, dict[str, object]], tmp_path: Path) -> Iterator[Served]:
    port = free_port()
    log = tmp_path / f"server-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            server_command(port), cwd=tmp_path, env=server_env(db_url, overrides), stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    base = f"http://{LOOPBACK}:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if httpx.get(f"{base}/api/v2/status/heartbeat", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"the server did not start: {log.read_text()[-3000:]}"
            time.sleep(0.1)
        yield Served(base, port, log)
    finally:
        stop(process)


def stop(process: subprocess.Popen[bytes]) -> None:
    """Terminate a process and wait for it; kill it if it does not end within 10 s."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def raw_request(
    port: int, target: str, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """Send `target` exactly as written (no client normalises its dots, slashes or escapes); the
    status and the body."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {LOOPBACK}:{port}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    with socket.create_connection((LOOPBACK, port), timeout=30) as conn:
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body
