"""A webhook receiver for tests: a real HTTP server on 127.0.0.1, in a thread of its own (the app
under test runs in its own event loop, the test in another). It answers each POST with the next
status of its script (200 once the script is used up), after `hold` is set when `holding`."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class HookReceiver:
    port: int = 0
    statuses: list[int] = field(default_factory=list)  # answered in order, then 200
    holding: bool = False  # answer only once `hold` is set
    received: list[Received] = field(default_factory=list)
    arrived: threading.Event = field(default_factory=threading.Event)  # a POST came in
    hold: threading.Event = field(default_factory=threading.Event)
    answered: threading.Event = field(default_factory=threading.Event)  # a POST was answered

    def url(self, path: str = "/hook", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


@contextmanager
def hook_receiver(**options: Any) -> Iterator[HookReceiver]:
    receiver = HookReceiver(**options)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with lock:
                receiver.received.append(Received(self.path, dict(self.headers.items()), body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
            receiver.arrived.set()
            if receiver.holding:
                receiver.hold.wait(30)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            receiver.answered.set()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, name="hook-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.hold.set()
        server.shutdown()
        server.server_close()
