"""One eligibility check, every reader (docs/explanation/dispatch.md; decisions 0001 and 0002): the
wait estimate's
competing work and eligible speed, the status route, the pop and the model listing agree, on
SQLite and PostgreSQL.

Slow workers count as capacity for legacy requests and for chat requests no capable worker can
take, and not for chat requests a capable worker can take (decision 0001).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from litestar.testing import AsyncTestClient
from sqlalchemy import bindparam, delete, literal, select

from horde_lite.accounts.workers import capacity_for, declared_models, look_up, worker_name_key
from horde_lite.clock import ManualClock
from horde_lite.db.models import Base, TextRequest, User, Worker, WorkerModel
from horde_lite.db.sqltypes import (
    JsonList,
    OneOf,
    TextArrayContainsAll,
    TextArrayHas,
    TextArraysOverlap,
    TextList,
)
from horde_lite.inputs import ChatBlock, PopInput
from horde_lite.jobs import dispatch
from horde_lite.queue import queue_index
from horde_lite.queue.eligibility import (
    RequestFacts,
    is_eligible,
    request_facts,
    worker_facts,
)
from horde_lite.queue.estimate import Estimate, estimate_request
from tests.conftest import make_settings
from tests.support.apps import app_for
from tests.support.horde import ANON, HordeClient

MODEL = "Rocinante-X-12B-v1"
DECL = {"max_length": 4096, "max_context_length": 8192}
CHAT = {"max_completion_tokens": 4096, "max_context_tokens": 8192}


# --- helpers -----------------------------------------------------------------------------------


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[HordeClient]:
    """The app, with a wait estimate that counts the whole queue ahead (its horizon is past anything
    these tests queue): the readers must agree on exact figures, not on where a walk stopped."""
    settings = make_settings(db_url, allowance={"estimate_horizon_seconds": 10**9})
    app = app_for(settings, ManualClock())
    async with AsyncTestClient(app=app, timeout=30) as http:
        yield HordeClient(http, app.state.horde)


async def online_worker(
    client: HordeClient, key: str, name: str, *, models: list[str] | None = None, **declarations: Any
) -> None:
    body = {**DECL, **declarations}
    response = await client.pop(key, name, models=[MODEL] if models is None else models, **body)
    assert response.status_code == 200, response.text
    assert response.json()["id"] is None


async def pop(
    client: HordeClient, key: str, name: str, *, models: list[str] | None = None, **declarations: Any
) -> dict[str, Any]:
    body = {**DECL, **declarations}
    response = await client.pop(key, name, models=[MODEL] if models is None else models, **body)
    assert response.status_code == 200, response.text
    return response.json()


async def create(
    client: HordeClient, key: str, max_length: int, *, n: int = 1, model: str = MODEL, **body: Any
) -> str:
    response = await client.create(
        key, models=[model], params={"max_length": max_length, "max_context_length": 8192, "n": n}, **body
    )
    assert response.status_code == 202, response.text
    return response.json()["id"]


async def create_chat(
    client: HordeClient, key: str, max_tokens: int, *, model: str = MODEL, **chat: Any
) -> str:
    response = await client.create(
        key,
        models=[model],
        chat={"messages": [{"role": "user", "content": "Hello there."}], "max_tokens": max_tokens, **chat},
    )
    assert response.status_code == 202, response.text
    return response.json()["id"]


async def estimate_of(client: HordeClient, request_id: str) -> Estimate:
    horde = client.horde
    async with horde.sessionmaker() as session:
        return await estimate_request(horde, session, request_id, horde.rules(horde.clock.now()))


async def status_of(client: HordeClient, request_id: str) -> dict[str, Any]:
    response = await client.status(request_id)
    assert response.status_code == 200, response.text
    return response.json()


async def worker_id(client: HordeClient, name: str) -> str:
    async with client.horde.sessionmaker() as session:
        return (await session.execute(select(Worker.id).where(Worker.name == name))).scalar_one()


async def listed(client: HordeClient) -> dict[str, dict[str, Any]]:
    response = await client.http.get("/api/v2/status/models?type=text")
    assert response.status_code == 200
    return {m["name"]: m for m in response.json()}


# --- the wait estimate ----------------------------------------------------------------------------


async def test_competing_work_and_eligible_speed(client: HordeClient) -> None:
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    await online_worker(client, owner, "fast", threads=1)
    await client.set_worker_speed("fast", 20.0)
    await online_worker(client, owner, "new", threads=2)  # unmeasured: the assumed 10 tokens/s
    await create(client, rich, 600, n=2)
    client.clock.advance(1)
    await create(client, rich, 300)
    client.clock.advance(1)
    mine = await create(client, ANON, 200)
    est = await estimate_of(client, mine)
    assert est.eligible_workers == 2
    assert est.eligible_threads == 3
    assert est.eligible_speed == pytest.approx(30.0)
    assert est.competing_work == 1500
    assert est.competing_jobs == 3
    assert est.competing_requests == 2
    assert est.own_remaining == 200
    assert est.estimated_wait == pytest.approx(50.0)
    status = await status_of(client, mine)
    assert status["wait_time"] == 56  # (1500 + 200) / 30
    assert status["queue_position"] == 3
    assert status["is_possible"] is True
    # A job handed out is no longer queued work: one of the 600-token jobs goes.
    job = await pop(client, owner, "fast", threads=1)
    assert job["payload"]["max_length"] == 600
    assert (await estimate_of(client, mine)).competing_work == 900
    status = await status_of(client, mine)
    assert status["wait_time"] == 36  # (900 + 200) / 30
    assert status["queue_position"] == 3


async def test_work_behind_the_request_does_not_count(client: HordeClient) -> None:
    owner = await client.user("owner")
    await online_worker(client, owner, "only")
    first = await create(client, ANON, 400)
    client.clock.advance(1)
    await create(client, ANON, 800)
    est = await estimate_of(client, first)
    assert (est.competing_work, est.competing_requests) == (0, 0)
    assert (await status_of(client, first))["queue_position"] == 1
    assert (await status_of(client, first))["wait_time"] == 40


async def test_requests_ahead_that_no_eligible_worker_could_take_do_not_count(client: HordeClient) -> None:
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    payer = await client.user("payer", kudos=100_000)
    await online_worker(client, owner, "mine", max_length=2048)
    await online_worker(
        client, owner, "other", models=["Other-12B"], max_length=8192, max_context_length=16384
    )
    await online_worker(client, owner, "slow", max_length=2048)
    await client.set_worker_speed("slow", 1.0)
    other_id = await worker_id(client, "other")
    slow_id = await worker_id(client, "slow")
    # Ahead, but none of them is takeable by an eligible worker of the request below:
    await create(client, rich, 1000, model="Other-12B")  # another model's worker
    await create(client, rich, 4000)  # longer than any worker of the model declares
    await create(client, rich, 500, trusted_workers=True)  # no trusted worker at all
    await create(client, rich, 700, workers=[other_id])  # targeted at a worker of another model
    await create(client, rich, 900, workers=[slow_id])  # only the slow worker may take it
    client.clock.advance(1)
    mine = await create(client, payer, 300, slow_workers=False)
    est = await estimate_of(client, mine)
    assert est.eligible_workers == 1  # "mine": "slow" is excluded by slow_workers=false
    assert (est.competing_work, est.competing_requests) == (0, 0)
    assert (await status_of(client, mine))["queue_position"] == 1
    # The same request allowing slow workers competes with the job only the slow worker may take.
    client.clock.advance(1)
    allows_slow = await create(client, payer, 300)
    est = await estimate_of(client, allows_slow)
    assert est.eligible_workers == 2
    assert est.eligible_speed == pytest.approx(11.0)
    assert est.competing_work == 900 + 300  # the slow-only job, and the payer's first request
    assert est.competing_requests == 2


async def test_a_shared_worker_makes_another_models_work_compete(client: HordeClient) -> None:
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    await online_worker(client, owner, "both", models=[MODEL, "Other-12B"])
    await create(client, rich, 1000, model="Other-12B")
    client.clock.advance(1)
    mine = await create(client, ANON, 100)
    est = await estimate_of(client, mine)
    assert (est.competing_work, est.competing_requests) == (1000, 1)
    assert est.estimated_wait == pytest.approx(100.0)


# --- slow workers and the speed gate (decision 0001) ----------------------------------------------


async def test_slow_worker_counts_for_a_legacy_request_over_its_capacity(client: HordeClient) -> None:
    owner = await client.user("owner")
    await online_worker(client, owner, "slow")
    await client.set_worker_speed("slow", 4.0)  # capacity 480
    await online_worker(client, owner, "fast")
    await client.set_worker_speed("fast", 20.0)  # capacity 2400
    mine = await create(client, ANON, 2048)
    est = await estimate_of(client, mine)
    assert est.eligible_workers == 2
    assert est.eligible_speed == pytest.approx(24.0)
    assert (await pop(client, owner, "slow"))["payload"]["max_length"] == 2048


async def test_slow_worker_counts_for_a_chat_request_over_every_capacity(client: HordeClient) -> None:
    owner = await client.user("owner")
    await online_worker(client, owner, "slow-a", chat=CHAT)
    await online_worker(client, owner, "slow-b", chat=CHAT)
    await client.set_worker_speed("slow-a", 4.0)  # capacity 480
    await client.set_worker_speed("slow-b", 8.0)  # capacity 960
    mine = await create_chat(client, ANON, 1024)
    est = await estimate_of(client, mine)
    assert est.eligible_workers == 2
    assert est.eligible_speed == pytest.approx(12.0)
    status = await status_of(client, mine)
    assert status["is_possible"] is True
    assert status["wait_time"] == 85  # 1024 / 12
    assert (await pop(client, owner, "slow-a", chat=CHAT))["id"] is not None


async def test_slow_worker_does_not_count_for_a_chat_request_a_capable_worker_can_take(
    client: HordeClient,
) -> None:
    owner = await client.user("owner")
    await online_worker(client, owner, "slow", chat=CHAT)
    await client.set_worker_speed("slow", 4.0)  # capacity 480
    await online_worker(client, owner, "fast", chat=CHAT)
    await client.set_worker_speed("fast", 20.0)  # capacity 2400: capable
    mine = await create_chat(client, ANON, 1024)
    est = await estimate_of(client, mine)
    assert est.eligible_workers == 1
    assert est.eligible_speed == pytest.approx(20.0)
    assert (await status_of(client, mine))["wait_time"] == 51  # 1024 / 20, not / 24
    assert (await pop(client, owner, "slow", chat=CHAT))["id"] is None
    assert (await pop(client, owner, "fast", chat=CHAT))["id"] is not None


async def test_a_capable_worker_for_another_model_does_not_block_a_slow_one(client: HordeClient) -> None:
    """The capable-worker check looks at this request's models only (it once cross-joined the
    queue and counted a capable worker for any queued request's model)."""
    owner = await client.user("owner")
    await online_worker(client, owner, "fast-other", models=["Other-12B"], chat=CHAT)
    await client.set_worker_speed("fast-other", 20.0)
    await online_worker(client, owner, "slow", chat=CHAT)
    await client.set_worker_speed("slow", 4.0)
    await create_chat(client, ANON, 1024, model="Other-12B")
    mine = await create_chat(client, ANON, 1024)
    est = await estimate_of(client, mine)
    assert est.eligible_workers == 1
    assert (await status_of(client, mine))["is_possible"] is True
    job = await pop(client, owner, "slow", chat=CHAT)
    assert job["id"] is not None
    assert job["model"] == MODEL


