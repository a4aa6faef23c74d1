"""Decision 0001 (docs/decisions/0001-speed-gate-prefer-capable.md), its Confirmation section for
tests/unit/test_text_job_ttl.py, bullet by bullet, on SQLite and PostgreSQL (the rules:
docs/reference/chat_requests.md, "Job lease"):

- agreement between the pop clause and the eligibility check, for chat and legacy requests, with
  and without a capable worker online, for every built-in gate (the contract module);
- offline, unavailable and under-declared faster workers do not block a chat request; a faster
  worker is capable only with every required feature; vision also needs the image transport;
- an unmeasured worker uses the assumed speed; a slow worker is refused a chat request a capable
  worker can take and is assigned a legacy request; the capacity-limited count reads only the
  chat declaration;
- shadow records: markers and counts for legacy and chat, completed outcomes with service time,
  faulted outcomes counted once, aborted outcomes, nothing within capacity, nothing for fakes;
- feature containment gives the same answers on PostgreSQL and SQLite;
and decision 0001's worked example through HTTP.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import literal, select
from sqlalchemy.ext.asyncio import AsyncEngine

from horde_lite.db.engine import make_engine
from horde_lite.db.models import Generation
from horde_lite.db.sqltypes import JsonList, TextArrayContainsAll
from horde_lite.policies.registry import installed
from horde_lite.testing.speed_gate_contract import check_speed_gate
from tests.support.horde import HordeClient
from tests.support.prom import value

BUILT_IN_GATES = ("prefer_capable", "enforce_all", "enforce_chat", "off")
MODEL = "Rocinante-X-12B-v1"
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
ASSIGNMENTS = "horde_text_gate_shadow_assignments_total"
OUTCOMES = "horde_text_gate_shadow_outcomes_total"
SERVICE = "horde_text_gate_shadow_service_seconds"
LIMITED = "horde_pop_lease_capacity_limited_total"


# --- helpers -----------------------------------------------------------------------------------


def chat_block(
    completion: int = 2048,
    context: int = 8192,
    features: tuple[str, ...] = ("tools",),
    transports: tuple[str, ...] = (),
) -> dict[str, Any]:
    return {
        "max_completion_tokens": completion,
        "max_context_tokens": context,
        "features": list(features),
        "image_transports": list(transports),
    }


async def chat_pop(client: HordeClient, key: str, name: str, **block: Any) -> dict[str, Any]:
    response = await client.pop(
        key, name, models=[MODEL], max_length=2048, max_context_length=8192, chat=chat_block(**block)
    )
    assert response.status_code == 200, response.text
    return response.json()


async def legacy_pop(client: HordeClient, key: str, name: str, max_length: int = 2048) -> dict[str, Any]:
    response = await client.pop(key, name, models=[MODEL], max_length=max_length, max_context_length=8192)
    assert response.status_code == 200, response.text
    return response.json()


async def chat_request(client: HordeClient, key: str, max_tokens: int = 512, **extra: Any) -> str:
    payload = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, **extra}
    response = await client.create(key, models=[MODEL], chat=payload)
    assert response.status_code == 202, response.text
    return response.json()["id"]


async def legacy_request(client: HordeClient, key: str, max_length: int = 512) -> str:
    response = await client.create(
        key, models=[MODEL], params={"max_length": max_length, "max_context_length": max(2048, max_length)}
    )
    assert response.status_code == 202, response.text
    return response.json()["id"]


async def worker_id(client: HordeClient, name: str) -> str:
    response = await client.http.get("/api/v2/workers")
    assert response.status_code == 200
    return next(w["id"] for w in response.json() if w["name"] == name)


async def generation(client: HordeClient, generation_id: str) -> Generation:
    async with client.horde.sessionmaker() as session:
        row = await session.get(Generation, generation_id)
        assert row is not None
        return row


@pytest.fixture
async def keys(client: HordeClient) -> dict[str, str]:
    """A requester with kudos (the allowance is not under test here) and a worker owner."""
    return {"client": await client.user("client", kudos=100_000), "owner": await client.user("owner")}


# --- agreement between the pop clause and the eligibility check ---------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("gate_name", BUILT_IN_GATES)
def test_pop_clause_agrees_with_the_eligibility_check(gate_name: str, db_url: str) -> None:
    """Generated fleets and queues (chat and legacy, with and without a capable worker online:
    the contract fails if either case was never generated), for every built-in gate."""
    gate = installed("speed_gate")[gate_name].load()()
    check_speed_gate(gate, db_url, max_examples=40)


def test_the_contract_catches_a_gate_whose_halves_disagree(db_url: str) -> None:
    """The contract is not vacuous: a gate whose SQL forgets the capable-worker clause fails it."""
    from sqlalchemy import not_, or_

    from horde_lite_policies.speed_gate_prefer_capable import PreferCapable

    class Lopsided(PreferCapable, frozen=True):
        def admits_sql(self, sql: Any) -> Any:
            return or_(not_(sql.is_chat), sql.max_length <= sql.capacity)

    with pytest.raises(AssertionError, match="speed gate"):
        check_speed_gate(Lopsided(), db_url, max_examples=5)


# --- capable workers --------------------------------------------------------------------------


async def _slow_and_fast(client: HordeClient, keys: dict[str, str], fast: dict[str, Any]) -> None:
    """A slow chat worker at 4.0 tokens/s (capacity 480) declaring everything, and a faster one
    with the declarations `fast`; both checked in."""
    everything = {"features": ("tools", "json_schema", "vision"), "transports": ("url", "base64")}
    await chat_pop(client, keys["owner"], "slow", **everything)
    await client.set_worker_speed("slow", 4.0)
    await chat_pop(client, keys["owner"], "fast", **fast)


@pytest.mark.parametrize(
    ("state", "fast"),
    [
        ("offline", {}),
        ("maintenance", {}),
        ("paused", {}),
        ("declares fewer completion tokens", {"completion": 256}),
        ("declares a smaller context", {"context": 300}),
        ("declares no tools", {"features": ()}),
    ],
)
async def test_an_offline_unavailable_or_under_declared_faster_worker_does_not_block_a_chat_request(
    client: HordeClient, keys: dict[str, str], state: str, fast: dict[str, Any]
) -> None:
    await _slow_and_fast(client, keys, fast)
    fast_id = await worker_id(client, "fast")
    if state == "maintenance":
        response = await client.http.put(
            f"/api/v2/workers/{fast_id}", json={"maintenance": True}, headers={"apikey": keys["owner"]}
        )
        assert response.status_code == 200, response.text
    if state == "paused":
        moderator = await client.user("moderator", moderator=True)
        response = await client.http.put(
            f"/api/v2/workers/{fast_id}", json={"paused": True}, headers={"apikey": moderator}
        )
        assert response.status_code == 200, response.text
    if state == "offline":
        client.clock.advance(301)
        await chat_pop(client, keys["owner"], "slow", features=("tools",))
    request_id = await chat_request(client, keys["client"], tools=TOOLS)
    job = await chat_pop(client, keys["owner"], "slow", features=("tools",))
    assert job["id"] is not None, f"the slow worker was refused although the faster one is {state}"
    assert (await generation(client, job["id"])).request_id == request_id


async def test_a_capable_faster_worker_does_keep_a_chat_request_from_a_slow_worker(
    client: HordeClient, keys: dict[str, str]
) -> None:
    """The control for the test above: the same faster worker, online and fully declared."""
    await _slow_and_fast(client, keys, {})
    request_id = await chat_request(client, keys["client"], tools=TOOLS)
    assert (await chat_pop(client, keys["owner"], "slow"))["id"] is None
    job = await chat_pop(client, keys["owner"], "fast")
    assert (await generation(client, job["id"])).request_id == request_id


@pytest.mark.parametrize(
    ("declared", "slow_gets_it"),
    [((), True), (("tools",), True), (("json_schema",), True), (("tools", "json_schema"), False)],
)
async def test_a_faster_worker_is_capable_only_with_every_required_feature(
    client: HordeClient, keys: dict[str, str], declared: tuple[str, ...], slow_gets_it: bool
) -> None:
    await _slow_and_fast(client, keys, {"features": declared})
    await chat_request(
        client, keys["client"], tools=TOOLS, response_format={"type": "json_schema", "json_schema": {}}
    )
    job = await chat_pop(client, keys["owner"], "slow", features=("tools", "json_schema"))
    assert (job["id"] is not None) is slow_gets_it


@pytest.mark.parametrize(
    ("url", "transports", "slow_gets_it"),
    [
        ("https://example.org/cat.png", (), True),
        ("https://example.org/cat.png", ("base64",), True),
        ("https://example.org/cat.png", ("url",), False),
        ("data:image/png;base64,iVBORw0KGgo=", ("url",), True),
        ("data:image/png;base64,iVBORw0KGgo=", ("base64",), False),
        ("data:image/png;base64,iVBORw0KGgo=", ("url", "base64"), False),
    ],
)
async def test_vision_also_requires_the_url_or_base64_transport(
    client: HordeClient, keys: dict[str, str], url: str, transports: tuple[str, ...], slow_gets_it: bool
) -> None:
    """The faster worker declares vision; it is capable only with the transport the image uses."""
    await _slow_and_fast(client, keys, {"features": ("vision",), "transports": transports})
    content = [{"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": url}}]
    payload = {"messages": [{"role": "user", "content": content}], "max_tokens": 512}
    assert (await client.create(keys["client"], models=[MODEL], chat=payload)).status_code == 202
    job = await chat_pop(client, keys["owner"], "slow", features=("vision",), transports=("url", "base64"))
    assert (job["id"] is not None) is slow_gets_it


# --- speed, capacity and the gate --------------------------------------------------------------


async def test_an_unmeasured_worker_uses_the_assumed_speed(client: HordeClient, keys: dict[str, str]) -> None:
    await chat_pop(client, keys["owner"], "fresh")
    shown = (await client.http.get(f"/api/v2/workers/{await worker_id(client, 'fresh')}")).json()
    assert shown["speed_measured"] is False
    assert shown["lease_speed"] is None
    assert shown["capacity"] == 1200  # floor(10 tokens/s x 120 s)
    # As a capable worker: at 1200 tokens it keeps a chat request from a slow worker, at 1201 not.
    await chat_pop(client, keys["owner"], "slow")
    await client.set_worker_speed("slow", 4.0)
    within = await chat_request(client, keys["client"], max_tokens=1200, tools=TOOLS)
    assert (await chat_pop(client, keys["owner"], "slow"))["id"] is None
    job = await chat_pop(client, keys["owner"], "fresh")
    row = await generation(client, job["id"])
    assert row.request_id == within
    assert (row.over_capacity_at_assignment, row.capacity_at_assignment, row.speed_at_assignment) == (
        False,
        1200,
        10.0,
    )
    over = await chat_request(client, keys["client"], max_tokens=1201, tools=TOOLS)
    job = await chat_pop(client, keys["owner"], "slow")
    assert (await generation(client, job["id"])).request_id == over
    # As the popping worker: its own 1201-token job is judged against capacity 1200, speed 10.
    await legacy_request(client, keys["client"], max_length=1201)
    job = await chat_pop(client, keys["owner"], "fresh")
    row = await generation(client, job["id"])
    assert (row.over_capacity_at_assignment, row.capacity_at_assignment, row.speed_at_assignment) == (
        True,
        1200,
        10.0,
    )


async def test_a_slow_worker_is_refused_chat_a_capable_worker_can_take_and_assigned_legacy(
    client: HordeClient, keys: dict[str, str]
) -> None:
    await _slow_and_fast(client, keys, {})
    chat_id = await chat_request(client, keys["client"], tools=TOOLS)
    assert (await chat_pop(client, keys["owner"], "slow"))["id"] is None
    legacy_id = await legacy_request(client, keys["client"])
    job = await chat_pop(client, keys["owner"], "slow")
    assert (await generation(client, job["id"])).request_id == legacy_id
    # The chat request still waits for the capable worker.
    job = await chat_pop(client, keys["owner"], "fast")
    assert (await generation(client, job["id"])).request_id == chat_id


async def test_the_capacity_limited_count_uses_only_the_chat_declaration(
    client: HordeClient, keys: dict[str, str]
) -> None:
    owner = keys["owner"]
    # 4.0 tokens/s (capacity 480) for every worker below; only the chat declaration differs.
    for name in ("chat-1024", "chat-256", "legacy-2048"):
        await client.pop(owner, name)
        await client.set_worker_speed(name, 4.0)
    assert value(await client.metrics(), LIMITED) == 0
    await chat_pop(client, owner, "chat-1024", completion=1024)  # 480 < 1024: counted
    await chat_pop(client, owner, "chat-1024", completion=1024)
    await chat_pop(client, owner, "chat-256", completion=256)  # 480 >= 256: not counted
    await client.pop(owner, "legacy-2048", max_length=2048, max_context_length=4096)  # no chat block
    await chat_pop(client, owner, "chat-1024", completion=480)  # 480 >= 480: not counted
    text = await client.metrics()
    assert value(text, LIMITED) == 2
    assert (
        value(text, LIMITED, horde_size_bucket="513-1024", horde_worker_trusted=False, horde_chat=True) == 2
    )


# --- shadow records ----------------------------------------------------------------------------


@pytest.fixture
async def slow(client: HordeClient, keys: dict[str, str]) -> str:
    """A legacy worker at 4.0 tokens/s (capacity 480), checked in; returns its owner's key."""
    await legacy_pop(client, keys["owner"], "slow")
    await client.set_worker_speed("slow", 4.0)
    return keys["owner"]


