"""The free output allowance (decision 0002; docs/reference/chat_requests.md, "Free output
allowance"): the curve, the upfront decision and its metrics, on SQLite and PostgreSQL through the real app.

Most tests read the allowance the way a client can: an anonymous dry run for 16,384 tokens with
`allow_downgrade` is answered with the max_length the request would be lowered to, which is the
allowance; a refusal states it in its message. Competing work is queued by a registered user with
kudos, whose priority puts it ahead of any anonymous request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from horde_lite.accounts.users import authenticate
from horde_lite.clock import ManualClock
from horde_lite.core.errors import HordeError
from horde_lite.db.models import AdmissionRecord, KudosHold, TextRequest
from horde_lite.inputs import TextRequestInput
from horde_lite.operators import policy_state
from horde_lite.policies.protocols import AllowanceInputs
from horde_lite.requests import admission
from horde_lite.settings import AllowanceSettings
from horde_lite_policies.allowance_estimated_wait import EstimatedWait
from horde_lite_policies.allowance_horde_queue import HordeQueue
from horde_lite_policies.allowance_jobs_per_thread import JobsPerThread
from tests.conftest import make_settings
from tests.support import prom
from tests.support.apps import app_for
from tests.support.horde import ANON, HordeClient, quote
from tests.support.horde import quote as price_of

MODEL = "Rocinante-X-12B-v1"  # read as 12B
BIG = {"max_length": 16384, "max_context_length": 16384}
DECISIONS = "horde_text_free_allowance_decisions_total"
EST_WAIT = "horde_text_free_allowance_estimated_wait_seconds"
QUEUE_WAIT = "horde_text_queue_wait_seconds"


# --- helpers -----------------------------------------------------------------------------------


@asynccontextmanager
async def custom_client(db_url: str, **tables: dict[str, Any]) -> AsyncIterator[HordeClient]:
    """The real app with settings of our own (configured thresholds, another curve policy)."""
    app = app_for(make_settings(db_url, **tables), ManualClock())
    async with AsyncTestClient(app=app, timeout=30) as http:
        yield HordeClient(http, app.state.horde)


async def online_worker(
    client: HordeClient,
    key: str,
    name: str,
    *,
    models: list[str] | None = None,
    max_length: int = 16384,
    max_context_length: int = 32768,
    **declarations: Any,
) -> None:
    """Check a worker in with an empty queue: it is online and has taken nothing."""
    response = await client.pop(
        key,
        name,
        models=[MODEL] if models is None else models,
        max_length=max_length,
        max_context_length=max_context_length,
        **declarations,
    )
    assert response.status_code == 200, response.text
    assert response.json()["id"] is None


async def queue_work(client: HordeClient, key: str, tokens: int, *, n: int = 1, model: str = MODEL) -> str:
    """Competing work: a request of `tokens` x `n` from a registered user with kudos (ahead in queue)."""
    response = await client.create(
        key, models=[model], params={"max_length": tokens, "max_context_length": 16384, "n": n}
    )
    assert response.status_code == 202, response.text
    return response.json()["id"]


async def seen_allowance(client: HordeClient, model: str = MODEL, **body: Any) -> int:
    """The allowance an anonymous 16,384-token request would get, through a downgrading dry run."""
    response = await client.create(
        ANON, models=[model], params=BIG, allow_downgrade=True, dry_run=True, **body
    )
    assert response.status_code == 200, response.text
    return response.json()["max_length"]


async def hold_of(client: HordeClient, request_id: str) -> KudosHold | None:
    async with client.horde.sessionmaker() as session:
        return await session.get(KudosHold, f"upfront:{request_id}")


async def holds(client: HordeClient) -> list[KudosHold]:
    async with client.horde.sessionmaker() as session:
        return list((await session.execute(select(KudosHold))).scalars())


async def request_rows(client: HordeClient) -> list[TextRequest]:
    async with client.horde.sessionmaker() as session:
        return list((await session.execute(select(TextRequest))).scalars())


async def outcomes(client: HordeClient) -> dict[str | None, str]:
    """Each admitted request's recorded outcome, by request id."""
    async with client.horde.sessionmaker() as session:
        rows = (await session.execute(select(AdmissionRecord.request_id, AdmissionRecord.outcome))).all()
    return {request_id: outcome for request_id, outcome in rows if request_id is not None}


