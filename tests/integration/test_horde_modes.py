"""The horde's modes (docs/reference/horde_api.md, "Horde modes"), over HTTP on SQLite and
PostgreSQL: who may see and switch them through GET and PUT /api/v2/status/modes, what maintenance,
invite-only and raid mode refuse and what they keep working, the switches' log, a switch made
elsewhere (the CLI) reaching a running process through its poll, and the CLI's `modes` commands."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select, text

from horde_lite import cli
from horde_lite.accounts.users import create_user, display_name
from horde_lite.clock import ManualClock
from horde_lite.db.engine import make_engine, make_sessionmaker
from horde_lite.db.models import HordeModeChange, KudosEvent, TextRequest, User, Worker
from horde_lite.operators import horde_modes
from horde_lite.settings import Settings
from tests.conftest import make_settings
from tests.support.apps import app_for
from tests.support.cli import point_settings_at, query
from tests.support.horde import ANON, HordeClient

MODES = "/api/v2/status/modes"
MODEL = "test/modes-7B"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16}
TEXT = {"model": MODEL, "prompt": "Hello", "max_tokens": 16}


async def _boss(db_url: str) -> tuple[str, str]:
    """A moderator made before the app starts, so the settings can name it an admin."""
    engine = make_engine(db_url, null_pool=True)
    try:
        async with make_sessionmaker(engine)() as session, session.begin():
            user, key = await create_user(session, "boss", ManualClock().now(), trusted=True, moderator=True)
            return display_name(user), key
    finally:
        await engine.dispose()


@pytest.fixture
def admin(db_url: str) -> tuple[str, str]:
    """(name#id, key) of the horde's one admin."""
    return asyncio.run(_boss(db_url))


@pytest.fixture
def settings(db_url: str, admin: tuple[str, str]) -> Settings:
    return make_settings(
        db_url,
        moderation={"admins": [admin[0]]},
        accounts={"registration": "open"},
        ratelimit={"register_per_hour": 0},
    )


async def put(client: HordeClient, key: str | None, body: Any) -> Any:
    headers = {} if key is None else {"apikey": key}
    return await client.http.put(MODES, json=body, headers=headers)


async def shown(client: HordeClient, key: str | None = None) -> dict[str, Any]:
    answer = await client.http.get(MODES, headers={} if key is None else {"apikey": key})
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def refused(answer: Any, status: int, rc: str) -> None:
    assert answer.status_code == status, answer.text
    assert answer.json()["rc"] == rc, answer.text
    assert answer.json()["message"]


async def changes(client: HordeClient) -> list[tuple[str, bool, str, str]]:
    async with client.horde.sessionmaker() as session:
        rows = await session.execute(
            select(HordeModeChange.mode, HordeModeChange.enabled, HordeModeChange.changed_by,
                   HordeModeChange.source).order_by(HordeModeChange.id)
        )  # fmt: skip
        return [tuple(r) for r in rows]  # type: ignore[misc]


async def count(client: HordeClient, model: Any) -> int:
    async with client.horde.sessionmaker() as session:
        return int((await session.execute(select(func.count()).select_from(model))).scalar_one())


async def user_id(client: HordeClient, key: str) -> int:
    return int((await client.http.get("/api/v2/find_user", headers={"apikey": key})).json()["id"])


# --- who may see and switch --------------------------------------------------------------------


async def test_who_may_see_and_switch_the_modes(client: HordeClient, admin: tuple[str, str]) -> None:
    admin_name, boss = admin
    mod = await client.user("mod", moderator=True)
    someone = await client.user("someone", kudos=10)
    assert await shown(client) == {"maintenance_mode": False, "invite_only_mode": False}
    assert await shown(client, mod) == {
        "maintenance_mode": False,
        "invite_only_mode": False,
        "raid_mode": False,
    }
    await refused(await client.http.get(MODES, headers={"apikey": "not-a-key"}), 401, "InvalidAPIKey")
    await refused(await client.http.get(MODES, headers={"apikey": someone}), 403, "NotModerator")
    await refused(await client.http.get(MODES, headers={"apikey": ANON}), 403, "NotModerator")

    # Upstream's order: the key, then maintenance (admins), invite-only and raid (moderators), then
    # an empty switch. A refusal changes nothing, the modes it could have switched included.
    await refused(await put(client, "not-a-key", {"raid_mode": True}), 401, "InvalidAPIKey")
    await refused(
        await put(client, mod, {"invite_only_mode": True, "maintenance_mode": True}), 403, "NotAdmin"
    )
    await refused(await put(client, someone, {"raid_mode": True}), 403, "NotModerator")
    await refused(await put(client, None, {"invite_only_mode": True}), 403, "NotModerator")
    await refused(await put(client, ANON, {"maintenance_mode": False}), 403, "NotAdmin")
    await refused(await put(client, mod, {}), 400, "NoHordeModSelected")
    await refused(await put(client, mod, {"raid_mode": None}), 400, "NoHordeModSelected")
    await refused(await put(client, someone, {}), 400, "NoHordeModSelected")
    # A moderator's (even the admin's) shared key is not its own key.
    shared = await client.http.put("/api/v2/sharedkeys", json={"name": "lent"}, headers={"apikey": boss})
    assert shared.status_code == 200, shared.text
    lent = shared.json()["id"]
    await refused(await put(client, lent, {"maintenance_mode": True}), 403, "NotAdmin")
    await refused(await put(client, lent, {"raid_mode": True}), 403, "NotModerator")
    await refused(await client.http.get(MODES, headers={"apikey": lent}), 403, "NotModerator")
    # Hostile bodies: the wrong type, an unknown field, not an object.
    for body in ({"raid_mode": "yes"}, {"raid_mode": 1}, {"raid": True}, [True], "true"):
        await refused(await put(client, mod, body), 400, "BadRequest")
    assert await changes(client) == []
    assert client.horde.modes.version == 0

    switched = await put(client, mod, {"raid_mode": True, "invite_only_mode": False})
    assert switched.status_code == 200, switched.text
    assert switched.json() == {"raid_mode": True, "invite_only_mode": False}
    assert await shown(client) == {"maintenance_mode": False, "invite_only_mode": False}  # raid hidden
    assert (await shown(client, mod))["raid_mode"] is True
    on = await put(client, boss, {"maintenance_mode": True})
    assert on.status_code == 200, on.text
    assert on.json() == {"maintenance_mode": True}
    assert await shown(client) == {"maintenance_mode": True, "invite_only_mode": False}
    again = await put(client, boss, {"maintenance_mode": True})  # already on: answered, not logged
    assert again.json() == {"maintenance_mode": True}
    assert await changes(client) == [("raid", True, "mod#2", "api"), ("maintenance", True, admin_name, "api")]
    assert client.horde.modes.version == 2


# --- maintenance -------------------------------------------------------------------------------


async def test_maintenance_refuses_new_requests_on_both_faces_and_the_queue_drains(
    client: HordeClient, admin: tuple[str, str]
) -> None:
    _, boss = admin
    requester = await client.user("requester", kudos=1000)
    owner = await client.user("owner")
    worker = {"models": [MODEL], "max_length": 512, "max_context_length": 4096}
    assert (await client.pop(owner, "w-drain", **worker)).json()["id"] is None
    queued = await client.create(requester, models=[MODEL], params={"max_length": 32})
    assert queued.status_code == 202, queued.text
    request_id = queued.json()["id"]

    assert (await put(client, boss, {"maintenance_mode": True})).status_code == 200
    before = (
        await count(client, TextRequest),
        await count(client, KudosEvent),
        await client.balance("requester"),
    )
    for key in (requester, ANON):
        await refused(await client.create(key, models=[MODEL]), 400, "MaintenanceMode")
        await refused(await client.create(key, models=[MODEL], dry_run=True), 400, "MaintenanceMode")
    bearer = {"Authorization": f"Bearer {requester}"}
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", TEXT),
                       ("/v1/chat/completions", {**CHAT, "stream": True})):  # fmt: skip
        answer = await client.http.post(path, json=body, headers=bearer)
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "maintenance_mode", answer.text
        assert answer.json()["error"]["type"] == "service_unavailable"
        assert answer.headers["retry-after"] == "60"
    after = (
        await count(client, TextRequest),
        await count(client, KudosEvent),
        await client.balance("requester"),
    )
    assert after == before

    # What was queued is still served: the status answers, the worker pops and submits it.
    assert (await client.status(request_id)).status_code == 200
    job = await client.pop(owner, "w-drain", **worker)
    assert job.json()["id"], job.text
    assert (await client.submit(owner, job.json()["id"], "drained")).status_code == 200
    status = (await client.status(request_id)).json()
    assert (status["done"], status["generations"][0]["text"]) == (True, "drained")

    assert (await put(client, boss, {"maintenance_mode": False})).status_code == 200
    assert (await client.create(requester, models=[MODEL])).status_code == 202


