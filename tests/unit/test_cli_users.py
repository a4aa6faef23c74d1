"""`horde-lite users ...` (docs/reference/cli.md): negative kudos, the listing, a new key and
deletion (docs/decisions/0030-deleting-users.md), on SQLite and PostgreSQL. A new key and deletion
are checked through the real app over HTTP: the CLI runs in a thread (it has its own event loop)
against the same database the app serves."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from horde_sdk.ai_horde_api.apimodels import ListUsersDetailsResponse
from sqlalchemy import select, text

from horde_lite import cli
from horde_lite.accounts.users import new_api_key
from horde_lite.db.engine import make_engine, make_sessionmaker
from horde_lite.db.models import KudosEvent, SharedKey, User, Worker
from tests.support.cli import point_settings_at, query
from tests.support.horde import ANON, HordeClient


@pytest.fixture
def run(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Invoke a click command with the settings pointing at the test database."""
    point_settings_at(db_url, tmp_path, monkeypatch)

    def invoke(*args: str, stdin: str | None = None) -> Result:
        return CliRunner().invoke(cli.users, list(args), input=stdin, catch_exceptions=False)

    return invoke


def _key(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout.strip().splitlines()[-1]


def _balance(url: str, name: str) -> float:
    return query(url, select(User.kudos).where(User.username == name))[0][0]


# --- negative amounts -----------------------------------------------------------------------------


def test_kudos_takes_negative_amounts_as_they_are_written(run: Any, db_url: str) -> None:
    assert run("create", "bob", "--kudos", "100").exit_code == 0
    set_to = run("kudos", "bob", "-5000")
    assert set_to.exit_code == 0, set_to.output
    assert _balance(db_url, "bob") == -5000
    added = run("kudos", "bob", "-250.5", "--add")
    assert added.exit_code == 0, added.output
    assert _balance(db_url, "bob") == -5250.5
    option_first = run("kudos", "--add", "bob", "-0.5")
    assert option_first.exit_code == 0, option_first.output
    assert _balance(db_url, "bob") == -5251
    after_dashes = run("kudos", "bob", "--", "-5000")
    assert after_dashes.exit_code == 0, after_dashes.output
    assert "bob#1 now has -5000 kudos" in after_dashes.stdout
    assert _balance(db_url, "bob") == -5000
    user_id = query(db_url, select(User.id).where(User.username == "bob"))[0][0]
    events = query(db_url, select(KudosEvent.amount, KudosEvent.kind).where(KudosEvent.user_id == user_id))
    assert sorted(events) == sorted(
        [(100.0, "grant"), (-5100.0, "debit"), (-250.5, "debit"), (-0.5, "debit"), (251.0, "grant")]
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("bob", "nan"), "not a number"),
        (("bob", "-inf"), "not a number"),
        (("bob", "--addd", "5"), "not a number"),  # a mistyped option is not taken for an amount
        (("bob", "5", "--ad"), "unexpected extra argument"),
        (("bob",), "Missing argument"),
    ],
)
def test_kudos_refuses_what_is_not_an_amount(run: Any, db_url: str, args: tuple[str, ...], said: str) -> None:
    run("create", "bob", "--kudos", "7")
    result = run("kudos", *args)
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert _balance(db_url, "bob") == 7


def test_create_with_negative_kudos_is_a_debit(run: Any, db_url: str) -> None:
    assert run("create", "debtor", "--kudos", "-20").exit_code == 0
    user_id = query(db_url, select(User.id).where(User.username == "debtor"))[0][0]
    events = query(db_url, select(KudosEvent.amount, KudosEvent.kind).where(KudosEvent.user_id == user_id))
    assert events == [(-20.0, "debit")]


# --- users list -----------------------------------------------------------------------------------


def _add_worker(url: str, owner: str, worker_id: str, *, deleted: bool = False) -> None:
    async def go() -> None:
        engine = make_engine(url, null_pool=True)
        try:
            async with make_sessionmaker(engine)() as session, session.begin():
                owner_id = (await session.execute(select(User.id).where(User.username == owner))).scalar_one()
                session.add(
                    Worker(id=worker_id, name=f"w-{worker_id[:4]}", name_key=None if deleted else worker_id,
                           owner_id=owner_id, last_check_in=0.0, created_at=0.0, speed_samples=[],
                           deleted_at=1.0 if deleted else None)
                )  # fmt: skip
        finally:
            await engine.dispose()

    asyncio.run(go())