def chat_body(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "models": [MODEL],
        "chat": {
            "messages": [{"role": "user", "content": "Hello there."}],
            "max_tokens": max_tokens,
            **extra,
        },
    }


CHAT_WORKER = {"max_completion_tokens": 8192, "max_context_tokens": 16384}


# --- the curve through HTTP ----------------------------------------------------------------------


# One unmeasured worker (10 tokens/s): competing tokens / 10 = the estimated wait in seconds.
@pytest.mark.parametrize(
    ("competing_tokens", "allowance"),
    [
        (0, 4096),  # idle
        (300, 4096),  # 30 s
        (600, 4096),  # 60 s: the ceiling's threshold
        (900, 3648),  # 90 s: between
        (1000, 3498),  # 100 s: 3498.67 rounded down
        (1200, 3200),  # 120 s
        (1800, 2304),  # 180 s
        (2400, 1408),  # 240 s
        (3000, 512),  # 300 s: the floor's threshold
        (6000, 512),  # 600 s: beyond
    ],
)
async def test_curve_at_between_and_beyond_the_thresholds(
    client: HordeClient, competing_tokens: int, allowance: int
) -> None:
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    await online_worker(client, owner, "only")
    if competing_tokens:
        await queue_work(client, rich, competing_tokens)
    assert await seen_allowance(client) == allowance


async def test_measured_speed_and_several_jobs_make_the_wait(client: HordeClient) -> None:
    """A worker measured at 20 tokens/s clears 3 x 1,200 queued tokens in 180 s: 2304 tokens."""
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    await online_worker(client, owner, "fast")
    await client.set_worker_speed("fast", 20.0)
    await queue_work(client, rich, 1200, n=3)
    assert await seen_allowance(client) == 2304


async def test_idle_model_serves_4096_free_tokens_to_the_anonymous_key(client: HordeClient) -> None:
    owner = await client.user("owner")
    await online_worker(client, owner, "idle")
    created = await client.create(
        ANON, models=[MODEL], params={"max_length": 4096, "max_context_length": 8192}
    )
    assert created.status_code == 202, created.text
    request_id = created.json()["id"]
    assert await holds(client) == []
    over = await client.create(ANON, models=[MODEL], params={"max_length": 4097, "max_context_length": 8192})
    assert over.status_code == 403
    assert over.json()["rc"] == "KudosUpfront"
    assert "4096 tokens" in over.json()["message"]
    job = (await client.pop(owner, "idle", models=[MODEL], max_length=16384, max_context_length=32768)).json()
    assert job["payload"]["max_length"] == 4096
    assert (await client.status(request_id)).json()["processing"] == 1


async def test_180_seconds_of_work_on_the_only_worker_allows_2304_and_the_refusal_says_so(
    client: HordeClient,
) -> None:
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    await online_worker(client, owner, "only")  # unmeasured: 10 tokens/s
    await queue_work(client, rich, 600, n=3)  # 1,800 tokens ahead: 180 s
    refused = await client.create(
        ANON, models=[MODEL], params={"max_length": 2400, "max_context_length": 4096}
    )
    assert refused.status_code == 403, refused.text
    body = refused.json()
    assert body["rc"] == "KudosUpfront"
    assert "the free output allowance for this request is 2304 tokens and it asks 2400" in body["message"]
    fits = await client.create(ANON, models=[MODEL], params={"max_length": 2304, "max_context_length": 4096})
    assert fits.status_code == 202, fits.text


async def test_load_on_another_model_does_not_lower_the_allowance(client: HordeClient) -> None:
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    await online_worker(client, owner, "a-worker", models=["Model-A-12B"])
    await online_worker(client, owner, "b-worker", models=["Model-B-12B"])
    await queue_work(client, rich, 6000, model="Model-A-12B")
    assert await seen_allowance(client, "Model-A-12B") == 512
    assert await seen_allowance(client, "Model-B-12B") == 4096


async def test_floor_without_an_eligible_worker(client: HordeClient) -> None:
    owner = await client.user("owner")
    await online_worker(client, owner, "elsewhere", models=["Other-12B"])
    # Nobody serves the model: the floor, and a request within it is free and queued.
    assert await seen_allowance(client, "Nobody-12B") == 512
    # A worker that serves the model but declares less than 16384 is not eligible for it either.
    await online_worker(client, owner, "short", models=["Short-12B"], max_length=1024)
    assert await seen_allowance(client, "Short-12B") == 512
    queued = await client.create(ANON, models=["Nobody-12B"], params={"max_length": 512})
    assert queued.status_code == 202, queued.text
    status = (await client.status(queued.json()["id"])).json()
    assert status["is_possible"] is False
    assert status["waiting"] == 1


