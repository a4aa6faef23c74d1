"""The speed gate contract: prove a gate's SQL clause and its Python check agree.

A speed gate supplies one offer rule twice (docs/reference/policies.md): `admits_sql`, which the pop
query applies in its WHERE clause, and `admits`, which the Python mirror of the eligibility check
(`horde_lite.queue.eligibility.is_eligible`) reads. If the two disagree, the pop hands out jobs
the status route, the wait estimate and worker availability think impossible, or the other way
round. This module checks them against each other on a real, migrated database, for fleets of
workers and queues of requests generated with hypothesis, so a third-party gate can run exactly
the test the built-in ones pass:

    from horde_lite.testing.speed_gate_contract import check_speed_gate
    from my_package.gate import MyGate

    def test_my_gate_keeps_the_contract() -> None:
        check_speed_gate(MyGate(), "sqlite+aiosqlite:////tmp/contract.db")
        check_speed_gate(MyGate(), "postgresql+asyncpg://postgres@127.0.0.1:5432/scratch")

`check_speed_gate` is synchronous and must be called where no event loop is running (a plain test
function). From async code, await `speed_gate_contract(gate, url)`, which runs the same check in a
worker thread. Neither needs pytest: any caller will do, and a failure raises `AssertionError`
naming the worker, the request and both answers (hypothesis shrinks it to a small fleet first).

What it needs:
- hypothesis (in horde-lite's `test` extra: `pip install "horde-lite[test]"`).
- A database URL horde_lite supports (`sqlite+aiosqlite:///...` or `postgresql+asyncpg://...`).
  Migrations are applied when the database is behind. The database must hold no workers and no
  text requests: the capable-worker subquery reads every worker row, so other rows would change
  the answers. Every example runs in one transaction that is rolled back, so nothing is left.

What it checks, for every (worker, request) pair of every generated example:
1. the SQL `capable_worker_online` subquery and the Python `is_capable` agree on whether a capable
   worker is online for the request (the input `GateSql`/`GateInputs` give the gate);
2. the gate's SQL clause alone and its Python check alone agree, whatever the other rules say;
3. the whole pop WHERE clause (`eligibility_clauses`, the gate included, over a join of the worker
   and request rows) and `is_eligible` agree;
4. the capable-worker question asked of the queue's entries (the pop's walk asks it there) never
   says yes where the request's says no, and for a plain chat request says yes on one of its
   entries exactly when the request's does.
The generated fleets cover online and offline workers (at the 300 s boundary), maintenance and
paused workers, measured and unmeasured speeds (capacities at and around request sizes), chat and
legacy workers with every subset of features and image transports, and chat and legacy requests
with models, allow/deny lists, trusted-only, slow-worker and nsfw flags. Hand-written examples
always run first, among them the speed gate design's worked case: a 4.0 tokens/s worker
(capacity 480) and a 512-token tool-using chat request, with the unmeasured tools-declaring worker
online and offline.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import func, insert, select, true
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.orm import aliased

from horde_lite.accounts.workers import capacity_for
from horde_lite.db.models import (
    QueueEntry,
    RequestModel,
    TextRequest,
    User,
    Worker,
    WorkerModel,
)
from horde_lite.policies.protocols import GateInputs, SpeedGate
from horde_lite.queue.eligibility import (
    RequestFacts,
    Rules,
    WorkerFacts,
    capable_worker_online,
    capable_worker_online_for_entry,
    eligibility_clauses,
    is_capable,
    is_eligible,
    speed_gate_admits_sql,
)
from horde_lite.settings import Settings

__all__ = [
    "NOW",
    "Example",
    "check_example",
    "check_gates",
    "check_speed_gate",
    "examples",
    "seed_examples",
    "speed_gate_contract",
]

NOW = 1_000_000.0
"""The time every example is judged at (epoch seconds; any value works)."""

MODELS = ("model-a", "model-b", "model-c")
FEATURES = ("tools", "json_schema", "vision")
TRANSPORTS = ("url", "base64")
USER_IDS = (1, 2)


@dataclass(frozen=True, slots=True)
class Example:
    """One generated fleet and queue. Request ids are `r<i>`, worker ids `w<i>`."""

    workers: tuple[WorkerFacts, ...]
    requests: tuple[tuple[str, RequestFacts], ...]


# --- generating examples -----------------------------------------------------------------------


def examples(settings: Settings | None = None) -> Any:
    """The hypothesis strategy of `Example`s the contract runs on (exposed for reuse)."""
    from hypothesis import strategies as st

    settings = settings or Settings()
    window = settings.lease.generation_window_seconds
    online = settings.worker.online_seconds
    slow = settings.worker.slow_tokens_per_second
    # Speeds whose capacities land on, just under and just over the request sizes below, plus the
    # slow-worker threshold; None is unmeasured (the assumed speed).
    speeds = st.sampled_from((None, None, slow - 0.5, slow, 480 / window, 4.0, 512 / window, 8.0, 20.0, 60.0))
    ages = st.sampled_from((0.0, 10.0, online - 1, online, online + 1, 3 * online))
    rare = st.sampled_from((False, False, False, True))
    sizes = st.sampled_from((16, 80, 480, 481, 512, 513, 1024, 1200, 1201, 2048, 4096))
    subsets = lambda items: st.frozensets(st.sampled_from(items))  # noqa: E731

    @st.composite
    def worker(draw: Any, index: int) -> WorkerFacts:
        speed = draw(speeds)
        chat = draw(st.sampled_from((True, True, False)))
        completion = draw(sizes) if chat else None
        return WorkerFacts(
            id=f"w{index}",
            owner_id=draw(st.sampled_from(USER_IDS)),
            last_check_in=NOW - draw(ages),
            models=draw(subsets(MODELS)),
            max_length=draw(sizes),
            max_context_length=draw(st.sampled_from((1024, 2048, 4096, 8192))),
            capacity=capacity_for(speed, settings),
            lease_speed=speed,
            trusted=draw(st.booleans()),
            nsfw=draw(st.booleans()),
            maintenance=draw(rare),
            paused=draw(rare),
            chat_max_completion_tokens=completion,
            chat_max_context_tokens=(
                None if completion is None else draw(st.sampled_from((1024, 2048, 4096, 8192)))
            ),
            chat_features=draw(subsets(FEATURES)) if chat else frozenset(),
            chat_image_transports=draw(subsets(TRANSPORTS)) if chat else frozenset(),
        )

    @st.composite
    def request(draw: Any, fleet_size: int) -> RequestFacts:
        is_chat = draw(st.booleans())
        max_length = draw(sizes)
        ids = st.sampled_from([f"w{i}" for i in range(fleet_size + 1)])  # one id matches no worker
        owners = st.sampled_from([str(u) for u in USER_IDS])
        targeting = draw(st.sampled_from(("none", "none", "allow", "deny")))
        features = draw(subsets(FEATURES)) if is_chat else frozenset()
        transports = draw(subsets(TRANSPORTS)) if is_chat else frozenset()
        if transports:
            features = features | {"vision"}  # an image part always requires vision
        prompt_tokens = draw(st.sampled_from((0, 10, 600, 3000))) if is_chat else 0
        return RequestFacts(
            user_id=draw(st.sampled_from(USER_IDS)),
            is_chat=is_chat,
            max_length=max_length,
            max_context_length=(
                prompt_tokens + max_length
                if is_chat
                else max(max_length, draw(st.sampled_from((1024, 2048, 4096, 8192))))
            ),
            prompt_tokens=prompt_tokens,
            models=draw(subsets(MODELS)),
            required_features=features,
            required_transports=transports,
            worker_allow=draw(st.frozensets(ids, min_size=1)) if targeting == "allow" else frozenset(),
            worker_deny=draw(st.frozensets(ids, min_size=1)) if targeting == "deny" else frozenset(),
            trusted_workers=draw(rare),
            slow_workers=draw(st.sampled_from((True, True, False))),
            nsfw=draw(rare),
            failed_workers=draw(st.frozensets(ids, max_size=2)) if draw(rare) else frozenset(),
            failed_owners=draw(st.frozensets(owners, max_size=1)) if draw(rare) else frozenset(),
        )

    @st.composite
    def example(draw: Any) -> Example:
        size = draw(st.integers(min_value=0, max_value=6))
        fleet = tuple(draw(worker(i)) for i in range(size))
        count = draw(st.integers(min_value=1, max_value=5))
        queue = tuple((f"r{i}", draw(request(size))) for i in range(count))
        return Example(workers=fleet, requests=queue)

    return example()


def seed_examples(settings: Settings | None = None) -> list[Example]:
    """Hand-written examples that always run: the speed gate design's worked case and its neighbours."""
    settings = settings or Settings()
    slow = WorkerFacts(
        id="w0",
        owner_id=1,
        last_check_in=NOW,
        models=frozenset({"model-a"}),
        max_length=1024,
        max_context_length=4096,
        capacity=capacity_for(4.0, settings),
        lease_speed=4.0,
        chat_max_completion_tokens=1024,
        chat_max_context_tokens=4096,
        chat_features=frozenset({"tools"}),
    )
    capable = replace(slow, id="w1", owner_id=2, lease_speed=None, capacity=capacity_for(None, settings))
    chat = RequestFacts(
        user_id=2,
        is_chat=True,
        max_length=512,
        max_context_length=522,
        prompt_tokens=10,
        models=frozenset({"model-a"}),
        required_features=frozenset({"tools"}),
    )
    legacy = RequestFacts(
        user_id=2, is_chat=False, max_length=512, max_context_length=2048, models=frozenset({"model-a"})
    )
    offline = replace(capable, last_check_in=NOW - settings.worker.online_seconds - 1)
    no_tools = replace(capable, chat_features=frozenset())
    paused = replace(capable, paused=True)
    maintenance = replace(capable, maintenance=True)
    short = replace(capable, chat_max_completion_tokens=256)
    vision = replace(chat, required_features=frozenset({"vision"}), required_transports=frozenset({"url"}))
    sees = replace(capable, chat_features=frozenset({"vision"}), chat_image_transports=frozenset({"url"}))
    sees_base64 = replace(sees, id="w2", chat_image_transports=frozenset({"base64"}))
    slow_sees = replace(slow, chat_features=sees.chat_features, chat_image_transports=frozenset({"url"}))
    # A plain chat request (no features): the walk asks its capable question of its entries.
    plain = replace(chat, required_features=frozenset())
    queue = (("r0", chat), ("r1", legacy), ("r2", plain))
    narrow = replace(no_tools, chat_max_context_tokens=100)  # too small a context for `plain`
    elsewhere = replace(no_tools, models=frozenset({"model-b"}))
    aimed = replace(plain, worker_allow=frozenset({"w0"}))  # targets the slow worker alone
    return [
        Example(workers=(slow, capable), requests=queue),
        Example(workers=(slow, offline), requests=queue),
        Example(workers=(slow, no_tools), requests=queue),
        Example(workers=(slow, paused), requests=queue),
        Example(workers=(slow, maintenance), requests=queue),
        Example(workers=(slow, short), requests=queue),
        Example(workers=(slow,), requests=queue),
        Example(workers=(slow_sees, sees, sees_base64), requests=(("r0", vision),)),
        # The capable worker failed the chat request: it neither takes it nor counts as capable.
        Example(workers=(slow, capable), requests=(("r0", replace(chat, failed_workers=frozenset({"w1"}))),)),
        Example(workers=(slow, narrow), requests=queue),
        # Failed by, or denying, the only capable worker: plain, its refusals read by name.
        Example(
            workers=(slow, no_tools),
            requests=(
                ("r0", replace(plain, failed_workers=frozenset({"w1"}))),
                ("r1", replace(plain, worker_deny=frozenset({"w1"}))),
            ),
        ),
        # Failed by a worker of the capable worker's owner: the owner's other workers are refused
        # too, so the capable one neither takes it nor counts as capable (nor does the slow one,
        # when they share the owner).
        Example(
            workers=(slow, no_tools, replace(capable, id="w2")),
            requests=(
                ("r0", replace(chat, failed_owners=frozenset({str(capable.owner_id)}))),
                ("r1", replace(plain, failed_owners=frozenset({str(capable.owner_id)}))),
            ),
        ),
        # Capable for another model only: a request for that model, and the plain one that is not.
        Example(
            workers=(slow, elsewhere),
            requests=(*queue, ("r3", replace(plain, models=frozenset({"model-b"})))),
        ),
        Example(
            workers=(slow, no_tools), requests=(("r0", aimed), ("r1", replace(plain, trusted_workers=True)))
        ),
        Example(
            workers=(slow, replace(no_tools, trusted=True)),
            requests=(("r0", replace(plain, trusted_workers=True)),),
        ),
    ]