@pytest.fixture
def shadow_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.INFO, logger="horde_lite.gate_shadow"):
        yield caplog


def _shadow_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "horde_lite.gate_shadow"]


async def test_over_capacity_assignments_store_a_marker_count_and_log_line_for_legacy_and_chat(
    client: HordeClient, keys: dict[str, str], shadow_log: pytest.LogCaptureFixture
) -> None:
    owner = keys["owner"]
    await chat_pop(client, owner, "slow")
    await client.set_worker_speed("slow", 4.0)
    legacy_id = await legacy_request(client, keys["client"], max_length=513)
    legacy_job = await chat_pop(client, owner, "slow")
    chat_id = await chat_request(client, keys["client"], max_tokens=2048, tools=TOOLS)
    chat_job = await chat_pop(client, owner, "slow")  # no capable worker online: admitted
    slow_id = await worker_id(client, "slow")
    for job, request_id, size in ((legacy_job, legacy_id, 513), (chat_job, chat_id, 2048)):
        row = await generation(client, job["id"])
        assert row.request_id == request_id
        assert row.over_capacity_at_assignment is True
        assert (row.capacity_at_assignment, row.speed_at_assignment) == (480, 4.0)
        line = next(m for m in _shadow_lines(shadow_log) if job["id"] in m)
        for part in (f"request={request_id}", f"worker={slow_id}", f"max_length={size}", "capacity=480"):
            assert part in line
        assert "speed=4.000" in line
    text = await client.metrics()
    assert value(text, ASSIGNMENTS) == 2
    common = {"horde_worker_trusted": False}
    assert value(text, ASSIGNMENTS, horde_chat=False, horde_size_bucket="513-1024", **common) == 1
    assert value(text, ASSIGNMENTS, horde_chat=True, horde_size_bucket="1025-2048", **common) == 1
    # The marker is fixed at assignment: a later speed change does not move it.
    await client.set_worker_speed("slow", 50.0)
    assert (await generation(client, legacy_job["id"])).capacity_at_assignment == 480