async def test_unmeasured_worker_is_counted_at_the_assumed_speed(client: HordeClient) -> None:
    owner = await client.user("owner")
    await online_worker(client, owner, "new")
    mine = await create(client, ANON, 1000)
    est = await estimate_of(client, mine)
    assert est.eligible_speed == pytest.approx(client.horde.settings.speed.assumed_tokens_per_second)
    assert (await status_of(client, mine))["wait_time"] == 100


# --- maintenance, paused, offline ------------------------------------------------------------------


async def test_maintenance_and_paused_workers_do_not_count(client: HordeClient) -> None:
    owner = await client.user("owner")
    moderator = await client.user("mod", moderator=True)
    await online_worker(client, owner, "resting")
    await online_worker(client, owner, "caught")
    resting, caught = await worker_id(client, "resting"), await worker_id(client, "caught")
    put = await client.http.put(
        f"/api/v2/workers/{resting}", json={"maintenance": True}, headers={"apikey": owner}
    )
    assert put.status_code == 200, put.text
    put = await client.http.put(
        f"/api/v2/workers/{caught}", json={"paused": True}, headers={"apikey": moderator}
    )
    assert put.status_code == 200, put.text
    mine = await create(client, ANON, 300)
    est = await estimate_of(client, mine)
    assert est.eligible_workers == 0
    assert est.estimated_wait is None
    status = await status_of(client, mine)
    assert status["is_possible"] is False
    assert status["wait_time"] == 0
    assert MODEL not in await listed(client)
    assert (await pop(client, owner, "resting"))["id"] is None
    # The paused worker is handed a fake copy; the request itself stays untouched.
    await pop(client, owner, "caught")
    assert (await status_of(client, mine))["waiting"] == 1
    assert (await status_of(client, mine))["processing"] == 0