async def test_configured_ceiling_floor_and_thresholds(db_url: str) -> None:
    allowance = {"ceiling": 2000, "floor": 200, "wait_full_seconds": 30, "wait_floor_seconds": 130}
    async with custom_client(db_url, allowance=allowance) as client:
        owner = await client.user("owner")
        rich = await client.user("rich", kudos=1_000_000)
        await online_worker(client, owner, "only")
        assert await seen_allowance(client) == 2000
        assert await seen_allowance(client, "Nobody-12B") == 200
        await queue_work(client, rich, 300)  # 30 s
        assert await seen_allowance(client) == 2000
        client.clock.advance(1)
        await queue_work(client, rich, 500)  # 80 s: half-way
        assert await seen_allowance(client) == 1100
        client.clock.advance(1)
        await queue_work(client, rich, 500)  # 130 s
        assert await seen_allowance(client) == 200
        refused = await client.create(
            ANON, models=[MODEL], params={"max_length": 201, "max_context_length": 2048}
        )
        assert refused.status_code == 403
        assert "allowance for this request is 200 tokens" in refused.json()["message"]


async def test_the_selected_curve_policy_sizes_the_allowance(db_url: str) -> None:
    # horde_queue, the previous rule: never above 512, however idle the fleet.
    async with custom_client(db_url, policies={"allowance_curve": "horde_queue"}) as client:
        owner = await client.user("owner")
        await online_worker(client, owner, "only")
        assert await seen_allowance(client) == 512
    # jobs_per_thread: 2 competing jobs on 1 thread = load 2, 0.6 of the way from 0.5 to 3.0.
    # The same database, whose policy in force is now horde_queue (the database's policy wins at
    # start-up): switch it as an operator would.
    async with custom_client(db_url, policies={"allowance_curve": "jobs_per_thread"}) as client:
        await policy_state.switch(client.horde, "allowance_curve", "jobs_per_thread", {}, "test")
        await policy_state.apply_changes(client.horde)
        owner = await client.user("owner2")
        rich = await client.user("rich", kudos=1_000_000)
        # (the same database: the first block's worker still serves MODEL, so use another model)
        await online_worker(client, owner, "only2", models=["Other-12B"])
        assert await seen_allowance(client, "Other-12B") == 4096
        await queue_work(client, rich, 100, n=2, model="Other-12B")
        assert await seen_allowance(client, "Other-12B") == 1945


# --- the upfront decision ------------------------------------------------------------------------


async def test_free_request_holds_nothing(client: HordeClient) -> None:
    owner = await client.user("owner")
    poor = await client.user("poor")
    await online_worker(client, owner, "only")
    for key in (ANON, poor):
        created = await client.create(
            key, models=[MODEL], params={"max_length": 3000, "max_context_length": 4096}
        )
        assert created.status_code == 202, created.text
        assert created.json()["kudos"] > 0  # the estimate is still quoted
    assert await holds(client) == []
    rows = await request_rows(client)
    assert len(rows) == 2
    recorded = await outcomes(client)
    assert {recorded[r.id] for r in rows} == {"free"}


async def test_funded_request_holds_its_estimate_keyed_by_request(client: HordeClient) -> None:
    owner = await client.user("owner")
    payer = await client.user("payer", kudos=10_000)
    await online_worker(client, owner, "only")
    created = await client.create(
        payer, models=[MODEL], params={"max_length": 5000, "max_context_length": 8192}
    )
    assert created.status_code == 202, created.text
    request_id = created.json()["id"]
    hold = await hold_of(client, request_id)
    assert hold is not None
    assert hold.key == f"upfront:{request_id}"
    assert hold.active is True
    assert hold.amount == quote(5000, 12, 5003)  # "Hello there." is 3 tokens
    assert created.json()["kudos"] == pytest.approx(hold.amount)
    assert len(await holds(client)) == 1