async def test_a_trusted_owners_worker_is_recorded_as_trusted(
    client: HordeClient, keys: dict[str, str]
) -> None:
    trusted = await client.user("trusted-owner", trusted=True)
    await legacy_pop(client, trusted, "slow", max_length=8192)
    await client.set_worker_speed("slow", 4.0)
    await legacy_request(client, keys["client"], max_length=4097)
    assert (await legacy_pop(client, trusted, "slow", max_length=8192))["id"] is not None
    text = await client.metrics()
    assert value(text, ASSIGNMENTS, horde_worker_trusted=True, horde_size_bucket=">4096") == 1
    assert value(text, ASSIGNMENTS, horde_worker_trusted=False) == 0


async def test_assignments_within_capacity_are_not_recorded(
    client: HordeClient, keys: dict[str, str], shadow_log: pytest.LogCaptureFixture
) -> None:
    owner = keys["owner"]
    await legacy_pop(client, owner, "exact")
    await client.set_worker_speed("exact", 4.0)
    await legacy_request(client, keys["client"], max_length=480)  # == capacity: within
    job = await legacy_pop(client, owner, "exact")
    assert (await generation(client, job["id"])).over_capacity_at_assignment is False
    client.clock.advance(20)
    assert (await client.submit(owner, job["id"], "x" * 400)).status_code == 200
    text = await client.metrics()
    assert value(text, ASSIGNMENTS) == 0
    assert value(text, OUTCOMES) == 0
    assert value(text, f"{SERVICE}_count") == 0
    assert _shadow_lines(shadow_log) == []