async def test_the_owners_requests_reach_a_worker_in_maintenance(client: HordeClient) -> None:
    owner = await client.user("owner")
    other = await client.user("other")
    await online_worker(client, owner, "resting")
    resting = await worker_id(client, "resting")
    put = await client.http.put(
        f"/api/v2/workers/{resting}", json={"maintenance": True}, headers={"apikey": owner}
    )
    assert put.status_code == 200
    theirs = await create(client, other, 300)
    client.clock.advance(1)
    own = await create(client, owner, 300)
    assert (await estimate_of(client, theirs)).eligible_workers == 0
    est = await estimate_of(client, own)
    assert est.eligible_workers == 1
    # The other user's request ahead is not work the owner's worker could take now.
    assert (est.competing_work, est.competing_requests) == (0, 0)
    assert (await status_of(client, own))["is_possible"] is True
    assert (await status_of(client, theirs))["is_possible"] is False
    job = await pop(client, owner, "resting")
    assert job["id"] is not None
    assert (await status_of(client, own))["processing"] == 1


async def test_an_offline_worker_does_not_count(client: HordeClient) -> None:
    owner = await client.user("owner")
    await online_worker(client, owner, "gone")
    client.clock.advance(client.horde.settings.worker.online_seconds + 1)
    mine = await create(client, ANON, 300)
    assert (await estimate_of(client, mine)).eligible_workers == 0
    assert (await status_of(client, mine))["is_possible"] is False
    assert MODEL not in await listed(client)