async def test_over_the_allowance_without_kudos_is_refused_with_the_allowance(client: HordeClient) -> None:
    owner = await client.user("owner")
    poor = await client.user("poor", kudos=100)  # spendable 75: far from the request's price
    await online_worker(client, owner, "only")
    for key in (ANON, poor):
        refused = await client.create(
            key, models=[MODEL], params={"max_length": 5000, "max_context_length": 8192}
        )
        assert refused.status_code == 403, refused.text
        assert refused.json()["rc"] == "KudosUpfront"
        message = refused.json()["message"]
        assert "the free output allowance for this request is 4096 tokens and it asks 5000" in message
        assert f"{quote(5000, 12, 5003):.2f} kudos" in message
    assert await request_rows(client) == []
    assert await holds(client) == []


async def test_downgrade_on_the_native_legacy_route(client: HordeClient) -> None:
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    await online_worker(client, owner, "only")
    await queue_work(client, rich, 600, n=3)  # 180 s: allowance 2304
    created = await client.create(
        ANON, models=[MODEL], params={"max_length": 4000, "max_context_length": 8192}, allow_downgrade=True
    )
    assert created.status_code == 202, created.text
    body = created.json()
    assert body["warnings"][0]["code"] == "Downgraded"
    assert "2304 tokens" in body["message"]
    assert body["context_adjustments"] == [
        {"field": "max_length", "requested": 4000, "applied": 2304, "reason": "free output allowance"}
    ]
    assert await hold_of(client, body["id"]) is None
    rows = {r.id: r for r in await request_rows(client)}
    assert rows[body["id"]].max_length == 2304
    assert rows[body["id"]].requested_max_length == 4000
    assert (await outcomes(client))[body["id"]] == "downgraded"


async def test_downgrade_allows_slow_workers(client: HordeClient) -> None:
    """The only worker is slow (1 token/s): a `slow_workers: false` request has no eligible worker,
    gets the floor, is downgraded to it with slow workers allowed, and the slow worker takes it."""
    owner = await client.user("owner")
    await online_worker(client, owner, "slow")
    await client.set_worker_speed("slow", 1.0)
    created = await client.create(
        ANON,
        models=[MODEL],
        params={"max_length": 1024, "max_context_length": 2048},
        slow_workers=False,
        allow_downgrade=True,
    )
    assert created.status_code == 202, created.text
    job = (await client.pop(owner, "slow", models=[MODEL], max_length=16384, max_context_length=32768)).json()
    assert job["id"] is not None
    assert job["payload"]["max_length"] == 512


async def test_a_client_without_allow_downgrade_is_not_lowered(client: HordeClient) -> None:
    owner = await client.user("owner")
    await online_worker(client, owner, "only")
    refused = await client.create(
        ANON, models=[MODEL], params={"max_length": 5000, "max_context_length": 8192}
    )
    assert refused.status_code == 403
    assert refused.json()["rc"] == "KudosUpfront"


async def test_downgrade_is_for_the_native_route_only(client: HordeClient) -> None:
    """The same request decided as if it came through another front (native_route=False) is refused."""
    owner = await client.user("owner")
    await online_worker(client, owner, "only")
    horde = client.horde
    body = TextRequestInput(
        prompt="Hello.", models=[MODEL], params={"max_length": 5000, "max_context_length": 8192},
        allow_downgrade=True,
    )  # fmt: skip
    async with horde.sessionmaker() as session, session.begin():
        requester = await authenticate(session, ANON, horde.clock.now())
        spec = admission.legacy_spec(requester, body, horde, "test")
        with pytest.raises(HordeError) as refused:
            await admission.admit(session, horde, replace(spec, native_route=False))
        assert refused.value.rc == "KudosUpfront"
        decided = await admission.admit(session, horde, spec)
        assert decided.outcome == "downgraded"
        assert decided.max_length == 4096
        await session.rollback()


async def test_slow_workers_false_always_holds_kudos(client: HordeClient) -> None:
    owner = await client.user("owner")
    payer = await client.user("payer", kudos=10_000)
    poor = await client.user("poor")
    await online_worker(client, owner, "only")
    created = await client.create(payer, models=[MODEL], params={"max_length": 100}, slow_workers=False)
    assert created.status_code == 202, created.text
    hold = await hold_of(client, created.json()["id"])
    assert hold is not None
    assert hold.amount == quote(100, 12, 103)
    for key in (ANON, poor):
        refused = await client.create(key, models=[MODEL], params={"max_length": 100}, slow_workers=False)
        assert refused.status_code == 403, refused.text
        assert refused.json()["rc"] == "KudosUpfront"
        assert "disallow slow workers always need kudos upfront" in refused.json()["message"]
    # allow_downgrade does not help: 100 tokens are within the allowance, the hold is for the option.
    again = await client.create(
        ANON, models=[MODEL], params={"max_length": 100}, slow_workers=False, allow_downgrade=True
    )
    assert again.status_code == 403


