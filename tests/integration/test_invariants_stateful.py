"""Random sequences of everything clients, workers and time do to a horde, over HTTP against the
real app, with the money and job invariants (tests/support/invariants.py) checked after every step
and a drain at the end of each sequence, on SQLite and PostgreSQL.

Steps: create (legacy or chat, n, anonymous / registered / poor / shared key, sizes under and over
the free allowance), a streaming /v1 chat call left waiting in the background, pop (one or two
jobs), progress, submit ok (with honest or inflated usage), submit faulted, submit twice, cancel,
status, a lease lapse (clock past the lease, then the sweep) and an expiry (clock past the request
expiry, then the sweep).

Hypothesis' state machines are synchronous, so the app runs in an event loop this test owns, in a
blocking portal's thread (`anyio.from_thread`); each step is one `portal.call`. The /v1 calls run
as tasks in that loop between steps (a chat client waits for a worker), through the streaming
transport of tests/support/chat.py, since the plain test client blocks the loop while it waits.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Callable
from concurrent.futures import Future, wait
from contextlib import AbstractContextManager
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import select, update

from horde_lite.accounts import kudos as ledger
from horde_lite.clock import ManualClock
from horde_lite.db.models import Generation, TextRequest, UsageRecord, User
from horde_lite.db.rows import insert_rows
from tests.conftest import is_postgres, make_settings, truncate_pg
from tests.support.chat import CHAT_BLOCK, MODEL, Chat, open_chat
from tests.support.horde import ANON, HordeClient
from tests.support.invariants import check, copy_matches_the_database

DRAIN_ROUNDS = 4  # a lease lapses in one round, its request expires in the next

# A /v1 call's documented answers other than 200 (docs/reference/chat_requests.md, "Errors").
V1_REFUSALS = {400, 401, 403, 404, 429, 502, 503}
# The horde API's documented 503s (docs/reference/horde_api.md): nobody could ever take the request.
DOCUMENTED_503 = {"NoEligibleWorker"}
REQUESTERS = ("anonymous", "alice", "bob", "shared")
# What a flood of progress posts may be answered, besides 200: its job's output or post count is
# spent, it posts too fast, its lease lapsed or its request expired, the client went away.
FLOOD_REFUSALS = {
    "ProgressTooLong",
    "TooManyProgressPosts",
    "ProgressTooFast",
    "AbortedGen",
    "InvalidJobID",
    "DuplicateGen",
}
SIZES = (16, 100, 600, 3000, 5000)  # around the free allowance (512..4096) and the workers' limits
WORKERS = {  # name -> (owner, pop body)
    "w-text": ("olga", {"models": [MODEL], "max_length": 1024, "max_context_length": 4096}),
    "w-chat": (
        "olga",
        {"models": [MODEL], "max_length": 4096, "max_context_length": 8192, "chat": CHAT_BLOCK},
    ),
    "w-alice": (
        "alice",
        {"models": [MODEL], "max_length": 4096, "max_context_length": 8192, "chat": CHAT_BLOCK},
    ),
    # A hostile owner: absurd model sizes first (a request naming no model is served under one),
    # the largest context a worker may declare, and several names to fault requests with.
    **{
        name: (
            "mallory",
            {
                "models": ["evil-9000B", "evil-99999999B", MODEL],
                "max_length": 4096,
                "max_context_length": 1_048_576,
            },
        )
        for name in ("w-evil-1", "w-evil-2", "w-evil-3")
    },
}


# Which of the current requests or jobs a step acts on: an index drawn the same way whatever the
# list holds (ids are random and /v1 calls add requests in the background, so drawing from the
# list itself would make Hypothesis see different data on a replay).
PICK = st.integers(0, 63)


def choose(items: list[str], pick: int) -> str | None:
    return items[pick % len(items)] if items else None


class HordeMachine(RuleBasedStateMachine):
    # Set by the test: a fresh, migrated, empty database for each sequence.
    fresh_database: Callable[[], str]

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.settings = make_settings(self.fresh_database())
        self._portal_cm: AbstractContextManager[BlockingPortal] = start_blocking_portal("asyncio")
        self.portal = self._portal_cm.__enter__()
        try:
            self._chat_cm = self.portal.wrap_async_context_manager(open_chat(self.settings, self.clock))
            self.chat: Chat = self._chat_cm.__enter__()
        except BaseException:
            self._portal_cm.__exit__(None, None, None)  # else its thread outlives the test
            raise
        try:
            self.keys: dict[str, str] = self.portal.call(self._set_up)
        except BaseException:
            self._close()
            raise
        self.requests: dict[str, int] = {}  # request id -> n
        self.jobs: dict[str, dict[str, Any]] = {}  # generation id -> {worker, kind, stream, seq}
        self.seen: set[str] = set()  # every generation id ever handed out
        self.submitted: list[str] = []
        self.key_of: dict[str, str] = {}  # submitted generation id -> its worker owner's key
        self.streams: list[Future[None]] = []
        self.problems: list[str] = []  # unexpected answers of the background /v1 calls
        self.texts = count(1)

    async def _set_up(self) -> dict[str, str]:
        hc = self.chat.hc
        keys = {"anonymous": ANON}
        keys["alice"] = await hc.user("alice", kudos=5_000)
        keys["bob"] = await hc.user("bob", kudos=30)  # just above the registered floor: can fund nothing
        keys["olga"] = await hc.user("olga")
        keys["mallory"] = await hc.user("mallory")
        shared = await self.chat.http.post(
            "/api/v2/sharedkeys", json={"kudos": 60, "name": "budget"}, headers={"apikey": keys["alice"]}
        )
        assert shared.status_code == 200, shared.text
        keys["shared"] = shared.json()["id"]
        return keys

    # --- helpers -----------------------------------------------------------------------------------

    def call(self, method: str, path: str, key: str | None = None, body: Any = None) -> Any:
        headers = {"apikey": key} if key else {}

        async def send() -> Any:
            return await self.chat.http.request(method, path, json=body, headers=headers)

        response = self.portal.call(send)
        documented = response.status_code == 503 and response.json().get("rc") in DOCUMENTED_503
        assert response.status_code < 500 or documented, (
            f"{method} {path} -> {response.status_code} {response.text}"
        )
        return response

    def sweep(self) -> None:
        self.portal.call(self.chat.hc.sweep)

    # --- rules -------------------------------------------------------------------------------------

    @rule(
        who=st.sampled_from(REQUESTERS),
        chat=st.booleans(),
        n=st.integers(1, 3),
        size=st.sampled_from(SIZES),
        with_model=st.booleans(),
        downgrade=st.booleans(),
    )
    def create(self, who: str, chat: bool, n: int, size: int, with_model: bool, downgrade: bool) -> None:
        body: dict[str, Any] = {"models": [MODEL] if with_model or chat else [], "allow_downgrade": downgrade}
        if chat:
            body["chat"] = {"messages": [{"role": "user", "content": "Hi there."}], "max_tokens": size}
            n = 1
        else:
            body["prompt"] = "Once upon a time"
            body["params"] = {"n": n, "max_length": size, "max_context_length": 1024}
        response = self.call("POST", "/api/v2/generate/text/async", self.keys[who], body)
        if response.status_code == 202:
            self.requests[response.json()["id"]] = n

    @precondition(lambda self: len(self.streams) < 3)
    @rule(who=st.sampled_from(REQUESTERS), size=st.sampled_from((16, 200, 900)))
    def open_stream(self, who: str, size: int) -> None:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Tell me a story."}],
            "max_tokens": size,
            "stream": True,
        }
        self.streams.append(self.portal.start_task_soon(self._stream, self.keys[who], body))

    async def _stream(self, key: str, body: dict[str, Any]) -> None:
        headers = {"Authorization": f"Bearer {key}"}
        try:
            async with asyncio.timeout(120):
                async with self.chat.http.stream(
                    "POST", "/v1/chat/completions", json=body, headers=headers
                ) as r:
                    if r.status_code != 200:
                        await r.aread()
                        if r.status_code not in V1_REFUSALS:
                            self.problems.append(f"/v1 stream -> {r.status_code} {r.text}")
                        return
                    async for line in r.aiter_lines():
                        # An in-stream failure is an error event; an unexpected exception is a 500 one.
                        if line.startswith('data: {"error"') and "InternalServerError" in line:
                            self.problems.append(f"/v1 stream error event {line}")
        except TimeoutError:
            self.problems.append("/v1 stream never ended")

    @rule(worker=st.sampled_from(sorted(WORKERS)), amount=st.integers(1, 2))
    def pop(self, worker: str, amount: int) -> None:
        owner, declarations = WORKERS[worker]
        response = self.call(
            "POST",
            "/api/v2/generate/text/pop",
            self.keys[owner],
            {"name": worker, "amount": amount, **declarations},
        )
        assert response.status_code == 200, response.text
        job = response.json()
        for gen_id in job.get("ids") or []:
            assert gen_id not in self.seen, f"generation {gen_id} handed out twice"
            self.seen.add(gen_id)
            self.jobs[gen_id] = {
                "key": self.keys[owner],
                "kind": job.get("kind", "text"),
                "stream": bool(job.get("stream")),
                "seq": 0,
                "max": (job.get("payload") or {}).get("max_tokens")
                or (job.get("payload") or {}).get("max_length"),
            }

    @rule(pick=PICK, gap=st.booleans())
    def progress(self, pick: int, gap: bool) -> None:
        gen_id = choose([g for g, j in self.jobs.items() if j["stream"]], pick)
        if gen_id is None:
            return
        job = self.jobs[gen_id]
        seq = job["seq"] + (2 if gap else 1)
        body = {"id": gen_id, "seq": seq, "delta": {"content": "Once upon "}}
        response = self.call("POST", "/api/v2/generate/text/progress", job["key"], body)
        if response.status_code == 200:
            job["seq"] = seq

    @rule(pick=PICK, posts=st.integers(1, 40), size=st.sampled_from((1, 4096, 65_536)))
    def progress_flood(self, pick: int, posts: int, size: int) -> None:
        """A worker floods its streaming job with posts, large or many: each is stored, or refused
        (too long, too fast, too many) without changing anything; never a 5xx."""
        gen_id = choose([g for g, j in self.jobs.items() if j["stream"]], pick)
        if gen_id is None:
            return
        job = self.jobs[gen_id]
        for _ in range(posts):
            body = {"id": gen_id, "seq": job["seq"] + 1, "delta": {"content": "f" * size}}
            response = self.call("POST", "/api/v2/generate/text/progress", job["key"], body)
            assert response.status_code < 500, response.text
            if response.status_code != 200:
                assert response.json()["rc"] in FLOOD_REFUSALS, response.text
                break
            job["seq"] += 1

    @rule(
        pick=PICK,
        state=st.sampled_from(("ok", "ok", "ok", "faulted", "censored")),
        chars=st.sampled_from((0, 7, 400, 5000)),
        usage=st.sampled_from((None, 3, 10_000_000)),
    )
    def submit(self, pick: int, state: str, chars: int, usage: int | None) -> None:
        gen_id = choose(list(self.jobs), pick)
        if gen_id is None:
            return
        job = self.jobs.pop(gen_id)
        text = ("x" * chars) + str(next(self.texts))
        body: dict[str, Any] = {"id": gen_id, "generation": text, "state": state, "seed": 42}
        if job["kind"] == "chat":
            chat: dict[str, Any] = {"message": {"role": "assistant", "content": text}}
            if usage is not None:
                chat["usage"] = {"completion_tokens": usage}
            body["chat"] = chat
        response = self.call("POST", "/api/v2/generate/text/submit", job["key"], body)
        if response.status_code == 200:
            self.submitted.append(gen_id)
            self.key_of[gen_id] = job["key"]
        elif response.json().get("rc") == "GenerationTooLong":
            self.jobs[gen_id] = job  # past the job's output bound: nothing stored, the job still its worker's
        else:
            # The only other refusals of a job its worker still holds: its lease lapsed (AbortedGen),
            # or its request expired and was removed with its jobs (InvalidJobID).
            assert response.json().get("rc") in ("AbortedGen", "InvalidJobID"), response.text

    @rule(pick=PICK)
    def submit_again(self, pick: int) -> None:
        gen_id = choose(self.submitted, pick)
        if gen_id is None:
            return
        body = {"id": gen_id, "generation": "again", "state": "ok"}
        response = self.call("POST", "/api/v2/generate/text/submit", self.key_of[gen_id], body)
        # Refused as already submitted, or as unknown once its request expired: never paid twice.
        rc = response.json().get("rc")
        assert rc in ("DuplicateGen", "InvalidJobID"), (
            f"a second submit was {response.status_code}: {response.text}"
        )

    @rule(pick=PICK)
    def cancel(self, pick: int) -> None:
        request_id = choose(list(self.requests), pick)
        if request_id is None:
            return
        self.call("DELETE", f"/api/v2/generate/text/status/{request_id}")

    @rule(pick=PICK)
    def status(self, pick: int) -> None:
        request_id = choose(list(self.requests), pick)
        if request_id is None:
            return
        response = self.call("GET", f"/api/v2/generate/text/status/{request_id}")
        if response.status_code == 200:
            s = response.json()
            assert s["finished"] + s["processing"] + s["waiting"] <= self.requests[request_id], s
            assert len(s["generations"]) == s["finished"], s
        else:
            assert response.status_code == 404, response.text  # expired

    @rule()
    def lapse(self) -> None:
        self.clock.advance(self.settings.lease.base_seconds + 1)
        self.sweep()

    @rule()
    def expire(self) -> None:
        self.clock.advance(self.settings.request.expiry_seconds + 1)
        self.sweep()

    @rule(seconds=st.sampled_from((1, 10, 60)))
    def time_passes(self, seconds: int) -> None:
        self.clock.advance(seconds)

    # --- the invariants ----------------------------------------------------------------------------

    @invariant()
    def books_balance(self) -> None:
        assert not self.problems, self.problems
        report = self.portal.call(check, self.chat.horde.engine)
        assert report.ok, "\n".join(report.violations)

    @invariant()
    def the_estimates_copy_is_the_database(self) -> None:
        """The app's copy of the queue and the fleet, caught up, holds what a fresh load reads."""
        self.portal.call(copy_matches_the_database, self.chat.horde)

    def teardown(self) -> None:
        try:
            for stream in self.streams:
                stream.cancel()
            # A cancelled stream's task ends first: what it was writing is committed or rolled back.
            wait(self.streams, timeout=60)
            # The drain: every lease lapses, every request ends or expires. A round can still meet a
            # request committed as it ran (a client cancelled mid-commit): the next round ends it.
            for _ in range(DRAIN_ROUNDS):
                self.clock.advance(self.settings.lease.max_seconds + self.settings.request.expiry_seconds + 1)
                self.sweep()
                report = self.portal.call(lambda: check(self.chat.horde.engine, drained=True))
                if report.ok:
                    break
            assert report.ok, "\n".join(report.violations)
        finally:
            self._close()

    def _close(self) -> None:
        try:
            self._chat_cm.__exit__(None, None, None)
        finally:
            self._portal_cm.__exit__(None, None, None)