def test_list_shows_every_user_with_flags_workers_and_kudos(run: Any, db_url: str) -> None:
    run("create", "alice", "--kudos", "1234.5", "--trusted", "--moderator")
    run("create", "bob")
    _add_worker(db_url, "alice", "11111111-1111-4111-8111-111111111111")
    _add_worker(db_url, "alice", "22222222-2222-4222-8222-222222222222")
    _add_worker(db_url, "alice", "33333333-3333-4333-8333-333333333333", deleted=True)  # not counted

    listed = run("list", "--json")
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert [(r["name"], r["kudos"], r["trusted"], r["moderator"], r["workers"]) for r in rows] == [
        ("alice#1", 1234.5, True, True, 2),
        ("bob#2", 0.0, False, False, 0),
    ]
    assert all(r["anonymous"] is False and r["deleted"] is False for r in rows)
    assert all(isinstance(r["created_at"], float) for r in rows)

    table = run("list")
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["USER", "KUDOS", "TRUSTED", "MODERATOR", "WORKERS", "CREATED"]
    assert lines[1].split()[:5] == ["alice#1", "1,234.5", "yes", "yes", "2"]
    assert lines[2].split()[:5] == ["bob#2", "0", "no", "no", "0"]
    assert len(lines) == 3


def test_list_of_no_users(run: Any) -> None:
    listed = run("list")
    assert listed.exit_code == 0, listed.output
    assert listed.stdout.splitlines()[-1] == "(no users)"
    assert json.loads(run("list", "--json").stdout) == []


# --- a new key, through the real app ----------------------------------------------------------------


async def _me(client: HordeClient, key: str) -> Any:
    return await client.http.get("/api/v2/find_user", headers={"apikey": key})


async def test_rotate_key_ends_the_old_key_at_once(client: HordeClient, run: Any) -> None:
    old = _key(await asyncio.to_thread(run, "create", "bob", "--kudos", "50"))
    me = await _me(client, old)
    assert me.status_code == 200
    assert (await client.pop(old, "bob-worker", models=["m"])).status_code == 200

    rotated = await asyncio.to_thread(run, "rotate-key", "bob")
    new = _key(rotated)
    assert len(new) == 22
    assert new != old
    assert "bob#" in rotated.stdout

    for response in (await _me(client, old), await client.pop(old, "bob-worker", models=["m"])):
        assert response.status_code == 401, response.text
        assert response.json()["rc"] == "InvalidAPIKey"
    chat = await client.http.post(
        "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {old}"},
    )  # fmt: skip
    assert chat.status_code == 401, chat.text
    assert "error" in chat.json()

    again = await _me(client, new)
    assert again.status_code == 200
    assert (again.json()["id"], again.json()["kudos"]) == (me.json()["id"], 50)
    # The same worker goes on under the new key.
    assert (await client.pop(new, "bob-worker", models=["m"])).status_code == 200
    assert len((await _me(client, new)).json()["worker_ids"]) == 1


async def test_rotate_key_of_the_anonymous_user_is_refused(client: HordeClient, run: Any) -> None:
    assert (await _me(client, ANON)).status_code == 200  # its row exists from here on
    refused = await asyncio.to_thread(run, "rotate-key", "Anonymous")
    assert refused.exit_code == 1
    assert "0000000000" in refused.output
    assert (await _me(client, ANON)).status_code == 200


def test_rotate_key_of_nobody(run: Any) -> None:
    result = run("rotate-key", "nobody")
    assert result.exit_code == 1
    assert "No user named 'nobody'" in result.output


# --- deletion, through the real app -----------------------------------------------------------------


async def _rows(client: HordeClient, sql: str) -> list[Any]:
    async with client.horde.sessionmaker() as session:
        return list((await session.execute(text(sql))).all())