# --- writing an example into the database ------------------------------------------------------


def _worker_row(w: WorkerFacts) -> dict[str, Any]:
    return {
        "id": w.id,
        "name": f"contract-{w.id}",
        "owner_id": w.owner_id,
        "trusted": w.trusted,
        "models": sorted(w.models),
        "max_length": w.max_length,
        "max_context_length": w.max_context_length,
        "nsfw": w.nsfw,
        "priority_user_ids": [],
        "chat_max_completion_tokens": w.chat_max_completion_tokens,
        "chat_max_context_tokens": w.chat_max_context_tokens,
        "chat_features": sorted(w.chat_features),
        "chat_image_transports": sorted(w.chat_image_transports),
        "maintenance": w.maintenance,
        "paused": w.paused,
        "last_check_in": w.last_check_in,
        "created_at": NOW - 10_000,
        "lease_speed": w.lease_speed,
        "speed_samples": [] if w.lease_speed is None else [w.lease_speed],
        "capacity": w.capacity,
    }


def _request_row(request_id: str, r: RequestFacts) -> dict[str, Any]:
    # As admission writes it: `targeted` only for an allow-list without a deny-list.
    targeted = bool(r.worker_allow) and not r.worker_deny
    return {
        "id": request_id,
        "user_id": r.user_id,
        "requester_kind": "registered",
        "state": "waiting",
        "is_chat": r.is_chat,
        "params": {"max_length": r.max_length, "max_context_length": r.max_context_length},
        "chat": {"messages": [{"role": "user", "content": "hi"}]} if r.is_chat else None,
        "max_length": r.max_length,
        "max_context_length": r.max_context_length,
        "prompt_tokens": r.prompt_tokens,
        "required_features": sorted(r.required_features),
        "required_transports": sorted(r.required_transports),
        "any_model": not r.models,
        "models": sorted(r.models),
        "targeted": targeted,
        "worker_allow": sorted(r.worker_allow) if targeted else [],
        "worker_deny": sorted(r.worker_deny),
        "failed_workers": sorted(r.failed_workers),
        "failed_owners": sorted(r.failed_owners),
        "trusted_workers": r.trusted_workers,
        "slow_workers": r.slow_workers,
        "nsfw": r.nsfw,
        "n_total": 1,
        "n_remaining": 1,
        "effective_start": NOW - 100,
        "created_at": NOW - 100,
        "expires_at": NOW + 1000,
        "requested_max_length": r.max_length,
        "context_adjustments": [],
    }