# --- invite-only -------------------------------------------------------------------------------


async def test_invite_only_lets_new_workers_in_only_within_the_invitation(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    owner = await client.user("owner")
    newcomer = await client.user("newcomer", trusted=True)
    assert (await client.pop(owner, "w-old", models=[MODEL])).status_code == 200
    assert (await put(client, mod, {"invite_only_mode": True})).json() == {"invite_only_mode": True}

    assert (await client.pop(owner, "w-old", models=[MODEL])).status_code == 200  # it keeps working
    await refused(await client.pop(owner, "w-new", models=[MODEL]), 403, "WorkerInviteOnly")
    await refused(await client.pop(newcomer, "w-first", models=[MODEL]), 403, "WorkerInviteOnly")
    assert await count(client, Worker) == 1

    # A moderator invites two workers: the owner holds one, so one more may pop, not a third.
    owner_id = await user_id(client, owner)
    invited = await client.http.put(
        f"/api/v2/users/{owner_id}", json={"worker_invited": 2}, headers={"apikey": mod}
    )
    assert invited.status_code == 200, invited.text
    assert (await client.pop(owner, "w-new", models=[MODEL])).status_code == 200
    await refused(await client.pop(owner, "w-third", models=[MODEL]), 403, "WorkerInviteOnly")
    assert await count(client, Worker) == 2

    assert (await put(client, mod, {"invite_only_mode": False})).status_code == 200
    assert (await client.pop(owner, "w-third", models=[MODEL])).status_code == 200
    assert (await client.pop(newcomer, "w-first", models=[MODEL])).status_code == 200


# --- raid --------------------------------------------------------------------------------------


async def test_raid_mode_holds_back_untrusted_workers_and_open_registration(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    untrusted = await client.user("untrusted")
    trusted = await client.user("trusted", trusted=True)
    assert (await client.pop(untrusted, "w-before", models=[MODEL])).status_code == 200
    assert (await put(client, mod, {"raid_mode": True})).json() == {"raid_mode": True}
    assert "raid_mode" not in await shown(client)

    assert (await client.pop(untrusted, "w-before", models=[MODEL])).status_code == 200
    await refused(await client.pop(untrusted, "w-during", models=[MODEL]), 403, "NotTrusted")
    assert (await client.pop(trusted, "w-trusted", models=[MODEL])).status_code == 200
    assert (await client.pop(mod, "w-mod", models=[MODEL])).status_code == 200
    untrusted_id = await user_id(client, untrusted)
    invited = await client.http.put(
        f"/api/v2/users/{untrusted_id}", json={"worker_invited": 2}, headers={"apikey": mod}
    )
    assert invited.status_code == 200, invited.text
    assert (await client.pop(untrusted, "w-during", models=[MODEL])).status_code == 200

    # Open registration needs an invite code now; the refusal does not name the raid.
    users = await count(client, User)
    needed = await client.http.post("/api/v2/register", json={"username": "raider"})
    await refused(needed, 403, "InviteRequired")
    assert "raid" not in needed.json()["message"].lower()
    assert await count(client, User) == users
    code = (await client.http.post("/api/v2/invites", json={"uses": 1}, headers={"apikey": mod})).json()[
        "code"
    ]
    vouched = await client.http.post("/api/v2/register", json={"username": "vouched", "invite": code})
    assert vouched.status_code == 200, vouched.text

    assert (await put(client, mod, {"raid_mode": False})).status_code == 200
    assert (await client.http.post("/api/v2/register", json={"username": "later"})).status_code == 200
    assert (await client.pop(untrusted, "w-after", models=[MODEL])).status_code == 200


# --- reaching every process --------------------------------------------------------------------


async def test_a_switch_made_elsewhere_reaches_the_process_at_its_poll(
    client: HordeClient, db_url: str
) -> None:
    mod = await client.user("mod", moderator=True)
    engine = make_engine(db_url, null_pool=True)
    try:  # as `horde-lite modes set` writes it: to the database, not to this process
        after = await horde_modes.switch(engine, {"invite_only": True, "raid": True}, "operator", "cli")
    finally:
        await engine.dispose()
    assert (after.invite_only, after.raid, after.version) == (True, True, 1)
    assert (await shown(client, mod))["invite_only_mode"] is False  # not polled yet
    assert await horde_modes.apply(client.horde)  # the watcher's step
    assert await shown(client, mod) == {
        "maintenance_mode": False,
        "invite_only_mode": True,
        "raid_mode": True,
    }
    assert not await horde_modes.apply(client.horde)  # the same version: nothing to replace
    assert await changes(client) == [
        ("invite_only", True, "operator", "cli"),
        ("raid", True, "operator", "cli"),
    ]


async def test_the_watcher_applies_a_switch_within_reload_seconds(db_url: str) -> None:
    app = app_for(make_settings(db_url, policies={"reload_seconds": 0.05}), ManualClock())
    async with AsyncTestClient(app=app, timeout=30) as http:
        horde = app.state.horde
        engine = make_engine(db_url, null_pool=True)
        try:
            await horde_modes.switch(engine, {"maintenance": True}, "operator", "cli")
        finally:
            await engine.dispose()

        async def applied() -> None:
            # Nothing to wait on but the state the watcher's own poll replaces.
            while not horde.modes.maintenance:  # noqa: ASYNC110
                await asyncio.sleep(0.02)

        await asyncio.wait_for(applied(), timeout=5)
        answer = await http.post("/api/v2/generate/text/async", json={"prompt": "Hi"})
        assert answer.json()["rc"] == "MaintenanceMode", answer.text


# --- the CLI -----------------------------------------------------------------------------------


def test_the_cli_shows_switches_and_lists_the_modes(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_settings_at(db_url, tmp_path, monkeypatch)
    runner = CliRunner()

    def lines(*args: str) -> list[str]:
        result = runner.invoke(cli.cli, ["modes", *args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.stdout.splitlines()

    assert lines() == [
        "maintenance  off",
        "invite_only  off",
        "raid         off",
        "version 0 (never switched)",
    ]
    assert lines("set", "--maintenance", "--raid")[:4] == [
        "maintenance  on", "invite_only  off", "raid         on", "version 1"
    ]  # fmt: skip
    assert lines("set", "--no-raid")[2:4] == ["raid         off", "version 2"]
    assert lines("show") == ["maintenance  on", "invite_only  off", "raid         off", "version 2"]
    history = lines("history")
    assert [line.split(None, 2)[2] for line in history] == [
        "raid         off  by operator (cli)",
        "raid         on   by operator (cli)",
        "maintenance  on   by operator (cli)",
    ]
    nothing = runner.invoke(cli.cli, ["modes", "set"])
    assert nothing.exit_code == 2
    assert query(db_url, text("SELECT maintenance, invite_only, raid, version FROM horde_modes")) == [
        (True, False, False, 2)
    ]
