"""Prompt filters at admission (docs/reference/moderation.md), on SQLite and PostgreSQL: a blocking
filter refuses on both faces (the legacy prompt, the native chat payload's messages and parts,
/v1/chat/completions, /v1/completions) in the words of its description and never its pattern, and
the refused request stores nothing; a replacing filter changes what the worker pops; a match cut off
by its time bound, or one request's matching past its bound, refuses (fail closed) and is logged;
replacements cannot bloat a prompt; a change reaches another server process within
`[filters] reload_seconds`; and a process whose database is lost keeps its copy and says so in one
line."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import text

from horde_lite.app import create_app
from horde_lite.clock import ManualClock
from horde_lite.filters.store import regex_hash
from tests.conftest import make_settings, truncate_pg
from tests.support.apps import app_for
from tests.support.horde import ANON, HordeClient
from tests.support.pgbouncer import find_pgbouncer, skip_or_fail, start_pgbouncer
from tests.support.statements import statements_sent

SECRET = r"\bsecret\s+plan\b"
# A chat worker that takes image parts by URL (a message of the test carries one).
CHAT_BLOCK = {
    "max_completion_tokens": 512,
    "max_context_tokens": 4096,
    "features": ["vision"],
    "image_transports": ["url"],
}


async def _filter(client: HordeClient, key: str, **body: Any) -> dict[str, Any]:
    made = await client.http.put("/api/v2/filters", json=body, headers={"apikey": key})
    assert made.status_code == 200, made.text
    return dict(made.json())


async def _stored(client: HordeClient) -> tuple[Any, ...]:
    """What a refused request must leave as it was: requests, holds, ledger, balances, records."""
    async with client.horde.sessionmaker() as session:
        row = await session.execute(
            text(
                "SELECT (SELECT count(*) FROM text_requests), (SELECT count(*) FROM kudos_holds), "
                "(SELECT count(*) FROM kudos_events), (SELECT coalesce(sum(kudos), 0) FROM users), "
                "(SELECT count(*) FROM admission_records), (SELECT count(*) FROM limit_admissions)"
            )
        )
        return tuple(row.one())


def _refused_horde(answer: Any, said: str) -> None:
    assert (answer.status_code, answer.json()["rc"]) == (400, "CorruptPrompt"), answer.text
    assert said in answer.json()["message"]
    assert "\\s+" not in answer.json()["message"]  # never the pattern


def _refused_v1(answer: Any, said: str, param: str) -> None:
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["type"], error["param"]) == (
        "content_policy_violation", "invalid_request_error", param,
    )  # fmt: skip
    assert said in error["message"]
    assert "\\s+" not in error["message"]


async def test_a_blocking_filter_refuses_on_both_faces(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    rich = await client.user("rich", kudos=100_000)
    await _filter(client, mod, regex=SECRET, filter_type=10, description="No secret plans here.")
    said = "This prompt was refused by a filter: No secret plans here."
    before = await _stored(client)

    # The horde face: a legacy prompt (and its dry run), a native chat payload, its text parts.
    _refused_horde(await client.create(rich, prompt="Tell me the SECRET   plan."), said)
    _refused_horde(await client.create(ANON, prompt="the secret plan", dry_run=True), said)
    messages = [{"role": "system", "content": "Be nice."}, {"role": "user", "content": "My secret plan"}]
    _refused_horde(await client.create(rich, chat={"messages": messages}), said)
    parts = [{"type": "text", "text": "fine"}, {"type": "text", "text": "a secret plan"}]
    _refused_horde(await client.create(rich, chat={"messages": [{"role": "user", "content": parts}]}), said)

    # The /v1 face: chat completions (streamed or not) and text completions.
    bearer = {"Authorization": f"Bearer {rich}"}
    for stream in (False, True):
        chat = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "secret plan"}]}
        _refused_v1(
            await client.http.post("/v1/chat/completions", json=chat, headers=bearer), said, "messages"
        )
    completion = {"model": "m", "prompt": "the secret plan"}
    _refused_v1(await client.http.post("/v1/completions", json=completion, headers=bearer), said, "prompt")
    assert await _stored(client) == before

    # Not a match: admitted.
    assert (await client.create(rich, prompt="The secretary planned.")).status_code == 202


async def test_a_filter_without_a_description_refuses_with_a_generic_line(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    await _filter(client, mod, regex=SECRET, filter_type=11)
    refused = await client.create(ANON, prompt="a secret plan")
    _refused_horde(refused, "appears to violate this horde's terms of service")


async def test_a_replacing_filter_changes_what_the_worker_pops(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    owner = await client.user("owner")
    rich = await client.user("rich", kudos=100_000)
    await _filter(client, mod, regex=r"darn(it)?", filter_type=20, replacement=r"d\1*rn$0")
    await _filter(client, mod, regex="heck", filter_type=25)  # no replacement: the match is removed

    created = await client.create(ANON, prompt="Darn, what the heck! darnit.")
    assert created.status_code == 202, created.text
    job = (await client.pop(owner, "w1")).json()
    assert job["payload"]["prompt"] == r"d\1*rn$0, what the ! d\1*rn$0."  # literally, never a template

    parts = [{"type": "text", "text": "heck"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]
    messages = [{"role": "user", "content": "oh darn"}, {"role": "user", "content": parts}]
    made = await client.create(rich, chat={"messages": messages, "max_tokens": 64})
    assert made.status_code == 202, made.text
    chat_job = (await client.pop(owner, "c1", chat=CHAT_BLOCK)).json()
    assert chat_job["kind"] == "chat", chat_job
    assert chat_job["payload"]["messages"] == [
        {"role": "user", "content": r"oh d\1*rn$0"},
        {"role": "user", "content": [{"type": "text", "text": ""}, parts[1]]},
    ]


async def test_replacements_cannot_bloat_a_prompt(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    await _filter(client, mod, regex="a", filter_type=20, replacement="b" * 255)
    before = await _stored(client)
    refused = await client.create(ANON, prompt="a" * 100)  # 25 500 characters, more than 2 x 100 + 1024
    assert (refused.status_code, refused.json()["rc"]) == (400, "CorruptPrompt")
    assert "too long" in refused.json()["message"]
    assert await _stored(client) == before
    assert (await client.create(ANON, prompt="a cat")).status_code == 202  # 514 characters: within


async def _insert_filter(client: HordeClient, pattern: str, filter_type: int, description: str) -> None:
    """A filter written to the table directly, as no route would store it (it is not checked)."""
    async with client.horde.transaction() as session:
        await session.execute(
            text(
                "INSERT INTO filters (regex, regex_hash, filter_type, description, replacement, user_id, "
                "created_at, updated_at) VALUES (:r, :h, :t, :d, '', 1, 0, 0)"
            ),
            {"r": pattern, "h": regex_hash(pattern), "t": filter_type, "d": description},
        )


@pytest.mark.parametrize("filter_type", [10, 20])
async def test_a_catastrophic_match_is_cut_off_and_refuses(
    client: HordeClient, caplog: pytest.LogCaptureFixture, filter_type: int
) -> None:
    """`(a+)+$` is refused when written; one in the table anyway (a library upgrade, another tool) is
    cut off at its bound, and the request is refused rather than let through."""
    await client.user("mod", moderator=True)
    await _insert_filter(client, "(a+)+$", filter_type, "Never shown: it timed out.")
    caplog.set_level(logging.INFO, logger="horde_lite.filters")
    before = await _stored(client)
    started = time.monotonic()
    refused = await client.create(ANON, prompt="a" * 5000 + "b")
    elapsed = time.monotonic() - started
    assert (refused.status_code, refused.json()["rc"]) == (400, "CorruptPrompt"), refused.text
    assert "could not be checked against this horde's filters in time" in refused.json()["message"]
    # The bound is 0.05 s for the match (the library checks its clock now and then) and 0.5 s for
    # the request; an uncut match would run for longer than the universe has.
    assert elapsed < 5, elapsed
    assert await _stored(client) == before
    assert any(
        "ran out of time" in r.getMessage() and "fail closed" in r.getMessage() for r in caplog.records
    )


async def test_one_requests_matching_is_bounded_as_a_whole(db_url: str, clock: ManualClock) -> None:
    settings = make_settings(db_url, filters={"match_seconds": 0.000001, "admission_seconds": 0.000001})
    app = app_for(settings, clock)
    async with AsyncTestClient(app=app, timeout=30) as http:
        client = HordeClient(http, app.state.horde)
        mod = await client.user("mod", moderator=True)
        for word in ("alpha", "beta", "gamma"):
            await _filter(client, mod, regex=word, filter_type=10)
        refused = await client.create(ANON, prompt="nothing to see " * 20_000)
        assert (refused.status_code, refused.json()["rc"]) == (400, "CorruptPrompt")
        assert "in time" in refused.json()["message"]


async def test_a_change_reaches_another_process_within_reload_seconds(
    db_url: str, clock: ManualClock
) -> None:
    """Two server processes on one database: the one that changes a filter applies it at once, the
    other when its copy is `reload_seconds` old (2 s), without reading the table for each request."""
    settings = make_settings(db_url)
    first, second = (create_app(settings, clock, run_sweeper=False) for _ in range(2))
    async with AsyncTestClient(app=first, timeout=30) as a, AsyncTestClient(app=second, timeout=30) as b:
        one, two = HordeClient(a, first.state.horde), HordeClient(b, second.state.horde)
        mod = await one.user("mod", moderator=True)
        assert (await two.create(ANON, prompt="a secret plan")).status_code == 202  # reads the filters: none
        made = await _filter(one, mod, regex=SECRET, filter_type=10, description="No.")
        assert (await one.create(ANON, prompt="a secret plan")).json()["rc"] == "CorruptPrompt"
        with statements_sent(second.state.horde.engine) as fresh:
            assert (await two.create(ANON, prompt="a secret plan")).status_code == 202  # its copy is fresh
        assert not [s for s in fresh if "FROM filters" in s.statement]
        clock.advance(settings.filters.reload_seconds)
        with statements_sent(second.state.horde.engine) as due:
            assert (await two.create(ANON, prompt="a secret plan")).json()["rc"] == "CorruptPrompt"
        assert len([s for s in due if "FROM filters" in s.statement]) == 1
        # A deletion likewise.
        assert (
            await one.http.delete(f"/api/v2/filters/{made['id']}", headers={"apikey": mod})
        ).status_code == 200
        assert (await one.create(ANON, prompt="a secret plan")).status_code == 202
        clock.advance(settings.filters.reload_seconds)
        assert (await two.create(ANON, prompt="a secret plan")).status_code == 202


async def test_a_lost_database_keeps_the_copy_and_logs_one_line(
    pg_url: str, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The database goes away under a running process (its PgBouncer stops: every connection is
    refused) when its copy of the filters is due: the reload's failure is one WARNING line, no
    traceback, and the copy still screens."""
    if find_pgbouncer() is None:
        skip_or_fail("no pgbouncer binary (apt-get install pgbouncer)")
    await truncate_pg(pg_url)
    with start_pgbouncer(pg_url) as pooler:
        settings = make_settings(pooler.url, database={"pgbouncer": True}, ratelimit={"store": "memory"})
        app = app_for(settings, clock)
        async with AsyncTestClient(app=app, timeout=30) as http:
            client = HordeClient(http, app.state.horde)
            mod = await client.user("mod", moderator=True)
            await _filter(client, mod, regex=SECRET, filter_type=10, description="No.")
            _refused_horde(await client.create(ANON, prompt="a secret plan"), "No.")  # the copy is read

            pooler.stop()
            clock.advance(settings.filters.reload_seconds)
            # The app's start-up configured logging after pytest's capture began: capture here.
            logger = logging.getLogger("horde_lite.filters")
            logger.addHandler(caplog.handler)
            try:
                answer = await client.create(ANON, prompt="a secret plan")
            finally:
                logger.removeHandler(caplog.handler)
    _refused_horde(answer, "No.")  # screened with the copy, before anything else needs the database
    said = [r for r in caplog.records if r.name == "horde_lite.filters" and r.levelno >= logging.WARNING]
    assert [(r.levelno, r.exc_info) for r in said] == [(logging.WARNING, None)]
    assert "keeping this process's copy" in said[0].getMessage()
    assert "\n" not in said[0].getMessage()