def _facts_as_stored(r: RequestFacts) -> RequestFacts:
    """The request as the row stores it (an allow-list is void when a deny-list is given)."""
    if r.worker_allow and r.worker_deny:
        return replace(r, worker_allow=frozenset())
    return r


async def _write(conn: AsyncConnection, example: Example) -> None:
    # Users get their ids from the database (it may hold some); facts name them 1 and 2.
    users: dict[int, int] = {}
    for uid in USER_IDS:
        tag = uuid.uuid4().hex
        users[uid] = (
            await conn.execute(
                insert(User)
                .values(username=f"contract-{tag}", api_key_hash=tag, created_at=NOW)
                .returning(User.id)
            )
        ).scalar_one()
    if example.workers:
        await conn.execute(
            insert(Worker), [{**_worker_row(w), "owner_id": users[w.owner_id]} for w in example.workers]
        )
        models = [{"worker_id": w.id, "model": m} for w in example.workers for m in sorted(w.models)]
        if models:
            await conn.execute(insert(WorkerModel), models)
    await conn.execute(
        insert(TextRequest),
        [
            {
                **_request_row(rid, r),
                "user_id": users[r.user_id],
                "failed_owners": sorted(str(users[int(o)]) for o in r.failed_owners),
            }
            for rid, r in example.requests
        ],
    )
    wanted = [{"request_id": rid, "model": m} for rid, r in example.requests for m in sorted(r.models)]
    if wanted:
        await conn.execute(insert(RequestModel), wanted)
    # The rows' triggers enter the requests in the queue's index, with their refusals.