async def test_chat_is_never_downgraded(client: HordeClient) -> None:
    owner = await client.user("owner")
    await online_worker(client, owner, "chatty", chat=CHAT_WORKER)
    refused = await client.create(ANON, allow_downgrade=True, **chat_body(6000))
    assert refused.status_code == 403, refused.text
    assert refused.json()["rc"] == "KudosUpfront"
    assert "allowance for this request is 4096 tokens and it asks 6000" in refused.json()["message"]
    fits = await client.create(ANON, allow_downgrade=True, **chat_body(4096))
    assert fits.status_code == 202, fits.text
    assert fits.json()["context_adjustments"] == []
    assert "warnings" not in fits.json()


async def test_chat_max_tokens_is_only_lowered_to_the_largest_declaration(client: HordeClient) -> None:
    owner = await client.user("owner")
    await online_worker(
        client, owner, "chatty", chat={"max_completion_tokens": 2048, "max_context_tokens": 8192}
    )
    created = await client.create(ANON, **chat_body(3000))
    assert created.status_code == 202, created.text
    assert created.json()["context_adjustments"][0]["applied"] == 2048
    job = (
        await client.pop(owner, "chatty", models=[MODEL], max_length=16384, max_context_length=32768,
                         chat={"max_completion_tokens": 2048, "max_context_tokens": 8192})
    ).json()  # fmt: skip
    assert job["payload"]["max_tokens"] == 2048


async def test_funded_request_with_no_eligible_worker_is_admitted_and_queued(client: HordeClient) -> None:
    owner = await client.user("owner")
    payer = await client.user("payer", kudos=10_000)
    await online_worker(client, owner, "short", max_length=1024)
    created = await client.create(
        payer, models=[MODEL], params={"max_length": 2048, "max_context_length": 4096}
    )
    assert created.status_code == 202, created.text
    request_id = created.json()["id"]
    assert await hold_of(client, request_id) is not None
    status = (await client.status(request_id)).json()
    assert status["waiting"] == 1
    assert status["is_possible"] is False
    # A worker that declares enough arrives later and takes it.
    await client.pop(owner, "short", models=[MODEL], max_length=2048, max_context_length=4096)
    assert (await client.status(request_id)).json()["processing"] == 1


# --- NoEligibleWorker and the declaration gap ------------------------------------------------------


async def test_no_eligible_worker_names_the_max_length_gap(client: HordeClient) -> None:
    owner = await client.user("owner")
    await online_worker(client, owner, "short", max_length=1024)
    for dry_run in (False, True):
        refused = await client.create(
            ANON, models=[MODEL], params={"max_length": 2048, "max_context_length": 4096}, dry_run=dry_run
        )
        assert refused.status_code == 503, refused.text
        assert refused.json()["rc"] == "NoEligibleWorker"
        assert (
            f"online workers for {MODEL} declare at most 1024 tokens; this request asks 2048"
            in refused.json()["message"]
        )
        assert refused.headers["Retry-After"]
    assert await request_rows(client) == []


async def test_no_eligible_worker_names_a_missing_chat_feature(client: HordeClient) -> None:
    owner = await client.user("owner")
    await online_worker(client, owner, "plain-chat", chat=CHAT_WORKER)
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    refused = await client.create(ANON, **chat_body(1024, tools=tools))
    assert refused.status_code == 503, refused.text
    assert refused.json()["rc"] == "NoEligibleWorker"
    assert f"no online worker for {MODEL} declares tools" in refused.json()["message"]


async def test_no_eligible_worker_for_a_model_nobody_serves(client: HordeClient) -> None:
    owner = await client.user("owner")
    await online_worker(client, owner, "elsewhere", models=["Other-12B"])
    refused = await client.create(ANON, models=["Nobody-12B"], params={"max_length": 600})
    assert refused.status_code == 503, refused.text
    assert "no online worker serves Nobody-12B" in refused.json()["message"]


async def test_within_the_floor_a_request_nobody_can_serve_is_queued_free(client: HordeClient) -> None:
    owner = await client.user("owner")
    await online_worker(client, owner, "short", max_length=256)
    created = await client.create(ANON, models=[MODEL], params={"max_length": 512})
    assert created.status_code == 202, created.text
    assert (await client.status(created.json()["id"])).json()["is_possible"] is False


