"""Bounded input where it enters: a job's submitted output (jobs/output_bounds.py), a request's
worker lists (requests/worker_lists.py) and the waiting caps under concurrent creations
(admission._too_many). Over HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import text

from horde_lite.jobs import output_bounds as bounds
from horde_lite.settings import Settings
from tests.conftest import make_settings
from tests.integration.test_horde_jobs import _post_blocking
from tests.support.horde import ANON, HordeClient

MOST = 4  # request.max_worker_list in these tests
CAP = 3  # request.max_waiting_anonymous and max_waiting_per_user in these tests


@pytest.fixture
def settings(db_url: str) -> Settings:
    return make_settings(
        db_url,
        request={"max_worker_list": MOST, "max_waiting_anonymous": CAP, "max_waiting_per_user": CAP},
        ratelimit={"create_per_minute": 0},
    )


async def _scalar(client: HordeClient, sql: str, **params: Any) -> Any:
    async with client.horde.sessionmaker() as session:
        return (await session.execute(text(sql), params)).scalar_one()


async def _workers(client: HordeClient, key: str, *names: str) -> list[str]:
    """Workers that exist (popped once, for a model nobody asks), by id."""
    ids = []
    for name in names:
        assert (await client.pop(key, name, models=["nobody-asks-7B"])).status_code == 200
        ids.append(await _scalar(client, "SELECT id FROM workers WHERE name = :n", n=name))
    return ids


# --- the submitted output -----------------------------------------------------------------------


async def test_a_submit_past_the_jobs_bound_stores_nothing_and_the_job_stays(client: HordeClient) -> None:
    key = await client.user("owner")
    await client.create(ANON, params={"max_length": 16})
    job = (await client.pop(key, "w1")).json()
    bound = bounds.output_bound(16, client.horde.settings)
    assert bound == 16 * 16 + 1024
    for size in (4_000_000, bound + 1):
        over = await client.submit(key, job["id"], "x" * size)
        assert (over.status_code, over.json()["rc"]) == (400, "GenerationTooLong"), over.text[:300]
        assert str(bound) in over.json()["message"]
    assert await _scalar(client, "SELECT count(*) FROM generations WHERE state = 'processing'") == 1
    assert await _scalar(client, "SELECT count(*) FROM kudos_events WHERE kind = 'reward'") == 0
    at = await client.submit(key, job["id"], "x" * bound)
    assert at.status_code == 200, at.text
    assert at.json()["reward"] > 0
    assert await _scalar(client, "SELECT length(text) FROM generations") == bound


async def test_a_chat_submit_counts_its_message_once_and_its_tool_calls(client: HordeClient) -> None:
    key = await client.user("owner")
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}
    assert (await client.create(ANON, chat=chat)).status_code == 202
    limits = {"max_completion_tokens": 64, "max_context_tokens": 4096}
    job = (await client.pop(key, "w1", chat=limits)).json()
    assert job["kind"] == "chat"
    bound = bounds.output_bound(16, client.horde.settings)

    async def submit(content: str, **message: Any) -> Any:
        body = {"message": {"role": "assistant", "content": content, **message}, "finish_reason": "stop"}
        return await client.submit(key, job["id"], content, chat=body)

    call = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    calls = len(bounds._encode({"tool_calls": call}))
    over = await submit("x" * (bound - calls + 1), tool_calls=call)
    assert (over.status_code, over.json()["rc"]) == (400, "GenerationTooLong"), over.text
    assert (await submit("x" * (bound - calls), tool_calls=call)).status_code == 200


# --- worker lists -------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["workers", "worker_blacklist"])
async def test_a_worker_list_at_most_max_worker_list_long(client: HordeClient, field: str) -> None:
    key = await client.user("owner")
    ids = await _workers(client, key, *(f"w{i}" for i in range(MOST + 1)))
    at = await client.create(ANON, **{field: ids[:MOST]})
    assert at.status_code == 202, at.text
    over = await client.create(ANON, **{field: ids})
    assert (over.status_code, over.json()["rc"]) == (400, "BadRequest")
    assert f"at most {MOST}" in over.json()["message"]
    assert field in over.json()["errors"]
    # The tester's 400,000 names: refused before any statement, nothing stored.
    hostile = await client.create(ANON, **{field: ["x"] * 400_000})
    assert (hostile.status_code, hostile.json()["rc"]) == (400, "BadRequest")
    assert await _scalar(client, "SELECT count(*) FROM text_requests") == 1
    refusals = MOST if field == "worker_blacklist" else 0
    assert await _scalar(client, "SELECT count(*) FROM queue_refusals") == refusals


@pytest.mark.parametrize("form", ["list", "upstream"])
async def test_a_deny_list_keeps_only_workers_that_exist(client: HordeClient, form: str) -> None:
    key = await client.user("owner")
    real, _other, gone = await _workers(client, key, "real", "other", "gone")
    assert (await client.http.delete(f"/api/v2/workers/{gone}", headers={"apikey": key})).status_code == 200
    names = [str(uuid.uuid4()), "nobody", real.upper(), gone]
    body = {"worker_blacklist": names} if form == "list" else {"workers": names, "worker_blacklist": True}
    created = await client.create(ANON, **body)
    assert created.status_code == 202, created.text
    request_id = created.json()["id"]
    assert await _scalar(client, "SELECT worker_id FROM queue_refusals") == real  # canonical, once
    assert await _scalar(client, "SELECT worker_deny FROM text_requests") in ([real], f'["{real}"]')
    # Only nonexistent names: no refusal, and the request is anyone's (not targeted at them).
    nobody = [str(uuid.uuid4()) for _ in range(MOST)]
    body = {"worker_blacklist": nobody} if form == "list" else {"workers": nobody, "worker_blacklist": True}
    spared = (await client.create(ANON, **body)).json()["id"]
    assert await _scalar(client, "SELECT count(*) FROM queue_refusals") == 1
    assert await _scalar(client, "SELECT count(*) FROM queue_refusals WHERE request_id = :r", r=spared) == 0
    assert await _scalar(client, "SELECT targeted FROM text_requests WHERE id = :r", r=spared) in (False, 0)
    # The worker denied does not get the request; the other one does.
    assert (await client.pop(key, "real")).json()["id"] is not None  # the second request
    assert (await client.pop(key, "real")).json()["id"] is None
    job = (await client.pop(key, "other")).json()
    assert job["id"] is not None
    taken = await _scalar(client, "SELECT request_id FROM generations WHERE id = :g", g=job["id"])
    assert taken == request_id


async def test_an_allow_list_naming_an_unknown_worker_is_refused_as_upstream(client: HordeClient) -> None:
    key = await client.user("owner")
    [real] = await _workers(client, key, "real")
    for names in ([str(uuid.uuid4())], [real, "nobody"], [real, str(uuid.uuid4()).upper()]):
        refused = await client.create(ANON, workers=names)
        assert (refused.status_code, refused.json()["rc"]) == (404, "WorkerNotFound"), refused.text
        dry = await client.create(ANON, workers=names, dry_run=True)
        assert dry.json()["rc"] == "WorkerNotFound"
    assert await _scalar(client, "SELECT count(*) FROM text_requests") == 0
    kept = await client.create(ANON, workers=[real.upper(), real])
    assert kept.status_code == 202, kept.text
    assert await _scalar(client, "SELECT worker_allow FROM text_requests") in ([real], f'["{real}"]')
    assert (await client.pop(key, "real")).json()["id"] is not None


# --- waiting caps under concurrent creations --------------------------------------------------------


@pytest.mark.parametrize("who", ["anonymous", "registered"])
async def test_concurrent_creations_never_overshoot_the_waiting_cap(client: HordeClient, who: str) -> None:
    key = ANON if who == "anonymous" else await client.user("alice")
    calls = 24
    loop = asyncio.get_running_loop()
    for _ in range(2):  # at the cap from empty, then again with one slot left
        with ThreadPoolExecutor(max_workers=calls) as pool:
            answers = await asyncio.gather(
                *(
                    loop.run_in_executor(
                        pool, _post_blocking, client, "/api/v2/generate/text/async", key, {"prompt": "p"}
                    )
                    for _ in range(calls)
                )
            )
        statuses = sorted(a.status_code for a in answers)
        assert set(statuses) <= {202, 429}, [a.text for a in answers if a.status_code not in (202, 429)]
        assert all(a.json()["rc"] == "TooManyPrompts" for a in answers if a.status_code == 429)
        waiting = await _scalar(client, "SELECT count(*) FROM text_requests WHERE state = 'waiting'")
        assert waiting == CAP, statuses
        request_id = await _scalar(client, "SELECT id FROM text_requests ORDER BY created_at LIMIT 1")
        assert (await client.cancel(request_id)).status_code == 200