async def test_processing_job_keeps_a_request_possible(client: HordeClient) -> None:
    owner = await client.user("owner")
    await online_worker(client, owner, "only")
    mine = await create(client, ANON, 300, n=2)
    await pop(client, owner, "only")
    client.clock.advance(client.horde.settings.worker.online_seconds + 1)  # the worker goes offline
    status = await status_of(client, mine)
    # (the lease lapsed too, and the status read honours it)
    assert status["processing"] == 0
    assert status["is_possible"] is False


# --- every reader agrees, over generated fleets ------------------------------------------------------

USERS = ("alice", "bob", "carol")  # alice asks; bob's workers are trusted
MODELS = ("a", "b")


@dataclass
class Spec:
    name: str
    owner: str
    models: list[str]
    max_length: int
    max_context_length: int
    threads: int
    speed: float | None
    chat: dict[str, Any] | None
    maintenance: bool
    paused: bool
    online: bool


workers_st = st.lists(
    st.builds(
        dict,
        owner=st.sampled_from(USERS),
        models=st.lists(st.sampled_from(MODELS), min_size=1, max_size=2, unique=True),
        max_length=st.sampled_from([256, 1024, 4096]),
        max_context_length=st.sampled_from([1024, 8192]),
        threads=st.integers(1, 3),
        speed=st.sampled_from([None, 1.0, 4.0, 20.0]),
        chat=st.none()
        | st.builds(
            dict,
            max_completion_tokens=st.sampled_from([512, 2048]),
            max_context_tokens=st.sampled_from([1024, 8192]),
            features=st.lists(st.just("tools"), max_size=1),
        ),
        maintenance=st.sampled_from([False, False, False, True]),
        paused=st.sampled_from([False, False, False, False, True]),
        online=st.sampled_from([True, True, True, False]),
    ),
    max_size=6,
)
request_st = st.builds(
    dict,
    chat=st.booleans(),
    models=st.lists(st.sampled_from(MODELS), max_size=2, unique=True),
    max_length=st.sampled_from([200, 800, 2000]),
    n=st.integers(1, 3),
    slow_workers=st.booleans(),
    trusted_workers=st.sampled_from([False, False, True]),
    tools=st.sampled_from([False, False, True]),
    allow=st.none() | st.lists(st.integers(0, 5), max_size=3, unique=True),
)


async def _wipe(client: HordeClient) -> None:
    async with client.horde.sessionmaker() as session, session.begin():
        for table in reversed(Base.metadata.sorted_tables):
            await session.execute(delete(table))