async def _pairs(conn: AsyncConnection, *where: Any) -> set[tuple[str, str]]:
    rows = await conn.execute(select(_W.id, _R.id).select_from(_W).join(_R, true()).where(*where))
    return {(wid, rid) for wid, rid in rows.all()}


_W = aliased(Worker, name="w")
_R = aliased(TextRequest, name="r")


def _describe(example: Example, wid: str | None, rid: str, what: str, sql: bool, python: bool) -> str:
    worker = next((w for w in example.workers if w.id == wid), None)
    request = dict(example.requests)[rid]
    lines = [
        f"{what}: SQL says {sql}, Python says {python}",
        f"  worker {wid}: {worker}" if wid is not None else "",
        f"  request {rid}: {request}",
        "  fleet:",
        *(f"    {w}" for w in example.workers),
    ]
    return "\n".join(line for line in lines if line)


async def check_example(engine: AsyncEngine, gate: SpeedGate, example: Example, rules: Rules) -> None:
    """Write one example in a transaction, compare every pair, roll back. Raises AssertionError."""
    example = Example(
        workers=example.workers, requests=tuple((rid, _facts_as_stored(r)) for rid, r in example.requests)
    )
    assert rules.gate is gate
    async with engine.connect() as conn:
        transaction = await conn.begin()
        try:
            for table in (Worker, TextRequest):
                count = (await conn.execute(select(func.count()).select_from(table))).scalar_one()
                if count:
                    raise ValueError(
                        f"the speed gate contract needs a database without {table.__tablename__} rows "
                        f"(found {count}): the capable-worker subquery reads every worker"
                    )
            await _write(conn, example)
            fleet = list(example.workers)
            requests = dict(example.requests)

            # 1. The capable-worker input.
            rows = await conn.execute(select(_R.id).where(capable_worker_online(_R, rules)))
            sql_capable = set(rows.scalars())
            for rid, r in requests.items():
                python = any(is_capable(c, r, rules) for c in fleet)
                if (rid in sql_capable) != python:
                    raise AssertionError(
                        _describe(
                            example, None, rid, "a capable worker is online", rid in sql_capable, python
                        )
                    )

            # 2. The gate alone, for every pair.
            sql_gate = await _pairs(conn, speed_gate_admits_sql(_R, _W.capacity, rules))
            # 3. The whole pop WHERE clause.
            sql_eligible = await _pairs(conn, *eligibility_clauses(_W, _R, rules))
            for w in fleet:
                for rid, r in requests.items():
                    inputs = GateInputs(
                        is_chat=r.is_chat,
                        max_length=r.max_length,
                        capacity=w.capacity,
                        capable_worker_online=any(is_capable(c, r, rules) for c in fleet),
                    )
                    python = bool(gate.admits(inputs))
                    sql = (w.id, rid) in sql_gate
                    if sql != python:
                        raise AssertionError(
                            _describe(example, w.id, rid, f"the speed gate ({inputs})", sql, python)
                        )
                    python = is_eligible(w, r, fleet, rules)
                    sql = (w.id, rid) in sql_eligible
                    if sql != python:
                        raise AssertionError(_describe(example, w.id, rid, "eligible", sql, python))

            # 4. The capable-worker question asked of the queue's entries (the walk's): never yes
            # where the request's is no, and, for a plain chat request, yes on one of its entries
            # exactly when the request's is.
            e = QueueEntry
            asked = capable_worker_online_for_entry(e, rules)
            rows = await conn.execute(select(e.request_id, e.plain, asked))
            said: dict[str, list[tuple[bool, bool]]] = {}
            for rid, plain, capable in rows.all():
                said.setdefault(rid, []).append((bool(plain), bool(capable)))
            for rid, r in requests.items():
                python = any(is_capable(c, r, rules) for c in fleet)
                entries = said.get(rid, [])
                sql = any(capable for _, capable in entries)
                exact = r.is_chat and entries and all(p for p, _ in entries)
                if (sql and not python) or (exact and sql != python):
                    raise AssertionError(
                        _describe(example, None, rid, "a capable worker is online (its entries)", sql, python)
                    )
        finally:
            await transaction.rollback()