@pytest.mark.slow
def test_random_sequences_keep_the_invariants(
    db_url: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    def fresh_database() -> str:
        if is_postgres(db_url):
            asyncio.run(truncate_pg(db_url))
            return db_url
        path = tmp_path / f"{uuid.uuid4().hex}.db"
        shutil.copy(request.getfixturevalue("sqlite_template"), path)
        return f"sqlite+aiosqlite:///{path}"

    machine = type("Machine", (HordeMachine,), {"fresh_database": staticmethod(fresh_database)})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=15,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


async def test_the_checker_sees_planted_faults(client: HordeClient) -> None:
    """The checker is only worth its silence if it can speak: a balance moved outside the ledger, a
    hold left active on a finished request, a job paid twice, a request handed out beyond its n and
    usage history that is not its settlements' are each reported."""
    horde = client.horde
    key = await client.user("alice", kudos=1_000)
    owner = await client.user("olga")
    created = await client.create(key, params={"n": 1, "max_length": 16}, models=[MODEL])
    assert created.status_code == 202, created.text
    pop = await client.pop(owner, "w-one", models=[MODEL])
    gen_id = pop.json()["id"]
    assert (await client.submit(owner, gen_id, "done")).status_code == 200
    assert (await check(horde.engine, drained=True)).ok

    async with horde.sessionmaker() as session, session.begin():
        request = (await session.execute(select(TextRequest))).scalar_one()
        await session.execute(update(User).where(User.username == "alice").values(kudos=User.kudos + 1))
        await insert_rows(session, [ledger.new_hold(request.user_id, request.id, 5.0, client.clock.now())])
        await ledger.record(session, request.user_id, -2.0, "charge", gen_id, client.clock.now())
        worker_id = (await session.execute(select(Generation.worker_id))).scalars().first()
        now = client.clock.now()
        session.add(  # a second job of an n=1 request, stored but never paid
            Generation(
                id=str(uuid.uuid4()), request_id=request.id, worker_id=worker_id, state="ok",
                popped_at=now, lease_expires_at=now,
            )
        )  # fmt: skip
        await session.execute(update(UsageRecord).values(tokens=UsageRecord.tokens + 1))
    found = "\n".join((await check(horde.engine, drained=True)).violations)
    for name in (
        "usage history == ledger",
        "balance == ledger",
        "no active hold on a finished request",
        "no generation submitted twice",
        "no job handed out twice",
        "one settlement per stored job",
    ):
        assert name in found, found
