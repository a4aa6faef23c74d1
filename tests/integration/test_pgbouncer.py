"""horde_lite behind a real PgBouncer in transaction pooling mode (`[database] pgbouncer`,
docs/reference/operators.md, "PgBouncer"): migrations, whole job cycles from concurrent clients
on a few shared server connections, /v1 waiters woken in one process and across two through a
direct `listen_url`, the slow poll without it, and the same run failing without the setting.
PostgreSQL only; skipped without the pgbouncer binary unless HORDE_LITE_REQUIRE_PGBOUNCER is set."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from click.testing import CliRunner
from sqlalchemy.engine import make_url

from horde_lite import cli
from horde_lite.clock import ManualClock
from horde_lite.db import migrate
from horde_lite.settings import Settings
from tests.conftest import PG_TEST_DB, make_settings, truncate_pg
from tests.support.chat import MODEL, Chat, in_background, open_chat, settled
from tests.support.cli import point_settings_at
from tests.support.pgbouncer import Bouncer, bouncer, start_pgbouncer

__all__ = ["bouncer"]  # the fixture, used by name

CLIENTS = 8  # concurrent requester and worker pairs: more than PgBouncer's server connections
PROMPT = [{"role": "user", "content": "Hi"}]
KUDOS = 1000.0


@pytest.fixture
async def empty(pg_url: str) -> str:
    await truncate_pg(pg_url)
    return pg_url


def behind(bouncer: Bouncer, url: str | None = None, **tables: dict[str, object]) -> Settings:
    """The settings of an app reaching the test database (or `url`'s, direct) through `bouncer`:
    pooled connections (each shares PgBouncer's few server connections), PgBouncer support on."""
    database = {"null_pool": False, "pgbouncer": True, **tables.pop("database", {})}
    target = bouncer.url if url is None else through(bouncer, url)
    return make_settings(target, database=database, **tables)


async def fresh_database(pg_url: str, name: str) -> str:
    """An empty database next to the suite's, and its URL (direct)."""
    url = make_url(pg_url)
    conn = await asyncpg.connect(host=url.host, port=url.port or 5432, user=url.username, database="postgres")
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return url.set(database=name).render_as_string(hide_password=False)


def through(bouncer: Bouncer, direct: str) -> str:
    """`direct`'s database through `bouncer` (its ini serves every database of the server)."""
    return bouncer.url_for(str(make_url(direct).database))


async def applied(direct: str) -> str | None:
    return await migrate.current(direct)


# --- migrations ------------------------------------------------------------------------------------


async def test_database_upgrade_command_migrates_through_pgbouncer(
    bouncer: Bouncer, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    direct = await fresh_database(pg_url, f"{PG_TEST_DB}_pgb_cli")
    point_settings_at(through(bouncer, direct), tmp_path, monkeypatch)
    monkeypatch.setenv("HORDE_LITE_DATABASE__PGBOUNCER", "true")
    result = await asyncio.to_thread(CliRunner().invoke, cli.database, ["upgrade"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert await applied(direct) in migrate.heads()


async def test_start_up_migrates_an_empty_database_through_pgbouncer(
    bouncer: Bouncer, pg_url: str, clock: ManualClock
) -> None:
    direct = await fresh_database(pg_url, f"{PG_TEST_DB}_pgb_start")
    assert await applied(direct) is None
    settings = behind(bouncer, direct)
    async with open_chat(settings, clock) as app:
        await app.hc.user("first")  # the migrated schema takes a write
    assert await applied(direct) in migrate.heads()


# --- whole cycles from concurrent clients ---------------------------------------------------------


async def _one_cycle(app: Chat, i: int) -> dict[str, float]:
    """Create, pop, submit and read the status of one request, for pair `i`; what it cost."""
    requester = await app.hc.user(f"requester{i}", kudos=KUDOS)
    owner = await app.hc.user(f"owner{i}")
    created = await app.hc.create(requester, models=[MODEL], params={"max_length": 16})
    assert created.status_code == 202, created.text
    request_id = created.json()["id"]
    job: dict[str, Any] = {}
    while not job.get("id"):  # another pair's worker may take this request first
        popped = await app.hc.pop(owner, f"w{i}", models=[MODEL], max_length=512, max_context_length=4096)
        assert popped.status_code == 200, popped.text
        job = popped.json()
    submitted = await app.hc.submit(owner, job["id"], "x" * 40)
    assert submitted.status_code == 200, submitted.text
    reward = submitted.json()["reward"]
    while (status := await app.hc.status(request_id)).json().get("done") is not True:
        assert status.status_code == 200, status.text
        await asyncio.sleep(0.05)
    return {"reward": reward, "charged": status.json()["kudos"]}


async def _cycles(app: Chat) -> list[dict[str, float] | BaseException]:
    return await asyncio.gather(*(_one_cycle(app, i) for i in range(CLIENTS)), return_exceptions=True)


async def test_whole_cycles_from_concurrent_clients_settle_exactly_through_pgbouncer(
    bouncer: Bouncer, empty: str, clock: ManualClock
) -> None:
    settings = behind(bouncer, database={"listen_url": empty})
    async with open_chat(settings, clock) as app:
        done = await _cycles(app)
        failed = [d for d in done if isinstance(d, BaseException)]
        assert not failed, failed
        cycles = [d for d in done if isinstance(d, dict)]
        for i in range(CLIENTS):
            spent = KUDOS - await app.hc.balance(f"requester{i}")
            assert spent == pytest.approx(cycles[i]["charged"], abs=0.005)
        earned = [await app.hc.balance(f"owner{i}") for i in range(CLIENTS)]
        rewards = sum(c["reward"] for c in cycles)
        assert sum(earned) == pytest.approx(rewards, abs=0.005)
        # Each request is charged its job's reward plus the burn of 1 (docs: horde_api.md, "Kudos").
        assert sum(c["charged"] for c in cycles) == pytest.approx(rewards + CLIENTS, abs=0.005)


async def test_without_the_setting_the_app_cannot_start_behind_pgbouncer(
    bouncer: Bouncer, empty: str, clock: ManualClock
) -> None:
    """The startup parameter that turns JIT off is refused by PgBouncer."""
    settings = behind(bouncer, database={"pgbouncer": False})
    with pytest.raises(BaseException) as refused:  # noqa: PT011 (the lifespan's task group wraps it)
        async with open_chat(settings, clock):
            pass
    assert "unsupported startup parameter: jit" in " ".join(messages(refused.value))


def messages(error: BaseException) -> list[str]:
    """The messages of an error and of every error it groups."""
    if isinstance(error, BaseExceptionGroup):
        return [m for inner in error.exceptions for m in messages(inner)]
    return [str(error)]


async def test_without_the_setting_prepared_statements_collide_behind_pgbouncer(
    pg_url: str, empty: str, clock: ManualClock, capfd: pytest.CaptureFixture[str]
) -> None:
    """With that parameter let through, the same cycles fail on prepared statements: each app
    connection names its statements as if it had a server connection of its own."""
    with start_pgbouncer(pg_url, ignore_startup=("jit",)) as lenient:
        settings = behind(lenient, database={"pgbouncer": False})
        failed: BaseException | None = None
        try:
            async with open_chat(settings, clock) as app:
                for i in range(CLIENTS):  # one at a time: a failure is the statements', not a wait's
                    await _one_cycle(app, i)
        except Exception as error:  # start-up itself may meet a collision
            failed = error
    assert failed is not None, "the cycles succeeded without [database] pgbouncer"
    assert "prepared statement" in capfd.readouterr().err + " ".join(messages(failed))


# --- /v1 waiters ------------------------------------------------------------------------------------


WAKE = {"poll_seconds": 600.0, "grace_seconds": 600, "max_queue_wait_seconds": 600}


async def _answer_across(waiting: Chat, working: Chat) -> str:
    """A /v1 chat call waits on `waiting` while a worker on `working` serves it; its answer."""
    key = await working.hc.user("owner")
    worker = working.worker(key, "w1")
    await worker.pop()
    asking = await in_background(waiting.openai().chat.completions.create(model=MODEL, messages=PROMPT))
    await working.until_request()
    await worker.serve("through the pooler")
    answer = await settled(asking)
    return answer.choices[0].message.content


async def test_a_chat_waiter_is_woken_in_its_process_through_pgbouncer(
    bouncer: Bouncer, empty: str, clock: ManualClock
) -> None:
    """Nothing but the in-process wake-up can answer before the ten-minute poll (the test would time
    out first)."""
    settings = behind(bouncer, chat=WAKE)
    async with open_chat(settings, clock) as app:
        assert app.horde.notifier.listening.is_set() is False  # no listen_url: no LISTEN at all
        assert await _answer_across(app, app) == "through the pooler"


async def test_two_apps_wake_each_other_through_a_direct_listen_url(
    bouncer: Bouncer, empty: str, clock: ManualClock
) -> None:
    settings = behind(bouncer, database={"listen_url": empty}, chat=WAKE)
    async with open_chat(settings, clock) as waiting, open_chat(settings, clock) as working:
        for app in (waiting, working):
            await settled(app.horde.notifier.listening.wait())
        assert await _answer_across(waiting, working) == "through the pooler"


async def test_without_listen_url_other_processes_waiters_see_changes_at_the_poll(
    bouncer: Bouncer, empty: str, clock: ManualClock, capfd: pytest.CaptureFixture[str]
) -> None:
    settings = behind(bouncer, chat={**WAKE, "poll_seconds": 0.5})
    async with open_chat(settings, clock) as waiting, open_chat(settings, clock) as working:
        assert not waiting.horde.notifier.listening.is_set()
        assert await _answer_across(waiting, working) == "through the pooler"
    said = [line for line in capfd.readouterr().err.splitlines() if "without listen_url" in line]
    assert len(said) == 2, said  # one line per process
    assert "poll_seconds (0.5 s)" in said[0], said


# --- settings ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("database", "refusal"),
    [
        ({"url": "sqlite+aiosqlite:///x.db", "pgbouncer": True}, "pgbouncer is for a PostgreSQL url"),
        ({"url": "sqlite+aiosqlite:///x.db", "listen_url": "postgresql+asyncpg://h/d"}, "no LISTEN"),
        ({"url": "postgresql+asyncpg://h/d", "listen_url": "sqlite+aiosqlite:///x.db"}, "write a PostgreSQL"),
        ({"url": "postgresql+asyncpg://h/d", "listen_url": "postgres://u:secret@h/d"}, "listen_url"),
        ({"url": "postgresql+asyncpg://h/d", "listen_url": "not a url"}, "listen_url"),
    ],
)
def test_settings_refuse_what_cannot_work(database: dict[str, object], refusal: str) -> None:
    import msgspec

    with pytest.raises(msgspec.ValidationError, match=refusal) as refused:
        msgspec.convert({"database": database}, Settings)
    assert "secret" not in str(refused.value)


@pytest.mark.parametrize(
    ("database", "listener"),
    [
        ({"url": "postgresql+asyncpg://h/d"}, "postgresql+asyncpg://h/d"),
        ({"url": "postgresql+asyncpg://h:6432/d", "pgbouncer": True}, None),
        (
            {
                "url": "postgresql+asyncpg://h:6432/d",
                "pgbouncer": True,
                "listen_url": "postgresql+asyncpg://h/d",
            },
            "postgresql+asyncpg://h/d",
        ),
        ({"url": "sqlite+aiosqlite:///x.db"}, None),
    ],
)
def test_the_listener_connects_where_the_settings_say(
    database: dict[str, object], listener: str | None
) -> None:
    import msgspec

    assert msgspec.convert({"database": database}, Settings).database.listener_url == listener


# --- the pooler the tests and the rehearsal start ----------------------------------------------------


async def test_a_pooler_that_has_logged_more_than_a_pipe_holds_still_answers(pg_url: str) -> None:
    """PgBouncer in the foreground writes each log line to its console too: started with a pipe
    nobody read, it froze once 64 KiB were written (a database restart logs hundreds of lines), and
    every host behind it hung. Its console is a file now."""
    with start_pgbouncer(pg_url) as pooler:
        target = make_url(pooler.url)

        async def connect() -> asyncpg.Connection:
            return await asyncpg.connect(
                host=target.host, port=target.port, user=target.username, database=target.database,
                timeout=5, statement_cache_size=0,
            )  # fmt: skip

        for _ in range(400):  # a login and a close: two log lines, about 250 bytes
            await (await connect()).close()
        assert len(pooler.log_text()) > 2 * 64 * 1024
        assert pooler.console.stat().st_size > 64 * 1024
        conn = await connect()
        try:
            assert await asyncio.wait_for(conn.fetchval("SELECT 1"), 5) == 1
        finally:
            await conn.close()