async def test_a_completed_outcome_records_its_service_time(
    client: HordeClient, keys: dict[str, str], slow: str
) -> None:
    await legacy_request(client, keys["client"])
    job = await legacy_pop(client, slow, "slow")
    client.clock.advance(42)
    assert (await client.submit(slow, job["id"], "x" * 2000)).status_code == 200
    text = await client.metrics()
    labels = {"horde_worker_trusted": False, "horde_size_bucket": "<=512", "horde_chat": False}
    assert value(text, OUTCOMES, outcome="completed", **labels) == 1
    assert value(text, OUTCOMES) == 1
    assert value(text, f"{SERVICE}_count", **labels) == 1
    assert value(text, f"{SERVICE}_sum", **labels) == pytest.approx(42)
    assert value(text, f"{SERVICE}_bucket", le="30.0") == 0
    assert value(text, f"{SERVICE}_bucket", le="60.0") == 1


async def test_a_faulted_outcome_is_counted_once(
    client: HordeClient, keys: dict[str, str], slow: str
) -> None:
    await legacy_request(client, keys["client"])
    job = await legacy_pop(client, slow, "slow")
    assert (await client.submit(slow, job["id"], "", state="faulted")).status_code == 200
    again = await client.submit(slow, job["id"], "", state="faulted")
    assert again.status_code == 400
    assert again.json()["rc"] == "DuplicateGen"
    assert (await client.submit(slow, job["id"], "late")).json()["rc"] == "DuplicateGen"
    client.clock.advance(200)  # its lease is long past: a sweep must not count it again
    await client.sweep()
    text = await client.metrics()
    assert value(text, OUTCOMES, outcome="faulted", horde_chat=False, horde_size_bucket="<=512") == 1
    assert value(text, OUTCOMES) == 1
    assert value(text, f"{SERVICE}_count") == 0