# --- dry runs ------------------------------------------------------------------------------------


async def test_dry_run_is_refused_the_same_way_and_keeps_nothing(client: HordeClient) -> None:
    owner = await client.user("owner")
    await online_worker(client, owner, "only")
    params = {"max_length": 5000, "max_context_length": 8192}
    real = await client.create(ANON, models=[MODEL], params=params)
    dry = await client.create(ANON, models=[MODEL], params=params, dry_run=True)
    assert dry.status_code == real.status_code == 403
    assert dry.json() == real.json()
    assert await request_rows(client) == []
    assert await holds(client) == []


async def test_a_funded_quote_is_never_served_to_an_anonymous_dry_run(client: HordeClient) -> None:
    """Quotes are computed afresh every time: the funded requester's quote does not leak."""
    owner = await client.user("owner")
    payer = await client.user("payer", kudos=10_000)
    await online_worker(client, owner, "only")
    params = {"max_length": 5000, "max_context_length": 8192}
    quote = await client.create(payer, models=[MODEL], params=params, dry_run=True)
    assert quote.status_code == 200, quote.text
    assert quote.json() == {"kudos": price_of(5000, 12, 5003), "max_length": 5000}
    anonymous = await client.create(ANON, models=[MODEL], params=params, dry_run=True)
    assert anonymous.status_code == 403
    assert anonymous.json()["rc"] == "KudosUpfront"
    await online_worker(client, owner, "chatty", chat=CHAT_WORKER)
    chat_quote = await client.create(payer, dry_run=True, **chat_body(5000))
    assert chat_quote.status_code == 200, chat_quote.text
    chat = await client.create(ANON, dry_run=True, **chat_body(5000))
    assert chat.status_code == 403
    assert chat.json()["rc"] == "KudosUpfront"
    assert await request_rows(client) == []
    assert await holds(client) == []


async def test_dry_run_reflects_the_queue_at_that_moment(client: HordeClient) -> None:
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    await online_worker(client, owner, "only")
    assert await seen_allowance(client) == 4096
    await queue_work(client, rich, 1800)
    assert await seen_allowance(client) == 2304


# --- metrics -------------------------------------------------------------------------------------


def decisions(text: str, **labels: Any) -> float:
    return prom.value(text, DECISIONS, **labels)


async def test_each_outcome_is_counted_once_with_its_attributes(client: HordeClient) -> None:
    owner = await client.user("owner")
    payer = await client.user("payer", kudos=100_000)
    # One idle worker per decision, so no decision's request competes with another's: all at 4096.
    for model in ("Free-12B", "Funded-12B", "Down-12B", "Refused-12B"):
        await online_worker(client, owner, f"w-{model}", models=[model])
    await online_worker(client, owner, "chatty", models=["Chat-12B"], chat=CHAT_WORKER)
    params = {"max_context_length": 8192}

    async def create(key: str, model: str, max_length: int, **body: Any) -> int:
        response = await client.create(
            key, models=[model], params={**params, "max_length": max_length}, **body
        )
        return response.status_code

    assert await create(ANON, "Free-12B", 600) == 202
    assert await create(payer, "Funded-12B", 5000) == 202
    assert await create(ANON, "Down-12B", 5000, allow_downgrade=True) == 202
    assert await create(ANON, "Refused-12B", 5000) == 403
    chat = {
        "models": ["Chat-12B"],
        "chat": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1500},
    }
    assert (await client.create(ANON, **chat)).status_code == 202
    # Dry runs are not counted, whatever their answer.
    assert await create(ANON, "Refused-12B", 300, dry_run=True) == 200
    assert await create(ANON, "Refused-12B", 5000, dry_run=True) == 403
    assert (await client.create(ANON, dry_run=True, **chat)).status_code == 200
    text = await client.metrics()
    assert decisions(text) == 5
    for requester, outcome, requested, chat_flag in [
        ("anonymous", "free", "513-1024", False),
        ("registered", "funded", ">4096", False),
        ("anonymous", "downgraded", ">4096", False),
        ("anonymous", "refused", ">4096", False),
        ("anonymous", "free", "1025-2048", True),
    ]:
        assert (
            decisions(
                text,
                horde_requester=requester,
                horde_outcome=outcome,
                horde_requested_bucket=requested,
                horde_allowance_bucket="2049-4096",
                horde_chat=chat_flag,
            )
            == 1
        ), (requester, outcome)
    # Every counted decision had an eligible worker, so each recorded the wait it used (0 s here).
    assert prom.value(text, EST_WAIT + "_count") == 5
    assert prom.value(text, EST_WAIT + "_sum") == 0


