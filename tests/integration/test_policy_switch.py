"""Switching policies without a restart (decision 0028), on SQLite and PostgreSQL: in process
through the lifecycle (`policy_state.switch`, the watcher's one step `apply_changes`, GET
/operator/policies and its guard, the start-up rule), then with real `horde-lite run` processes on
one database: the CLI's `policies use` and a SIGHUP after editing the settings file switch both."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select

from horde_lite.accounts import kudos as ledger
from horde_lite.accounts.users import create_user
from horde_lite.app import create_app
from horde_lite.clock import Clock, ManualClock
from horde_lite.db.engine import make_engine, make_sessionmaker
from horde_lite.db.models import PolicyChange, PolicyState
from horde_lite.operators import policy_state
from horde_lite.policies.registry import PolicyError
from tests.conftest import make_settings
from tests.support.apps import app_for
from tests.support.horde import HordeClient

MODEL = "test/legacy-7B"
# A new worker's capacity is 10 tokens/s x (150 - 30) s = 1200 tokens: a legacy request for 2000
# passes prefer_capable (legacy requests always pass) and is refused by enforce_all.
OVER_CAPACITY = 2000
RELOAD = 0.5  # [policies] reload_seconds of the server processes
MARGIN = 1.5  # scheduling on a busy 2-core machine, the test's own poll
HORDE_LITE = Path(sys.executable).with_name("horde-lite")


# --- helpers -----------------------------------------------------------------------------------


async def legacy_request(http: Any, key: str) -> str:
    body = {
        "prompt": "Hi",
        "models": [MODEL],
        "params": {"max_length": OVER_CAPACITY, "max_context_length": 4096},
    }
    response = await http.post("/api/v2/generate/text/async", json=body, headers={"apikey": key})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def pop(http: Any, key: str, name: str) -> str | None:
    body = {"name": name, "models": [MODEL], "max_length": 4096, "max_context_length": 8192}
    response = await http.post("/api/v2/generate/text/pop", json=body, headers={"apikey": key})
    assert response.status_code == 200, response.text
    return response.json()["id"]


async def rows(url: str) -> tuple[list[tuple[str, str, int]], int]:
    """policy_state as (kind, name, version), and how many policy_changes rows there are."""
    engine = make_engine(url, null_pool=True)
    try:
        async with make_sessionmaker(engine)() as session:
            state = (
                await session.execute(select(PolicyState.kind, PolicyState.name, PolicyState.version))
            ).all()
            changes = (await session.execute(select(func.count()).select_from(PolicyChange))).scalar_one()
    finally:
        await engine.dispose()
    return sorted((k, n, v) for k, n, v in state), int(changes)


async def make_user(url: str, name: str, *, kudos: float = 0, moderator: bool = False) -> str:
    engine = make_engine(url, null_pool=True)
    try:
        async with make_sessionmaker(engine)() as session, session.begin():
            now = Clock().now()
            user, key = await create_user(session, name, now, trusted=True, moderator=moderator)
            if kudos:
                await ledger.record(session, user.id, kudos, "grant", "test", now)
    finally:
        await engine.dispose()
    return key


@contextmanager
def recorded(name: str) -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


# --- in process ----------------------------------------------------------------------------------


@pytest.fixture
def settings(db_url: str) -> Any:
    # A long poll: the test drives the watcher's step itself (a switch made in process, or NOTIFY,
    # may still wake the background watcher; both apply the same state).
    return make_settings(db_url, policies={"reload_seconds": 3600})


async def test_switch_applies_through_the_watcher_and_shows_on_the_operator_route(
    client: HordeClient, db_url: str
) -> None:
    horde = client.horde
    moderator = await client.user("mod", moderator=True)
    requester = await client.user("client", kudos=100_000)
    owner = await client.user("owner")
    headers = {"apikey": moderator}

    # Start-up seeded every kind from the settings, version 1, and the process applies it.
    state, changes = await rows(db_url)
    assert state == [("allowance_curve", "estimated_wait", 1), ("shadow_metrics", "over_capacity", 1),
                     ("speed_gate", "prefer_capable", 1)]  # fmt: skip
    assert changes == 3
    shown = (await client.http.get("/operator/policies", headers=headers)).json()
    assert shown["pid"] == os.getpid()
    gate = shown["policies"]["speed_gate"]
    seen = (gate["name"], gate["version"], gate["applied_name"], gate["applied_version"], gate["in_sync"])
    assert seen == ("prefer_capable", 1, "prefer_capable", 1, True)

    # prefer_capable: a legacy request over the worker's capacity is offered.
    await legacy_request(client.http, requester)
    assert await pop(client.http, owner, "before") is not None

    # The switch as the CLI makes it (an engine, not this horde): the watcher's step applies it.
    engine = make_engine(db_url, null_pool=True)
    try:
        result = await policy_state.switch(engine, "speed_gate", "enforce_all", {}, "cli")
    finally:
        await engine.dispose()
    assert (result.old_name, result.name, result.version, result.changed) == (
        "prefer_capable",
        "enforce_all",
        2,
        True,
    )
    await policy_state.apply_changes(horde)
    assert horde.policies.names["speed_gate"] == "enforce_all"
    assert horde.policies.versions["speed_gate"] == 2
    assert type(horde.policies.speed_gate).__name__ == "EnforceAll"
    gate = (await client.http.get("/operator/policies", headers=headers)).json()["policies"]["speed_gate"]
    assert (gate["name"], gate["version"], gate["applied_version"], gate["in_sync"]) == (
        "enforce_all",
        2,
        2,
        True,
    )

    # enforce_all: the same kind of request is no longer offered to a worker of that capacity.
    await legacy_request(client.http, requester)
    assert await pop(client.http, owner, "after") is None

    # Switching in process (options included) wakes this process's watcher at commit.
    result = await policy_state.switch(
        horde, "allowance_curve", "jobs_per_thread", {"full_jobs_per_thread": 1.0}, "cli"
    )
    assert (result.changed, result.version) == (True, 2)
    await policy_state.apply_changes(horde)
    assert horde.policies.names["allowance_curve"] == "jobs_per_thread"
    assert horde.policies.options["allowance_curve"] == {"full_jobs_per_thread": 1.0}
    # The same policy again changes nothing.
    again = await policy_state.switch(
        horde, "allowance_curve", "jobs_per_thread", {"full_jobs_per_thread": 1.0}, "cli"
    )
    assert (again.changed, again.version) == (False, 2)

    # A bad name or option is refused with the registry's message, and nothing changes.
    before = await rows(db_url)
    with pytest.raises(PolicyError) as refused:
        await policy_state.switch(horde, "speed_gate", "fastest", {}, "cli")
    for name in ("'fastest'", "enforce_all", "enforce_chat", "off", "prefer_capable"):
        assert name in str(refused.value)
    with pytest.raises(PolicyError, match="nope"):
        await policy_state.switch(horde, "allowance_curve", "jobs_per_thread", {"nope": 1}, "cli")
    assert await rows(db_url) == before
    assert await policy_state.apply_changes(horde) == []

    history = await policy_state.history(horde)
    assert [(c.kind, c.old_name, c.new_name, c.source) for c in history[:2]] == [
        ("allowance_curve", "estimated_wait", "jobs_per_thread", "cli"),
        ("speed_gate", "prefer_capable", "enforce_all", "cli"),
    ]


async def test_a_policy_this_process_cannot_build_keeps_the_old_one_and_says_so_once(
    client: HordeClient, db_url: str
) -> None:
    """As when another host, with a plugin this one lacks, switched the horde to it."""
    horde = client.horde
    engine = make_engine(db_url, null_pool=True)
    try:
        async with make_sessionmaker(engine)() as session, session.begin():
            row = await session.get(PolicyState, "speed_gate")
            assert row is not None
            row.name, row.version = "margin_gate", row.version + 1
    finally:
        await engine.dispose()
    with recorded("horde_lite.policies") as records:
        failed: dict[str, int] = {}
        assert await policy_state.apply_changes(horde, failed) == []
        assert await policy_state.apply_changes(horde, failed) == []
    errors = [
        r.getMessage() for r in records if r.levelno == logging.ERROR and "margin_gate" in r.getMessage()
    ]
    assert len(errors) == 1, errors
    assert "keeping prefer_capable" in errors[0]
    assert horde.policies.names["speed_gate"] == "prefer_capable"
    view = await policy_state.policies_view(horde)
    gate = next(k for k in view.kinds if k.kind == "speed_gate")
    assert (gate.name, gate.version, gate.applied_name, gate.applied_version, gate.in_sync) == (
        "margin_gate", 2, "prefer_capable", 1, False,
    )  # fmt: skip


async def test_operator_route_needs_a_moderator_unless_opened(client: HordeClient, db_url: str) -> None:
    moderator = await client.user("mod", moderator=True)
    user = await client.user("someone")
    assert (await client.http.get("/operator/policies")).status_code == 403
    assert (await client.http.get("/operator/policies", headers={"apikey": user})).status_code == 403
    answer = await client.http.get("/operator/policies", headers={"apikey": "0000000000"})
    assert answer.status_code == 403
    assert answer.json()["rc"] == "NotModerator"
    assert (await client.http.get("/operator/policies", headers={"apikey": "x" * 22})).status_code == 401
    assert (await client.http.get("/operator/policies", headers={"apikey": moderator})).status_code == 200
    opened = app_for(make_settings(db_url, http={"open_operator_pages": True}), ManualClock())
    async with AsyncTestClient(app=opened, timeout=30) as http:
        answer = await http.get("/operator/policies")
        assert answer.status_code == 200
        assert set(answer.json()["policies"]) == {"speed_gate", "allowance_curve", "shadow_metrics"}


async def test_at_start_up_the_database_wins_over_the_settings_and_says_how_to_switch(
    client: HordeClient, db_url: str
) -> None:
    await policy_state.switch(client.horde, "speed_gate", "enforce_all", {}, "cli")
    other = make_settings(db_url, policies={"speed_gate": "off", "reload_seconds": 3600})
    app = create_app(other, ManualClock(), run_sweeper=False)  # a second process, beside the first
    # On the logger itself: starting an app reconfigures the root logger's handlers (caplog's).
    with recorded("horde_lite.policies") as records:
        async with AsyncTestClient(app=app, timeout=30):
            second = app.state.horde
            assert second.policies.names["speed_gate"] == "enforce_all"
            assert second.policies.versions["speed_gate"] == 2
    said = [r.getMessage() for r in records if "the settings name off" in r.getMessage()]
    assert said, [r.getMessage() for r in records]
    assert "horde-lite policies use speed_gate off" in said[0]
    state, _ = await rows(db_url)
    assert ("speed_gate", "enforce_all", 2) in state  # starting with another file wrote nothing


# --- real processes ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_env(db_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORDE_LITE_")}
    env.update(HORDE_LITE_DATABASE__URL=db_url, HORDE_LITE_POLICIES__RELOAD_SECONDS=str(RELOAD),
               HORDE_LITE_HTTP__OPEN_OPERATOR_PAGES="true", **extra)  # fmt: skip
    return env


@contextmanager
def servers(
    tmp_path: Path, env: dict[str, str], count: int = 2
) -> Iterator[list[tuple[subprocess.Popen[bytes], str, Path]]]:
    started: list[tuple[subprocess.Popen[bytes], str, Path]] = []
    try:
        for i in range(count):
            port, log = free_port(), tmp_path / f"server-{i}.log"
            with log.open("wb") as out:
                process = subprocess.Popen(
                    [str(HORDE_LITE), "run", "--host", "127.0.0.1", "--port", str(port)],
                    cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
            started.append((process, f"http://127.0.0.1:{port}", log))
        deadline = time.monotonic() + 60
        for process, url, log in started:
            while True:
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                try:
                    if httpx.get(f"{url}/operator/policies", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        yield started
    finally:
        for process, _, _ in started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process, _, _ in started:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


async def until_all_apply(urls: list[str], kind: str, name: str, version: int) -> float:
    """Seconds until every process reports `name` applied at `version`."""
    start = time.monotonic()
    pending = set(urls)
    async with httpx.AsyncClient(timeout=5) as http:
        while pending:
            for url in sorted(pending):
                shown = (await http.get(f"{url}/operator/policies")).json()["policies"][kind]
                if (shown["applied_name"], shown["applied_version"]) == (name, version):
                    pending.discard(url)
            assert time.monotonic() - start < 30, f"{pending} never applied {name} v{version}"
            if pending:
                await asyncio.sleep(0.02)
    return time.monotonic() - start


async def horde_lite(cwd: Path, env: dict[str, str], *args: str) -> tuple[int, str]:
    """Run the installed CLI; its exit code and its output (stdout and stderr together)."""
    process = await asyncio.create_subprocess_exec(
        str(HORDE_LITE), *args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    # Flattened: the Litestar CLI draws errors in a box, wrapping the message at spaces.
    return process.returncode, " ".join(out.decode().replace("│", " ").split())


@asynccontextmanager
async def clients(urls: list[str]) -> AsyncIterator[list[httpx.AsyncClient]]:
    made = [httpx.AsyncClient(base_url=url, timeout=30) for url in urls]
    try:
        yield made
    finally:
        for http in made:
            await http.aclose()


@pytest.mark.slow
async def test_cli_switch_reaches_both_server_processes(db_url: str, tmp_path: Path) -> None:
    requester = await make_user(db_url, "client", kudos=100_000)
    owner = await make_user(db_url, "owner")
    env = server_env(db_url)
    with servers(tmp_path, env) as started:
        urls = [url for _, url, _ in started]
        async with clients(urls) as https:
            await legacy_request(https[0], requester)
            assert await pop(https[0], owner, "before") is not None  # prefer_capable offers it
            code, out = await horde_lite(tmp_path, env, "policies", "use", "speed_gate", "enforce_all")
            committed = time.monotonic()
            assert code == 0, out
            assert "prefer_capable {} -> enforce_all {} (version 2)" in out
            waited = await until_all_apply(urls, "speed_gate", "enforce_all", 2)
            took = time.monotonic() - committed
            kind = db_url.split(":")[0]
            print(f"\nboth processes applied the switch {took:.3f} s after the CLI exited ({kind})")
            assert took <= RELOAD + MARGIN, took
            assert waited <= took
            for i, http in enumerate(https):  # each process now pops under enforce_all
                await legacy_request(http, requester)
                assert await pop(http, owner, f"after-{i}") is None

            code, out = await horde_lite(tmp_path, env, "policies", "use", "speed_gate", "fastest")
            assert code != 0
            assert "installed speed_gate policies: enforce_all, enforce_chat, off, prefer_capable" in out
            assert "nothing changed" in out
            code, out = await horde_lite(tmp_path, env, "policies")
            assert code == 0, out
            assert (
                "in force: speed_gate = enforce_all options {} version 2; the settings select prefer_capable"
                in out
            )
            code, out = await horde_lite(tmp_path, env, "policies", "history")
            assert code == 0, out
            switched = "speed_gate version 2: prefer_capable -> enforce_all {} (cli)"
            assert switched in out
            assert out.index(switched) < out.index("(start-up)")  # newest first
            assert out.count("(start-up)") == 3
    state, changes = await rows(db_url)
    assert ("speed_gate", "enforce_all", 2) in state
    assert changes == 4  # the refused switch wrote nothing
    for _, _, log in started:
        text = log.read_text()
        assert "policy switch: speed_gate prefer_capable -> enforce_all (version 1 -> 2" in text, text
        assert "Traceback" not in text, text


SETTINGS_BEFORE = '[policies.speed_gate]\nname = "prefer_capable"\n'
SETTINGS_AFTER = (
    '[policies.speed_gate]\nname = "enforce_chat"\n\n'
    '[policies.allowance_curve]\nname = "jobs_per_thread"\n\n'
    "[policies.allowance_curve.options]\nfull_jobs_per_thread = 1.0\n"
)


@pytest.mark.slow
async def test_sighup_after_editing_the_settings_switches_both_processes(db_url: str, tmp_path: Path) -> None:
    config = tmp_path / "horde.toml"
    config.write_text(SETTINGS_BEFORE)
    env = server_env(db_url, HORDE_LITE_CONFIG=str(config))
    with servers(tmp_path, env) as started:
        urls = [url for _, url, _ in started]
        first = started[0][0]
        config.write_text("[policies.speed_gate]\nname = \n")  # not TOML: logged, nothing changes
        os.kill(first.pid, signal.SIGHUP)
        await asyncio.sleep(RELOAD * 2)
        assert first.poll() is None
        state, _ = await rows(db_url)
        assert ("speed_gate", "prefer_capable", 1) in state

        config.write_text(SETTINGS_AFTER)
        os.kill(first.pid, signal.SIGHUP)
        sent = time.monotonic()
        await until_all_apply(urls, "speed_gate", "enforce_chat", 2)
        await until_all_apply(urls, "allowance_curve", "jobs_per_thread", 2)
        took = time.monotonic() - sent
        print(f"\nboth processes followed the SIGHUP in {took:.3f} s ({db_url.split(':')[0]})")
        assert took <= RELOAD + MARGIN, took
        async with httpx.AsyncClient(timeout=5) as http:
            shown = (await http.get(f"{urls[1]}/operator/policies")).json()["policies"]["allowance_curve"]
        assert shown["applied_options"] == {"full_jobs_per_thread": 1.0}
    first_log = started[0][2].read_text()
    assert "SIGHUP: the settings were not reloaded" in first_log, first_log
    for _, _, log in started:
        assert "policy switch: speed_gate prefer_capable -> enforce_chat" in log.read_text()
    engine = make_engine(db_url, null_pool=True)
    try:
        async with make_sessionmaker(engine)() as session:
            sources = (await session.execute(select(PolicyChange.kind, PolicyChange.source))).all()
    finally:
        await engine.dispose()
    assert sorted(k for k, s in sources if s == "sighup") == ["allowance_curve", "speed_gate"]
