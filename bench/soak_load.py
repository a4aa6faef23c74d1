"""The soak's load: simulated workers and clients over real HTTP (httpx), spread round robin over the
server processes, with every answer classified so the report can tell a crash of the server under
a call from a 500.

Workers pop with a name and a key; some declare a chat block, some post progress on streaming jobs,
some submit `faulted`, some let leases lapse, some pop two jobs at once. Clients send legacy and
chat requests of mixed sizes (some n > 1, some over what any worker accepts), on the native route
(polling the status) and on /v1 (waiting or streaming), anonymous, registered, poor or through
shared keys, and cancel some. Every loop stops at its deadline, and every call has a timeout.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

SMALL, BIG = "soak/Small-8B", "soak/Big-13B"
MODELS = [SMALL, BIG]
CHAT_BLOCK = {
    "max_completion_tokens": 1024,
    "max_context_tokens": 8192,
    "features": ["tools"],
    "image_transports": [],
}
# 5xx answers that are documented outcomes, not failures (docs/reference/chat_requests.md, "Errors").
DOMAIN_5XX = {"NoEligibleWorker", "QueueTimeout", "no_eligible_worker", "queue_timeout", "worker_failed"}
RETRYABLE_5XX = {"DatabaseUnavailable", "database_unavailable"}
# What a proxy answers for a call whose server died under it (bad gateway, none left, timed out).
PROXY_5XX = {502, 503, 504}
# A retryable 503 within this many seconds of a fault we caused is that fault's doing.
FAULT_WINDOW = 15.0
CALL_TIMEOUT = 30.0
NO_5XX = "no 5xx outside the killed process's calls"
LOST_CONNECTION = (
    "a lost database connection is a retryable 503 (within 15 s of a fault, not 503 DatabaseUnavailable)"
)


@dataclass
class Tally:
    """What the load saw; the report prints it and judges the HTTP invariants from it."""

    calls: Counter[str] = field(default_factory=Counter)  # status class -> count
    rcs: Counter[str] = field(default_factory=Counter)  # "<status> <rc>" -> count
    killed_inflight: int = 0  # transport errors of calls to a process we SIGKILLed under them
    proxy_fault: int = 0  # a proxy's own 502/503/504 (no JSON body) within FAULT_WINDOW of a fault
    refused_down: int = 0  # calls that reached a port while its process was down
    fault_503: int = 0  # DatabaseUnavailable within FAULT_WINDOW of a fault we caused
    domain_5xx: int = 0
    # (invariant, detail): 5xx and missing answers nothing explains, inconsistent status answers
    problems: list[tuple[str, str]] = field(default_factory=list)
    created: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    popped: int = 0
    handed_twice: list[str] = field(default_factory=list)
    submitted: Counter[str] = field(default_factory=Counter)
    accepted_twice: list[str] = field(default_factory=list)
    progress_posts: int = 0
    lapsed_on_purpose: int = 0


class Endpoint(Protocol):
    """Where calls go: a server process (bench/soak_servers.py `Server`), or a proxy in front of
    several (bench/rehearsal.py), whose `killed_at` is the last kill of a process behind it."""

    @property
    def base_url(self) -> str: ...

    up: bool
    incarnation: int
    killed_at: float


class Cluster:
    """Client-side round robin over the live endpoints, with the classification of every answer."""

    def __init__(self, servers: list[Endpoint], tally: Tally) -> None:
        self.servers = servers
        self.tally = tally
        self.turn = itertools.count()
        self.faults: list[float] = []  # monotonic times of kills and connection terminations
        # Idle connections are dropped before uvicorn's 5 s keep-alive timeout, so a request never
        # races the server closing its connection (a ReadError that would look like a crash).
        limits = httpx.Limits(max_connections=400, max_keepalive_connections=100, keepalive_expiry=2.0)
        self.http = httpx.AsyncClient(timeout=CALL_TIMEOUT, limits=limits)
        self.seen_gens: set[str] = set()
        self.accepted_gens: set[str] = set()

    def pick(self) -> Endpoint:
        live = [s for s in self.servers if s.up] or self.servers
        return live[next(self.turn) % len(live)]

    def near_fault(self) -> bool:
        now = time.monotonic()
        return any(now - t < FAULT_WINDOW for t in self.faults)

    async def call(
        self, method: str, path: str, key: str | None = None, body: Any = None, limit: float = CALL_TIMEOUT
    ) -> httpx.Response | None:
        """One call; None when it got no answer (the reason is tallied)."""
        server = self.pick()
        incarnation, was_up = server.incarnation, server.up
        headers = {"apikey": key} if key else {}
        try:
            response = await self.http.request(
                method, server.base_url + path, json=body, headers=headers, timeout=limit
            )
        except httpx.TransportError as e:
            self.transport_error(server, incarnation, was_up, f"{method} {path}: {e!r}")
            return None
        self.classify(method, path, response)
        return response

    def transport_error(self, server: Endpoint, incarnation: int, was_up: bool, what: str) -> None:
        # A pooled connection opened to the process before it was killed fails on first use after.
        recently_killed = time.monotonic() - server.killed_at < FAULT_WINDOW
        if server.incarnation != incarnation or recently_killed:
            self.tally.killed_inflight += 1
        elif not was_up or not server.up:
            self.tally.refused_down += 1
        else:
            self.tally.problems.append((NO_5XX, f"no answer from a live server: {what}"))

    def classify(self, method: str, path: str, response: httpx.Response) -> None:
        status = response.status_code
        self.tally.calls[f"{status // 100}xx"] += 1
        if status < 400:
            return
        rc = _rc_of(response)
        route = path.split("/status/")[0]
        self.tally.rcs[f"{status} {rc} ({method} {route})"] += 1
        if status < 500:
            return
        if rc in DOMAIN_5XX:
            self.tally.domain_5xx += 1
        elif rc == "?" and status in PROXY_5XX and self.near_fault():
            self.tally.proxy_fault += 1  # the app answers JSON: this is the proxy's, for a killed process
        elif rc in RETRYABLE_5XX and self.near_fault():
            self.tally.fault_503 += 1
        else:
            label = LOST_CONNECTION if self.near_fault() else NO_5XX
            self.tally.problems.append((label, f"{status} {method} {path}: {response.text[:300]}"))


def _rc_of(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return "?"
    if not isinstance(body, dict):
        return "?"
    if isinstance(body.get("error"), dict):
        return str(body["error"].get("code") or body["error"].get("type"))
    return str(body.get("rc", "?"))


# --- workers -----------------------------------------------------------------------------------------


@dataclass
class WorkerSpec:
    name: str
    key: str
    kind: str  # text | chat | streamer | faulty | lapser | batcher | hostile
    # A waiting pop's bound (the pop body's `wait_seconds`); 0: poll, sleeping between empty pops.
    wait_seconds: int = 0


# A hostile worker: absurd model sizes first (a request naming no model is served under the first),
# the largest context a worker may declare, several names (to fault requests under each), over-long
# results, inflated usage and floods of progress posts. Its prices must stay the horde's.
HOSTILE_MODELS = ["evil-99999999B", "evil-9000B", *MODELS]
HOSTILE_NAMES = 3


async def run_worker(cluster: Cluster, spec: WorkerSpec, stop: float, honest_after: float, seed: int) -> None:
    """Pop until `stop`; after `honest_after` (the drain) no more faults or lapses."""
    rng = random.Random(seed)
    declarations: dict[str, Any] = {"models": MODELS, "max_length": 1024, "max_context_length": 8192}
    if spec.kind == "hostile":
        declarations.update(models=HOSTILE_MODELS, max_context_length=1_048_576)
    if spec.kind != "text":
        declarations["chat"] = CHAT_BLOCK
    while time.monotonic() < stop:
        amount = rng.randint(2, 3) if spec.kind == "batcher" else 1
        name = spec.name if spec.kind != "hostile" else f"{spec.name}-{rng.randrange(HOSTILE_NAMES)}"
        body = {"name": name, "amount": amount, "bridge_agent": "soak:1:bench", **declarations}
        if spec.wait_seconds:
            body["wait_seconds"] = spec.wait_seconds
        limit = CALL_TIMEOUT + spec.wait_seconds
        response = await cluster.call("POST", "/api/v2/generate/text/pop", spec.key, body, limit)
        if response is None or response.status_code != 200:
            await asyncio.sleep(0.5)
            continue
        job = response.json()
        ids = job.get("ids") or []
        if not ids:
            await asyncio.sleep(rng.uniform(0.0, 0.1) if spec.wait_seconds else rng.uniform(0.2, 0.6))
            continue
        for gen_id in ids:
            cluster.tally.popped += 1
            if gen_id in cluster.seen_gens:
                cluster.tally.handed_twice.append(gen_id)
            cluster.seen_gens.add(gen_id)
        honest = time.monotonic() >= honest_after
        for gen_id in ids:
            await _work_one(cluster, spec, job, gen_id, rng, honest)


async def _work_one(
    cluster: Cluster, spec: WorkerSpec, job: dict[str, Any], gen_id: str, rng: random.Random, honest: bool
) -> None:
    payload = job.get("payload") or {}
    limit = int(payload.get("max_tokens") or payload.get("max_length") or 64)
    chat = job.get("kind") == "chat"
    if not honest and spec.kind == "lapser" and rng.random() < 0.3:
        cluster.tally.lapsed_on_purpose += 1
        return  # never submitted: the lease lapses and the job goes back to its request
    tokens = rng.randint(1, max(1, limit))
    text = "w" * (tokens * 4 - 3)  # ceil(len / 4) == tokens: within what the job allowed
    hostile = spec.kind == "hostile"
    if hostile:
        tokens, text = 10_000_000, "h" * (limit * 16)  # claims far more than the job allowed
    if chat and job.get("stream") and hostile:
        for seq in range(1, 40):  # a flood of large posts, as fast as the server answers
            body = {"id": gen_id, "seq": seq, "delta": {"content": "f" * 65_536}}
            response = await cluster.call("POST", "/api/v2/generate/text/progress", spec.key, body)
            cluster.tally.progress_posts += 1
            if response is None or response.status_code != 200 or response.json().get("cancel"):
                break
    elif chat and job.get("stream"):
        posts = rng.randint(1, 4)
        for seq in range(1, posts + 1):
            await asyncio.sleep(rng.uniform(0.05, 0.4))
            body = {"id": gen_id, "seq": seq, "delta": {"content": text[: len(text) * seq // posts][-50:]}}
            response = await cluster.call("POST", "/api/v2/generate/text/progress", spec.key, body)
            cluster.tally.progress_posts += 1
            if response is None or response.status_code != 200 or response.json().get("cancel"):
                break
    else:
        await asyncio.sleep(rng.uniform(0.05, 1.2 if spec.kind == "batcher" else 0.8))
    faulted = not honest and spec.kind in ("faulty", "hostile") and rng.random() < 0.4
    body: dict[str, Any] = {"id": gen_id, "generation": text, "state": "faulted" if faulted else "ok"}
    if rng.random() < 0.5:
        body["seed"] = rng.randint(0, 2**31)
    if chat and not faulted:
        body["chat"] = {
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
            "usage": {"completion_tokens": tokens, "prompt_tokens": 10},
        }
    # A submit whose answer was lost (the process died under it; behind a proxy, the proxy's 5xx) is
    # retried once: the retry is accepted, or refused as already submitted / lapsed, never paid twice.
    for _attempt in range(2):
        response = await cluster.call("POST", "/api/v2/generate/text/submit", spec.key, body)
        if response is None or (response.status_code in PROXY_5XX and _rc_of(response) == "?"):
            continue
        if response.status_code == 200:
            cluster.tally.submitted["faulted" if faulted else "ok"] += 1
            if gen_id in cluster.accepted_gens and not faulted:
                cluster.tally.accepted_twice.append(gen_id)
            cluster.accepted_gens.add(gen_id)
        else:
            cluster.tally.submitted[f"refused {_rc_of(response)}"] += 1
        return


async def waiting_pops(http: httpx.AsyncClient, base_url: str, key: str, name: str) -> bool:
    """Whether the server makes a pop wait: a pop with `wait_seconds` is answered with the wait
    applied (a server without waiting pops ignores the field and echoes nothing). Call it on an
    empty queue: the probing worker `name` takes nothing."""
    body = {"name": name, "models": ["probe/none"], "wait_seconds": 1, "bridge_agent": "probe:1:bench"}
    try:
        response = await http.post(f"{base_url}/api/v2/generate/text/pop", json=body,
                                   headers={"apikey": key}, timeout=CALL_TIMEOUT)  # fmt: skip
    except httpx.TransportError:
        return False
    # The echo is the wait applied: 0 when the horde does not make pops wait.
    return response.status_code == 200 and bool(response.json().get("wait_seconds"))


# --- clients -----------------------------------------------------------------------------------------


@dataclass
class Requesters:
    registered: list[str]
    poor: str
    shared: list[str]

    def pick(self, rng: random.Random) -> tuple[str, str]:
        roll = rng.random()
        if roll < 0.2:
            return "anonymous", "0000000000"
        if roll < 0.35:
            return "shared", rng.choice(self.shared)
        if roll < 0.4:
            return "poor", self.poor
        return "registered", rng.choice(self.registered)


async def run_client(
    cluster: Cluster, who: Requesters, stop: float, final_by: float, seed: int, waits: dict[str, float]
) -> None:
    """Send requests until `stop`; follow each one until it ends or `final_by`."""
    rng = random.Random(seed)
    while time.monotonic() < stop:
        roll = rng.random()
        kind, key = who.pick(rng)
        if roll < 0.5:
            await _native(cluster, rng, key, kind, chat=False, final_by=final_by, waits=waits)
        elif roll < 0.7:
            await _native(cluster, rng, key, kind, chat=True, final_by=final_by, waits=waits)
        else:
            await _v1(cluster, rng, key, kind, stream=roll >= 0.85, final_by=final_by, waits=waits)
        await asyncio.sleep(rng.uniform(0.1, 0.8))


def _size(rng: random.Random) -> int:
    # Mostly small, some over the free allowance (kudos upfront), a few over every worker's limit
    # (nobody can take them: they wait and expire).
    return rng.choice([16, 32, 64, 64, 128, 200, 400, 512, 900, 1024]) if rng.random() > 0.03 else 3000


async def _native(
    cluster: Cluster,
    rng: random.Random,
    key: str,
    kind: str,
    *,
    chat: bool,
    final_by: float,
    waits: dict[str, float],
) -> None:
    size = _size(rng)
    body: dict[str, Any] = {"models": [rng.choice(MODELS)] if chat or rng.random() < 0.7 else []}
    n = 1
    if chat:
        body["chat"] = {
            "messages": [{"role": "user", "content": "Hi " * rng.randint(1, 200)}],
            "max_tokens": size,
        }
    else:
        n = rng.choice([1, 1, 1, 2, 3])
        body["prompt"] = "Once upon a time " * rng.randint(1, 100)
        body["params"] = {"n": n, "max_length": size, "max_context_length": 2048}
        body["allow_downgrade"] = rng.random() < 0.5
    response = await cluster.call("POST", "/api/v2/generate/text/async", key, body)
    if response is None or response.status_code != 202:
        cluster.tally.created["refused"] += 1
        return
    request_id = response.json()["id"]
    cluster.tally.created[f"{'chat' if chat else 'legacy'} {kind}"] += 1
    cancel_at = time.monotonic() + rng.uniform(0.5, 8) if rng.random() < 0.1 else None
    path = f"/api/v2/generate/text/status/{request_id}"
    while time.monotonic() < final_by:
        await asyncio.sleep(rng.uniform(*waits["poll"]))
        if cancel_at is not None and time.monotonic() >= cancel_at:
            cancel_at = None
            if await cluster.call("DELETE", path) is not None:
                cluster.tally.outcomes["cancelled"] += 1
            continue
        status = await cluster.call("GET", path)
        if status is None:
            continue
        if status.status_code == 404:
            cluster.tally.outcomes["expired"] += 1
            return
        if status.status_code != 200:
            continue
        s = status.json()
        if s["finished"] + s["processing"] + s["waiting"] > n:
            cluster.tally.problems.append(
                ("status counts add up", f"status of {request_id} counts more jobs than n={n}: {s}")
            )
        if s["faulted"]:
            cluster.tally.outcomes["faulted"] += 1
            return
        if s["done"]:
            cluster.tally.outcomes["done"] += 1
            return
    cluster.tally.outcomes["unfinished at the end"] += 1


async def _v1(
    cluster: Cluster,
    rng: random.Random,
    key: str,
    kind: str,
    *,
    stream: bool,
    final_by: float,
    waits: dict[str, float],
) -> None:
    body: dict[str, Any] = {
        "model": rng.choice(MODELS),
        "messages": [{"role": "user", "content": "Tell me about " * rng.randint(1, 50)}],
        "max_tokens": _size(rng),
        "stream": stream,
    }
    # Some clients give up early: the server cancels their request.
    patience = rng.uniform(1, 6) if rng.random() < 0.1 else max(1.0, final_by - time.monotonic())
    server = cluster.pick()
    incarnation, was_up = server.incarnation, server.up
    label = f"v1 {'stream' if stream else 'wait'} {kind}"
    try:
        async with asyncio.timeout(min(patience, waits["v1"])):
            async with cluster.http.stream(
                "POST", server.base_url + "/v1/chat/completions", json=body,
                headers={"Authorization": f"Bearer {key}"}, timeout=waits["v1"],
            ) as response:  # fmt: skip
                await (_read_stream(cluster, response, label) if stream else response.aread())
                if not stream:
                    cluster.classify("POST", "/v1/chat/completions", response)
                    if response.status_code == 200:
                        cluster.tally.created[label] += 1
                        cluster.tally.outcomes["done"] += 1
    except TimeoutError:
        cluster.tally.outcomes["client gave up"] += 1
    except httpx.TransportError as e:
        cluster.transport_error(server, incarnation, was_up, f"POST /v1/chat/completions: {e!r}")


async def _read_stream(cluster: Cluster, response: httpx.Response, label: str) -> None:
    if response.status_code != 200:
        await response.aread()
        cluster.classify("POST", "/v1/chat/completions", response)
        return
    cluster.classify("POST", "/v1/chat/completions", response)
    cluster.tally.created[label] += 1
    async for line in response.aiter_lines():
        if line == "data: [DONE]":
            cluster.tally.outcomes["done"] += 1
            return
        if line.startswith('data: {"error"'):
            code = json.loads(line[6:])["error"].get("code")
            cluster.tally.outcomes[f"stream ended with {code}"] += 1
            if code in RETRYABLE_5XX and cluster.near_fault():
                cluster.tally.fault_503 += 1
            elif code not in DOMAIN_5XX:
                label = LOST_CONNECTION if cluster.near_fault() else NO_5XX
                cluster.tally.problems.append((label, f"/v1 stream error event: {line[:300]}"))
            return