async def test_delete_user_waits_for_its_work_and_keeps_its_history(client: HordeClient, run: Any) -> None:
    owner = _key(await asyncio.to_thread(run, "create", "owner", "--kudos", "10"))
    requester = await client.user("requester", kudos=1000)
    owner_id = (await _me(client, owner)).json()["id"]
    shared = await client.http.post("/api/v2/sharedkeys", json={"name": "lend"}, headers={"apikey": owner})
    assert shared.status_code == 200, shared.text
    shared_key = shared.json()["id"]

    # The owner's worker holds a job of the requester's request: both deletions are refused.
    assert (await client.pop(owner, "Alpha", models=["m"])).status_code == 200
    worker_id = (await client.http.get("/api/v2/workers", params={"name": "Alpha"})).json()[0]["id"]
    request_id = (await client.create(requester, models=["m"])).json()["id"]
    job = (await client.pop(owner, "Alpha", models=["m"])).json()
    assert job["id"] is not None, job
    busy = await asyncio.to_thread(run, "delete", "owner", "--yes")
    assert busy.exit_code == 1
    assert "owner#" in busy.output
    assert "1 job running on its workers" in busy.output
    assert "nothing changed" in busy.output
    busy = await asyncio.to_thread(run, "delete", "requester", "--yes")
    assert busy.exit_code == 1
    assert "1 waiting request" in busy.output
    assert (await _me(client, owner)).status_code == 200  # nothing changed

    submitted = await client.submit(owner, job["id"], "hello there")
    assert submitted.status_code == 200, submitted.text
    reward = submitted.json()["reward"]
    totals = (await client.http.get("/api/v2/stats/text/totals")).json()
    events_sql = f"SELECT amount, kind, ref FROM kudos_events WHERE user_id = {owner_id} ORDER BY id"
    ledger = await _rows(client, events_sql)

    # Asked first; "no" (or no answer) changes nothing.
    declined = await asyncio.to_thread(run, "delete", "owner", stdin="n\n")
    assert declined.exit_code == 1
    assert (await _me(client, owner)).status_code == 200

    deleted = await asyncio.to_thread(run, "delete", "owner", stdin="y\n")
    assert deleted.exit_code == 0, deleted.output
    assert f"deleted owner#{owner_id}: 1 worker(s) deleted, 1 shared key(s) removed" in deleted.stdout

    # Nothing can act as the user any more: its key, its shared key, its worker.
    for key in (owner, shared_key):
        gone = await _me(client, key)
        assert gone.status_code == 401, gone.text
        assert gone.json()["rc"] == "InvalidAPIKey"
    assert (await client.http.get(f"/api/v2/workers/{worker_id}")).status_code == 404
    assert (await client.http.get(f"/api/v2/sharedkeys/{shared_key}")).status_code == 404
    assert (await asyncio.to_thread(run, "kudos", "owner", "5")).exit_code == 1
    # Its history stays: the finished request names its worker, its ledger and balance are as they
    # were, the horde's totals did not move, and GET /users still parses for horde-sdk.
    finished = (await client.status(request_id)).json()
    assert [g["worker_name"] for g in finished["generations"]] == ["Alpha"]
    assert await _rows(client, events_sql) == ledger
    row = await _rows(client, f"SELECT username, kudos, trusted, moderator FROM users WHERE id = {owner_id}")
    assert row == [(f"deleted#{owner_id}", pytest.approx(10 + reward), False, False)]
    assert (await client.http.get("/api/v2/stats/text/totals")).json() == totals
    ListUsersDetailsResponse.model_validate((await client.http.get("/api/v2/users")).json())

    # Its names are free: a new user "owner", a new worker "Alpha" (another id).
    again = _key(await asyncio.to_thread(run, "create", "owner"))
    assert (await _me(client, again)).json()["id"] != owner_id
    assert (await client.pop(again, "Alpha", models=["m"])).status_code == 200
    assert (await client.http.get("/api/v2/workers", params={"name": "Alpha"})).json()[0]["id"] != worker_id

    # The listing hides the deleted user unless asked.
    names = [r["name"] for r in json.loads((await asyncio.to_thread(run, "list", "--json")).stdout)]
    assert f"owner#{owner_id}" not in names
    assert f"deleted#{owner_id}#{owner_id}" not in names
    everyone = json.loads((await asyncio.to_thread(run, "list", "--json", "--deleted")).stdout)
    assert [r["deleted"] for r in everyone if r["id"] == owner_id] == [True]

    # The requester, its request done, can go too.
    assert (await asyncio.to_thread(run, "delete", "requester", "-y")).exit_code == 0


async def test_delete_user_refused_while_its_request_waits(client: HordeClient, run: Any) -> None:
    key = _key(await asyncio.to_thread(run, "create", "asker", "--kudos", "500"))
    request_id = (await client.create(key, models=["m"])).json()["id"]
    refused = await asyncio.to_thread(run, "delete", "asker", "-y")
    assert refused.exit_code == 1
    assert "1 waiting request" in refused.output
    assert (await client.cancel(request_id)).status_code == 200
    assert (await asyncio.to_thread(run, "delete", "asker", "-y")).exit_code == 0
    assert (await _me(client, key)).status_code == 401
    # The cancelled request is still there to read.
    assert (await client.status(request_id)).status_code == 200


async def test_the_anonymous_user_cannot_be_deleted(client: HordeClient, run: Any) -> None:
    assert (await client.create(ANON)).status_code == 202  # the anonymous row exists from here on
    for name in ("Anonymous", "Anonymous#0"):
        refused = await asyncio.to_thread(run, "delete", name, "-y")
        assert refused.exit_code == 1
        assert "The anonymous user cannot be deleted" in refused.output
    assert (await _me(client, ANON)).status_code == 200


def test_delete_nobody(run: Any, db_url: str) -> None:
    result = run("delete", "nobody", "-y")
    assert result.exit_code == 1
    assert "No user named 'nobody'" in result.output
    assert query(db_url, select(SharedKey.key_hash)) == []


def test_new_keys_never_start_with_a_dash() -> None:
    """A key is passed on command lines (`--apikey KEY`); one that starts with `-` is read there as
    an option. With a 1-in-64 chance per key, 2,000 keys would show the old behaviour almost surely."""
    keys = [new_api_key() for _ in range(2000)]
    assert all(len(key) == 22 and not key.startswith("-") for key in keys)
    assert len(set(keys)) == len(keys)