async def test_shared_key_and_no_eligible_worker_are_counted(client: HordeClient) -> None:
    owner = await client.user("owner")
    await online_worker(client, owner, "short", max_length=1024)
    response = await client.http.post(
        "/api/v2/sharedkeys", json={"kudos": 5000, "name": "lend"}, headers={"apikey": owner}
    )
    assert response.status_code in (200, 201), response.text
    shared = response.json()["id"]
    assert (await client.create(shared, models=[MODEL], params={"max_length": 300})).status_code == 202
    assert (
        await client.create(ANON, models=[MODEL], params={"max_length": 2048, "max_context_length": 4096})
    ).status_code == 503
    text = await client.metrics()
    assert decisions(text, horde_requester="shared_key", horde_outcome="free") == 1
    # The NoEligibleWorker refusal is the allowance's decision too: refused at the floor, once.
    assert (
        decisions(text, horde_requester="anonymous", horde_outcome="refused", horde_allowance_bucket="<=512")
        == 1
    )
    assert decisions(text) == 2
    # No eligible worker: no wait to record.
    assert prom.value(text, EST_WAIT + "_count") == 1


async def test_the_estimated_wait_used_is_recorded(client: HordeClient) -> None:
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    await online_worker(client, owner, "only")
    await queue_work(client, rich, 600, n=3)  # its own wait: 0 s
    assert (await client.create(ANON, models=[MODEL], params={"max_length": 100})).status_code == 202
    text = await client.metrics()
    assert prom.value(text, EST_WAIT + "_count", horde_requester="anonymous", horde_chat=False) == 1
    assert prom.value(text, EST_WAIT + "_sum", horde_requester="anonymous") == pytest.approx(180.0)
    assert prom.value(text, EST_WAIT + "_bucket", horde_requester="anonymous", le="150.0") == 0
    assert prom.value(text, EST_WAIT + "_bucket", horde_requester="anonymous", le="180.0") == 1
    assert prom.value(text, EST_WAIT + "_sum", horde_requester="registered") == 0


async def test_queue_wait_is_recorded_at_each_assignment_with_the_requester_kind(client: HordeClient) -> None:
    owner = await client.user("owner")
    payer = await client.user("payer", kudos=10_000)
    await online_worker(client, owner, "only")
    anonymous = await client.create(ANON, models=[MODEL], params={"max_length": 100, "n": 2})
    assert anonymous.status_code == 202
    assert prom.value(await client.metrics(), QUEUE_WAIT + "_count") == 0  # nothing at creation
    client.clock.advance(42)
    job = (
        await client.pop(owner, "only", models=[MODEL], max_length=16384, max_context_length=32768, amount=2)
    ).json()
    assert len(job["ids"]) == 2
    registered = await client.create(payer, models=[MODEL], params={"max_length": 100})
    assert registered.status_code == 202
    client.clock.advance(7)
    await client.pop(owner, "only", models=[MODEL], max_length=16384, max_context_length=32768)
    text = await client.metrics()
    assert prom.value(text, QUEUE_WAIT + "_count", horde_requester="anonymous", horde_chat=False) == 2
    assert prom.value(text, QUEUE_WAIT + "_sum", horde_requester="anonymous") == pytest.approx(84.0)
    assert prom.value(text, QUEUE_WAIT + "_count", horde_requester="registered") == 1
    assert prom.value(text, QUEUE_WAIT + "_sum", horde_requester="registered") == pytest.approx(7.0)


# --- the curve policies, pure ---------------------------------------------------------------------

DEFAULTS = AllowanceSettings()


def inputs(
    wait: float | None = None,
    *,
    jobs: int = 0,
    threads: int = 1,
    online_threads: int = 1,
    queued: int = 0,
    settings: AllowanceSettings = DEFAULTS,
) -> AllowanceInputs:
    return AllowanceInputs(
        estimated_wait_seconds=wait,
        competing_jobs=jobs,
        eligible_threads=threads,
        online_text_threads=online_threads,
        queued_text_requests=queued,
        settings=settings,
    )