async def _fleet(client: HordeClient, users: dict[str, int], drawn: list[dict[str, Any]]) -> list[Spec]:
    horde = client.horde
    now = horde.clock.now()
    specs = [Spec(name=f"w{i}", **d) for i, d in enumerate(drawn)]
    async with horde.sessionmaker() as session, session.begin():
        for spec in specs:
            chat = spec.chat or {}
            worker = Worker(
                id=str(uuid.uuid4()),
                name=spec.name,
                name_key=worker_name_key(spec.name),  # so each one's pop checks in this row
                owner_id=users[spec.owner],
                trusted=spec.owner == "bob",
                models=spec.models,
                max_length=spec.max_length,
                max_context_length=spec.max_context_length,
                threads=spec.threads,
                nsfw=False,
                priority_user_ids=[],
                chat_max_completion_tokens=chat.get("max_completion_tokens"),
                chat_max_context_tokens=chat.get("max_context_tokens"),
                chat_features=sorted(chat.get("features", [])),
                chat_image_transports=[],
                maintenance=spec.maintenance,
                paused=spec.paused,
                last_check_in=now if spec.online else now - horde.settings.worker.online_seconds - 5,
                created_at=now - 1000,
                lease_speed=spec.speed,
                speed_samples=[] if spec.speed is None else [spec.speed],
                capacity=capacity_for(spec.speed, horde.settings),
            )
            session.add(worker)
            await session.flush()
            session.add_all(WorkerModel(worker_id=worker.id, model=m) for m in spec.models)
    return specs


async def _create(client: HordeClient, key: str, drawn: dict[str, Any], ids: list[str]) -> str:
    body: dict[str, Any] = {
        "models": drawn["models"],
        "slow_workers": drawn["slow_workers"],
        "trusted_workers": drawn["trusted_workers"],
    }
    allow = [ids[i] for i in drawn.get("allow") or [] if i < len(ids)]
    if allow:
        body["workers"] = allow
    if drawn["chat"]:
        chat: dict[str, Any] = {
            "messages": [{"role": "user", "content": "Hello there."}],
            "max_tokens": drawn["max_length"],
        }
        if drawn["tools"]:
            chat["tools"] = [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
            ]
        body["chat"] = chat
    else:
        body["params"] = {"max_length": drawn["max_length"], "max_context_length": 4096, "n": drawn["n"]}
    response = await client.create(key, **body)
    assert response.status_code == 202, response.text
    return response.json()["id"]


