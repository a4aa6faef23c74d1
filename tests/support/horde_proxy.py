"""A reverse proxy between a worker and the horde (no tests here): it forwards every request,
records the progress posts, and can lose the answer to one of them (the horde gets the post and
applies it; the worker gets a 502 instead of the answer), as a flaky network or proxy would."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.support.fake_backend import lifespan, read_body

PROGRESS = "/api/v2/generate/text/progress"


@dataclass
class HordeProxy:
    upstream: str
    lose_answer_to_seq: int | None = None  # the first progress post with this seq loses its answer
    progress: list[dict[str, Any]] = field(default_factory=list)  # bodies, in order, retries included
    answers: list[int] = field(default_factory=list)  # status the horde gave each progress post
    lost: int = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        raw = await read_body(receive)
        headers = [
            (k.decode(), v.decode())
            for k, v in scope["headers"]
            if k.lower() not in (b"host", b"content-length")
        ]
        url = f"{self.upstream}{scope['path']}" + (
            f"?{scope['query_string'].decode()}" if scope["query_string"] else ""
        )
        async with httpx.AsyncClient(timeout=60) as http:
            answer = await http.request(scope["method"], url, content=raw, headers=headers)
        if scope["path"] == PROGRESS:
            body = json.loads(raw)
            self.progress.append(body)
            self.answers.append(answer.status_code)
            if self.lost == 0 and body.get("seq") == self.lose_answer_to_seq:
                self.lost += 1
                await _send(send, 502, b'{"message": "bad gateway"}')
                return
        await _send(
            send, answer.status_code, answer.content, answer.headers.get("content-type", "application/json")
        )

    def seqs(self) -> list[int]:
        return [int(b["seq"]) for b in self.progress]


async def _send(send: Any, status: int, body: bytes, content_type: str = "application/json") -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type.encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