@pytest.mark.parametrize(
    ("wait", "allowance"),
    [(0, 4096), (59.9, 4096), (60, 4096), (90, 3648), (120, 3200), (180, 2304), (240, 1408),
     (299.9, 513), (300, 512), (3600, 512), (None, 512)],
)  # fmt: skip
def test_estimated_wait_worked_values(wait: float | None, allowance: int) -> None:
    assert EstimatedWait().allowance(inputs(wait)) == allowance


thresholds = st.builds(
    lambda floor, extra, full, span: AllowanceSettings(
        floor=floor, ceiling=floor + extra, wait_full_seconds=full, wait_floor_seconds=full + span
    ),
    st.integers(0, 4096),
    st.integers(0, 16384),
    st.floats(0, 600),
    st.floats(1, 3600),
)
waits = st.floats(0, 10_000, allow_nan=False)


@given(settings=thresholds, a=waits, b=waits)
def test_estimated_wait_is_monotone_and_bounded(settings: AllowanceSettings, a: float, b: float) -> None:
    curve = EstimatedWait()
    low, high = sorted((a, b))
    at_low = curve.allowance(inputs(low, settings=settings))
    at_high = curve.allowance(inputs(high, settings=settings))
    assert at_low >= at_high
    assert settings.floor <= at_high <= at_low <= settings.ceiling
    assert curve.allowance(inputs(None, settings=settings)) == settings.floor
    if low <= settings.wait_full_seconds:
        assert at_low == settings.ceiling
    if high >= settings.wait_floor_seconds:
        assert at_high == settings.floor


@given(
    threads=st.integers(1, 64),
    a=st.integers(0, 500),
    b=st.integers(0, 500),
    full=st.floats(0, 5),
    span=st.floats(0.1, 10),
)
def test_jobs_per_thread_is_monotone_and_bounded(
    threads: int, a: int, b: int, full: float, span: float
) -> None:
    curve = JobsPerThread(full_jobs_per_thread=full, floor_jobs_per_thread=full + span)
    low, high = sorted((a, b))
    at_low = curve.allowance(inputs(0.0, jobs=low, threads=threads))
    at_high = curve.allowance(inputs(0.0, jobs=high, threads=threads))
    assert DEFAULTS.floor <= at_high <= at_low <= DEFAULTS.ceiling
    assert curve.allowance(inputs(None, jobs=0, threads=0)) == DEFAULTS.floor
    if low / threads <= full:
        assert at_low == DEFAULTS.ceiling


def test_jobs_per_thread_worked_values() -> None:
    curve = JobsPerThread()  # ceiling at <= 0.5 jobs per thread, floor at >= 3
    assert curve.allowance(inputs(0.0, jobs=1, threads=2)) == 4096
    assert curve.allowance(inputs(0.0, jobs=2, threads=1)) == 1945  # 0.6 of the way down
    assert curve.allowance(inputs(0.0, jobs=6, threads=2)) == 512
    # Two jobs are two jobs however fast the workers are: the option's stated weakness.
    assert curve.allowance(inputs(1.0, jobs=2, threads=1)) == curve.allowance(
        inputs(500.0, jobs=2, threads=1)
    )
    with pytest.raises(ValueError, match="floor_jobs_per_thread"):
        JobsPerThread(full_jobs_per_thread=3, floor_jobs_per_thread=3)


@given(threads=st.integers(0, 10_000), a=st.integers(0, 10_000), b=st.integers(0, 10_000))
def test_horde_queue_is_clamped_and_falls_with_the_queue(threads: int, a: int, b: int) -> None:
    curve = HordeQueue()
    low, high = sorted((a, b))
    at_low = curve.allowance(inputs(online_threads=threads, queued=low))
    at_high = curve.allowance(inputs(online_threads=threads, queued=high))
    assert 256 <= at_high <= at_low <= 512
    assert curve.allowance(inputs(online_threads=threads + 1, queued=low)) >= at_low


def test_horde_queue_worked_values() -> None:
    curve = HordeQueue()
    assert curve.allowance(inputs(online_threads=0, queued=0)) == 512  # never above 512
    assert curve.allowance(inputs(online_threads=10, queued=100)) == 472  # 512 + 50 - 90
    assert curve.allowance(inputs(online_threads=0, queued=1000)) == 256
    # It ignores the request's own workers: an idle model's wait does not matter.
    assert curve.allowance(inputs(0.0, online_threads=0, queued=200)) == 332