async def test_an_aborted_outcome_is_counted_when_the_lease_lapses(
    client: HordeClient, keys: dict[str, str], slow: str
) -> None:
    other = await client.user("other-owner")  # another owner's slow worker, checked in before any job
    await legacy_pop(client, other, "slow-2")
    await client.set_worker_speed("slow-2", 4.0)
    await legacy_request(client, keys["client"])
    job = await legacy_pop(client, slow, "slow")
    client.clock.advance(149)
    await client.sweep()
    assert value(await client.metrics(), OUTCOMES) == 0  # the lease (150 s) has not lapsed
    client.clock.advance(2)
    await client.sweep()
    await client.sweep()
    late = await client.submit(slow, job["id"], "late")
    assert late.json()["rc"] == "AbortedGen"
    text = await client.metrics()
    assert value(text, OUTCOMES, outcome="aborted", horde_chat=False, horde_size_bucket="<=512") == 1
    assert value(text, OUTCOMES) == 1
    # The job was given back, but not to the owner whose worker let it lapse; its next assignment,
    # to another owner's slow worker, is a new over-capacity record.
    assert (await legacy_pop(client, slow, "slow"))["id"] is None
    assert (await legacy_pop(client, other, "slow-2"))["id"] is not None
    assert value(await client.metrics(), ASSIGNMENTS) == 2


async def test_an_aborted_chat_outcome_is_counted_with_chat_true(
    client: HordeClient, keys: dict[str, str]
) -> None:
    await chat_pop(client, keys["owner"], "slow")
    await client.set_worker_speed("slow", 4.0)
    await chat_request(client, keys["client"], max_tokens=1024, tools=TOOLS)
    assert (await chat_pop(client, keys["owner"], "slow"))["id"] is not None
    client.clock.advance(151)
    await client.sweep()
    text = await client.metrics()
    assert value(text, OUTCOMES, outcome="aborted", horde_chat=True, horde_size_bucket="513-1024") == 1