# --- running it --------------------------------------------------------------------------------


@dataclass
class _Coverage:
    """What the examples exercised; the contract fails if a case it promises was never run."""

    seen: set[str]

    def note(self, example: Example, rules: Rules) -> None:
        fleet = list(example.workers)
        for _, r in example.requests:
            if not r.is_chat:
                self.seen.add("legacy")
                if any(w.capacity < r.max_length for w in fleet):
                    self.seen.add("legacy over capacity")
                continue
            capable = any(is_capable(c, r, rules) for c in fleet)
            self.seen.add("chat, capable worker online" if capable else "chat, no capable worker online")
            if any(w.capacity < r.max_length for w in fleet):
                self.seen.add(f"chat over capacity, capable={capable}")

    def check(self) -> None:
        expected = {
            "legacy",
            "legacy over capacity",
            "chat, capable worker online",
            "chat, no capable worker online",
            "chat over capacity, capable=True",
            "chat over capacity, capable=False",
        }
        missing = expected - self.seen
        assert not missing, f"the contract's examples never covered: {sorted(missing)}"


def check_speed_gate(
    gate: SpeedGate,
    db_url: str,
    *,
    max_examples: int = 60,
    settings: Settings | None = None,
    hypothesis_settings: Any = None,
) -> None:
    """Run the contract for `gate` on the database at `db_url` (see the module docstring).

    `settings` are horde_lite settings whose online window, assumed speed, slow-worker threshold
    and lease lengths the rules use (defaults when None). `hypothesis_settings`, a
    `hypothesis.settings`, replaces the default (`max_examples`, no deadline, no shrinking
    database). Call it where no event loop is running; from async code use `speed_gate_contract`.
    """
    from hypothesis import HealthCheck, example, given
    from hypothesis import settings as hsettings

    from horde_lite.db import migrate
    from horde_lite.db.engine import make_engine

    settings = settings or Settings()
    if migrate.is_behind(db_url):
        migrate.upgrade(db_url)
    rules = Rules.from_settings(settings, gate, NOW)
    coverage = _Coverage(seen=set())
    config = hypothesis_settings or hsettings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    with asyncio.Runner() as runner:
        engine = runner.run(_engine(make_engine, db_url))
        try:

            def run(case: Example) -> None:
                coverage.note(case, rules)
                runner.run(check_example(engine, gate, case, rules))

            test = given(examples(settings))(run)
            for case in reversed(seed_examples(settings)):
                test = example(case)(test)
            config(test)()
        finally:
            runner.run(engine.dispose())
    coverage.check()


async def _engine(make_engine: Any, db_url: str) -> AsyncEngine:
    # Built inside the runner's loop: an async engine belongs to the loop that uses it.
    return make_engine(db_url, null_pool=True)


async def speed_gate_contract(gate: SpeedGate, db_url: str, **options: Any) -> None:
    """`check_speed_gate` for async callers: the same check, run in a worker thread."""
    await asyncio.to_thread(check_speed_gate, gate, db_url, **options)


def check_gates(gates: Iterable[SpeedGate], db_url: str, **options: Any) -> None:
    """`check_speed_gate` for several gates in turn."""
    for gate in gates:
        check_speed_gate(gate, db_url, **options)