def _pop_input(spec: Spec) -> PopInput:
    chat = None
    if spec.chat is not None:
        chat = ChatBlock(
            max_completion_tokens=spec.chat["max_completion_tokens"],
            max_context_tokens=spec.chat["max_context_tokens"],
            features=spec.chat["features"],
        )
    return PopInput(
        name=spec.name,
        models=spec.models,
        max_length=spec.max_length,
        max_context_length=spec.max_context_length,
        threads=spec.threads,
        chat=chat,
    )


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@pytest.mark.slow
@given(fleet=workers_st, ahead=st.lists(request_st, max_size=3), mine=request_st)
async def test_every_reader_agrees_with_the_eligibility_check(
    client: HordeClient, fleet: list[dict[str, Any]], ahead: list[dict[str, Any]], mine: dict[str, Any]
) -> None:
    """For a generated fleet and queue: the Python check, the wait estimate (eligible workers,
    speed, competing work), the status route, every online worker's pop and the model listing all
    give the same answer."""
    horde = client.horde
    await _wipe(client)
    keys = {name: await client.user(name, kudos=1_000_000, trusted=name == "bob") for name in USERS}
    rich = await client.user("rich", kudos=1_000_000_000)  # its requests are ahead of alice's
    async with horde.sessionmaker() as session:
        users = {u.username: u.id for u in (await session.execute(select(User))).scalars()}
    specs = await _fleet(client, users, fleet)
    async with horde.sessionmaker() as session:
        rows = {w.name: w for w in (await session.execute(select(Worker))).scalars()}
    ids = [rows[s.name].id for s in specs]
    ahead_ids = [await _create(client, rich, drawn, ids) for drawn in ahead]
    client.clock.advance(1)
    request_id = await _create(client, keys["alice"], mine, ids)

    now = horde.clock.now()
    rules = horde.rules(now)
    async with horde.sessionmaker() as session:
        requests = {r.id: r for r in (await session.execute(select(TextRequest))).scalars()}
    facts = [worker_facts(w) for w in rows.values()]
    by_id = {f.id: f for f in facts}
    speed_of = {f.id: f.lease_speed if f.lease_speed is not None else rules.assumed_speed for f in facts}
    rfacts = {rid: request_facts(r) for rid, r in requests.items()}
    eligible = {rid: {f.id for f in facts if is_eligible(f, rf, facts, rules)} for rid, rf in rfacts.items()}

    # The wait estimate reads the same check: eligible workers, their speed, the competing work.
    mine_eligible = eligible[request_id]
    competing = [
        rid
        for rid in ahead_ids
        if any(is_eligible(by_id[w], rfacts[rid], facts, rules) for w in mine_eligible)
    ]
    est = await estimate_of(client, request_id)
    assert est.eligible_workers == len(mine_eligible)
    assert est.eligible_threads == sum(
        rows_by_id.threads for rows_by_id in rows.values() if rows_by_id.id in mine_eligible
    )
    speed = sum(speed_of[w] for w in mine_eligible)
    assert est.eligible_speed == pytest.approx(speed)
    work = (
        sum(requests[rid].max_length * requests[rid].n_remaining for rid in competing) if mine_eligible else 0
    )
    assert est.competing_work == work
    assert est.competing_requests == (len(competing) if mine_eligible else 0)

    # The status route.
    own = requests[request_id].max_length * requests[request_id].n_remaining
    status = await status_of(client, request_id)
    assert status["is_possible"] is bool(mine_eligible)
    assert status["wait_time"] == (math.floor((work + own) / speed) if mine_eligible else 0)
    assert status["queue_position"] == 1 + (len(competing) if mine_eligible else 0)

    # The pop (in a transaction rolled back each time): an online, unpaused worker is offered a
    # job exactly when it is eligible for some offered request, and only such a request.
    for spec in specs:
        if not spec.online or spec.paused:
            continue
        worker = rows[spec.name]
        async with horde.sessionmaker() as session:
            owner = await session.get(User, users[spec.owner])
            assert owner is not None
            _, job = await dispatch.pop(session, horde, owner, _pop_input(spec))
            got = None if job is None else job.request.id
            await session.rollback()
        could = {rid for rid, ws in eligible.items() if worker.id in ws}
        if got is None:
            assert could == set(), (spec, could)
        else:
            assert got in could, (spec, got)

    # The look's probe (an idle pop's one statement) finds a worker's first page empty exactly
    # when the page's own statement does, and never when the worker could take a request.
    for spec in specs:
        body = _pop_input(spec)
        probe = queue_index.Probe.of(declared_models(body), chat=body.chat is not None, now=now)
        async with horde.reading() as session:
            statement = dispatch.look_statement(rules, probe)
            conn = await session.connection()
            named = await look_up(conn, keys[spec.owner], spec.name, now, statement, probe.values)
            assert named is not None
            assert named.worker is not None
            limits = queue_index.Limits.of(named.worker, rules)
            page = await queue_index.page(session, spec.models, size=dispatch.POP_PAGE, limits=limits)
        assert bool(named.extra[1]) is bool(page.rows), spec
        if spec.online and not spec.paused and not spec.maintenance:
            assert bool(page.rows) or not {rid for rid, ws in eligible.items() if named.worker.id in ws}

    # The model listing: a model's count and speed are its workers eligible for the smallest
    # legacy request from someone who owns no worker.
    listing = await listed(client)
    for model in MODELS:
        smallest = RequestFacts(user_id=users["rich"], is_chat=False, max_length=16, max_context_length=80,
                                models=frozenset({model}))  # fmt: skip
        serving = [f for f in facts if is_eligible(f, smallest, facts, rules)]
        if not serving:
            assert model not in listing
            continue
        assert listing[model]["count"] == len(serving)
        assert listing[model]["performance"] == pytest.approx(
            round(sum(speed_of[f.id] for f in serving) / len(serving), 2)
        )


# --- the JSON list constructs the check is built from -------------------------------------------------

names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(left=st.lists(names, max_size=4), right=st.lists(names, max_size=4), value=names)
async def test_json_list_constructs_match_python_sets(
    client: HordeClient, left: list[str], right: list[str], value: str
) -> None:
    """The model rule (overlap), the allow/deny lists (membership) and the chat features
    (containment) against Python's set operations, with awkward strings, on both databases; and
    the claim's one-parameter id list (`OneOf`) against Python's `in`."""
    a, b = literal(left, JsonList), literal(right, JsonList)
    one_of = OneOf(literal(value), bindparam("ids", left, type_=TextList))
    async with client.horde.sessionmaker() as session:
        overlap, has, contains, among = (
            await session.execute(
                select(
                    TextArraysOverlap(a, b),
                    TextArrayHas(a, literal(value)),
                    TextArrayContainsAll(a, b),
                    one_of,
                )
            )
        ).one()
    assert bool(overlap) is bool(set(left) & set(right))
    assert bool(has) is (value in left)
    assert bool(contains) is set(right).issubset(left)
    assert bool(among) is (value in left)