async def test_fake_generations_are_not_recorded(
    client: HordeClient, keys: dict[str, str], shadow_log: pytest.LogCaptureFixture
) -> None:
    """A paused worker (set by a moderator) gets fake copies of real requests: over its capacity,
    completed, faulted or lapsed, none is recorded, and neither are its capacity-limited pops."""
    owner = keys["owner"]
    await chat_pop(client, owner, "slow", completion=1024)
    await client.set_worker_speed("slow", 4.0)  # capacity 480, below its declared 1024
    moderator = await client.user("moderator", moderator=True)
    response = await client.http.put(
        f"/api/v2/workers/{await worker_id(client, 'slow')}",
        json={"paused": True},
        headers={"apikey": moderator},
    )
    assert response.status_code == 200, response.text
    await legacy_request(client, keys["client"], max_length=1024)
    await chat_request(client, keys["client"], max_tokens=1024, tools=TOOLS)
    jobs = [await chat_pop(client, owner, "slow", completion=1024) for _ in range(3)]
    for job in jobs:
        assert job["id"] is not None  # a paused worker gets a fake copy of a real request
        row = await generation(client, job["id"])
        assert row.fake is True
        assert row.over_capacity_at_assignment is False
    client.clock.advance(30)
    assert (await client.submit(owner, jobs[0]["id"], "x" * 100)).status_code == 200
    assert (await client.submit(owner, jobs[1]["id"], "", state="faulted")).status_code == 200
    client.clock.advance(151)
    await client.sweep()
    assert (await client.submit(owner, jobs[2]["id"], "late")).json()["rc"] == "AbortedGen"
    text = await client.metrics()
    for name in (ASSIGNMENTS, OUTCOMES, f"{SERVICE}_count", LIMITED):
        assert value(text, name) == 0, name
    assert _shadow_lines(shadow_log) == []
    # The same worker unpaused: its next pop is real, over capacity and recorded.
    response = await client.http.put(
        f"/api/v2/workers/{await worker_id(client, 'slow')}",
        json={"paused": False},
        headers={"apikey": moderator},
    )
    assert response.status_code == 200
    assert (await chat_pop(client, owner, "slow", completion=1024))["id"] is not None
    text = await client.metrics()
    assert value(text, ASSIGNMENTS) == 1
    assert value(text, LIMITED) == 1


# --- decision 0001's example through HTTP ---------------------------------------------------


async def test_the_seed_example_a_4_tokens_per_second_worker_and_512_token_requests(
    client: HordeClient, keys: dict[str, str]
) -> None:
    """A worker at 4.0 tokens/s (capacity 480) is refused a 512-token chat request while an
    unmeasured worker serving the model with tools declared is online, gets it once that worker
    goes offline, and always gets a 512-token legacy request; each over-capacity assignment is
    visible on /metrics."""
    owner = keys["owner"]
    await chat_pop(client, owner, "slow", completion=1024)
    await client.set_worker_speed("slow", 4.0)
    await chat_pop(client, owner, "capable", completion=1024)
    shown = (await client.http.get(f"/api/v2/workers/{await worker_id(client, 'slow')}")).json()
    assert shown["capacity"] == 480

    chat_id = await chat_request(client, keys["client"], max_tokens=512, tools=TOOLS)
    assert (await chat_pop(client, owner, "slow", completion=1024))["id"] is None
    legacy_id = await legacy_request(client, keys["client"], max_length=512)
    job = await chat_pop(client, owner, "slow", completion=1024)
    assert (await generation(client, job["id"])).request_id == legacy_id
    text = await client.metrics()
    assert value(text, ASSIGNMENTS, horde_chat=False, horde_size_bucket="<=512") == 1
    assert value(text, ASSIGNMENTS, horde_chat=True) == 0

    # The capable worker stops checking in; the slow one keeps popping.
    client.clock.advance(150)
    assert (await chat_pop(client, owner, "slow", completion=1024))["id"] is None
    client.clock.advance(151)  # 301 s since the capable worker's last check-in
    job = await chat_pop(client, owner, "slow", completion=1024)
    assert (await generation(client, job["id"])).request_id == chat_id
    text = await client.metrics()
    assert (
        value(text, ASSIGNMENTS, horde_chat=True, horde_size_bucket="<=512", horde_worker_trusted=False) == 1
    )

    # And a legacy request goes to the slow worker whether or not a capable one is online.
    await chat_pop(client, owner, "capable", completion=1024)
    legacy_again = await legacy_request(client, keys["client"], max_length=512)
    job = await chat_pop(client, owner, "slow", completion=1024)
    assert (await generation(client, job["id"])).request_id == legacy_again
    text = await client.metrics()
    assert value(text, ASSIGNMENTS, horde_chat=False) == 2
    assert value(text, ASSIGNMENTS) == 3
    # Every pop by the slow worker (capacity 480 below its declared 1024) counted as limited.
    assert value(text, LIMITED) == 5


# --- feature containment on both databases -----------------------------------------------------


@pytest.fixture
def engine_runner(db_url: str) -> Iterator[tuple[asyncio.Runner, AsyncEngine]]:
    with asyncio.Runner() as runner:
        engine = runner.run(_make_engine(db_url))
        try:
            yield runner, engine
        finally:
            runner.run(engine.dispose())


async def _make_engine(url: str) -> AsyncEngine:
    return make_engine(url, null_pool=True)


ELEMENTS = st.sampled_from(["tools", "json_schema", "vision", "url", "base64", "", "a'b", 'q"', "ü", "TOOLS"])


@given(haystack=st.lists(ELEMENTS, max_size=5), needles=st.lists(ELEMENTS, max_size=5))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_feature_containment_matches_set_containment(
    engine_runner: tuple[asyncio.Runner, AsyncEngine], haystack: list[str], needles: list[str]
) -> None:
    """TextArrayContainsAll (`@>` on PostgreSQL, a json_each anti-join on SQLite) answers exactly
    Python's `set(needles) <= set(haystack)`, empty lists and duplicates included."""
    runner, engine = engine_runner
    assert runner.run(_contains(engine, haystack, needles)) is (set(needles) <= set(haystack))


async def _contains(engine: AsyncEngine, haystack: list[str], needles: list[str]) -> bool:
    query = select(TextArrayContainsAll(literal(haystack, JsonList), literal(needles, JsonList)))
    async with engine.connect() as conn:
        return bool((await conn.execute(query)).scalar_one())


def test_feature_containment_over_stored_rows(engine_runner: tuple[asyncio.Runner, AsyncEngine]) -> None:
    """The same construct over the stored columns the pop reads (worker and request rows)."""
    runner, engine = engine_runner
    assert runner.run(_containment_over_rows(engine)) == {
        ("w-none", "r-none"),
        ("w-tools", "r-none"),
        ("w-tools", "r-tools"),
        ("w-all", "r-none"),
        ("w-all", "r-tools"),
        ("w-all", "r-tools-vision"),
    }


async def _containment_over_rows(engine: AsyncEngine) -> set[tuple[str, str]]:
    from sqlalchemy import insert, true
    from sqlalchemy.orm import aliased

    from horde_lite.db.models import TextRequest, User, Worker

    workers = {"w-none": [], "w-tools": ["tools"], "w-all": ["json_schema", "tools", "vision"]}
    requests = {
        "r-none": [],
        "r-tools": ["tools"],
        "r-tools-vision": ["tools", "vision"],
        "r-json-url": ["url"],
    }
    async with engine.connect() as conn:
        transaction = await conn.begin()
        try:
            uid = (
                await conn.execute(
                    insert(User).values(username="u", api_key_hash="h", created_at=0.0).returning(User.id)
                )
            ).scalar_one()
            await conn.execute(
                insert(Worker),
                [
                    {"id": wid, "name": wid, "owner_id": uid, "chat_features": f, "last_check_in": 0.0,
                     "created_at": 0.0, "models": [], "priority_user_ids": [], "chat_image_transports": [],
                     "speed_samples": []}
                    for wid, f in workers.items()
                ],
            )  # fmt: skip
            await conn.execute(
                insert(TextRequest),
                [
                    {"id": rid, "user_id": uid, "requester_kind": "registered", "required_features": f,
                     "max_length": 16, "max_context_length": 80, "effective_start": 0.0, "created_at": 0.0,
                     "expires_at": 1.0, "requested_max_length": 16, "params": {}, "models": [],
                     "required_transports": [], "worker_allow": [], "worker_deny": [],
                     "context_adjustments": []}
                    for rid, f in requests.items()
                ],
            )  # fmt: skip
            w, r = aliased(Worker), aliased(TextRequest)
            rows = await conn.execute(
                select(w.id, r.id)
                .join(r, true())
                .where(TextArrayContainsAll(w.chat_features, r.required_features))
            )
            return {(a, b) for a, b in rows.all()}
        finally:
            await transaction.rollback()
