"""Worker messages over the horde API, on SQLite and PostgreSQL (docs/reference/horde_api.md,
"Worker messages"): who may send what to which worker, the listing each caller sees, reading and
deleting one, a message reaching its worker's pops (idle, with a job, a first pop) until it expires,
the sweep deleting old expired ones, the dashboard's panel; hostile input refused with nothing
stored. And `horde-lite worker` logging each message once (SQLite: the worker is database-agnostic)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from horde_lite.settings import Settings
from tests.conftest import make_settings
from tests.support.horde import ANON, HordeClient
from tests.support.worker_rig import Rig, running, sqlite_rig, until

HOUR = 3600
MESSAGES = "/api/v2/workers/messages"


@pytest.fixture
def settings(db_url: str) -> Settings:
    return make_settings(db_url, messages={"max_active_per_user": 3, "keep_expired_days": 1})


async def _id(client: HordeClient, key: str) -> int:
    return int((await client.http.get("/api/v2/find_user", headers={"apikey": key})).json()["id"])


async def _worker(client: HordeClient, key: str, name: str) -> str:
    assert (await client.pop(key, name)).status_code == 200
    return str((await client.http.get(f"/api/v2/workers/name/{name}")).json()["id"])


async def _send(client: HordeClient, key: str, **body: Any) -> dict[str, Any]:
    sent = await client.http.post(MESSAGES, json=body, headers={"apikey": key})
    assert sent.status_code == 200, sent.text
    client.clock.advance(1)  # one message a second: the orders below are by time
    return dict(sent.json())


async def _listed(client: HordeClient, key: str, **query: Any) -> list[str]:
    found = await client.http.get(MESSAGES, params=query, headers={"apikey": key})
    assert found.status_code == 200, found.text
    return [m["id"] for m in found.json()]


async def _popped(client: HordeClient, key: str, name: str, **body: Any) -> list[dict[str, Any]]:
    popped = await client.pop(key, name, **body)
    assert popped.status_code == 200, popped.text
    return list(popped.json()["messages"])


async def _stored(client: HordeClient) -> int:
    async with client.horde.sessionmaker() as session:
        return int((await session.execute(text("SELECT count(*) FROM worker_messages"))).scalar_one())


def _epoch(rfc822: str) -> float:
    return parsedate_to_datetime(rfc822).timestamp()


async def test_messages_reach_their_workers_pops_until_they_expire(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    owner = await client.user("owner")
    other = await client.user("other")
    w1 = await _worker(client, owner, "w1")
    await _worker(client, other, "w2")
    assert await _popped(client, owner, "w1") == []  # no message: none read, an empty list shown

    to_w1 = await _send(client, mod, worker_id=w1, message="Please update.", origin="ops", expiry=2)
    assert to_w1["worker_id"] == w1
    assert (to_w1["origin"], to_w1["user_id"]) == ("ops", str(await _id(client, mod)))
    assert _epoch(to_w1["expiry"]) - _epoch(to_w1["created"]) == 2 * HOUR
    own = await _send(client, owner, worker_id=w1.upper(), message="note\n\tto self", origin="me, honest")
    assert (own["worker_id"], own["origin"], own["message"]) == (
        w1,
        str(await _id(client, owner)),
        "note\n\tto self",
    )
    assert _epoch(own["expiry"]) - _epoch(own["created"]) == 12 * HOUR  # upstream's default
    everyone = await _send(client, mod, message="The horde restarts at noon.")
    assert "worker_id" not in everyone
    assert everyone["origin"] == "Horde moderators"

    shown = await _popped(client, owner, "w1")  # an idle pop, answered before any transaction
    assert [m["id"] for m in shown] == [to_w1["id"], own["id"], everyone["id"]]
    assert shown[0] == {k: to_w1[k] for k in ("id", "message", "origin", "expiry")}
    assert [m["id"] for m in await _popped(client, other, "w2")] == [everyone["id"]]
    first = await _popped(client, owner, "w3")  # a first pop, which creates its worker
    assert [m["id"] for m in first] == [everyone["id"]]
    await client.create(ANON, params={"max_length": 16})
    job = (await client.pop(owner, "w1")).json()
    assert job["id"] is not None
    assert [m["id"] for m in job["messages"]] == [to_w1["id"], own["id"], everyone["id"]]

    client.clock.advance(2 * HOUR)
    assert [m["id"] for m in await _popped(client, owner, "w1")] == [own["id"], everyone["id"]]


async def test_who_lists_what(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    owner = await client.user("owner")
    other = await client.user("other")
    w1, w2 = await _worker(client, owner, "w1"), await _worker(client, other, "w2")
    m1 = (await _send(client, mod, worker_id=w1, message="one", expiry=1))["id"]
    m2 = (await _send(client, owner, worker_id=w1, message="two"))["id"]
    m3 = (await _send(client, other, worker_id=w2, message="three"))["id"]
    m4 = (await _send(client, mod, message="four"))["id"]
    client.clock.advance(HOUR)  # m1 has expired
    owner_id, other_id = await _id(client, owner), await _id(client, other)

    # A user: what it sent, what was sent to its workers, what was sent to every worker; newest first.
    assert await _listed(client, owner) == [m4, m2]
    assert await _listed(client, owner, validity="all") == [m4, m2, m1]
    assert await _listed(client, owner, validity="expired") == [m1]
    assert await _listed(client, owner, user_id=owner_id) == [m4, m2]
    assert await _listed(client, other) == [m4, m3]
    assert await _listed(client, ANON) == [m4]
    assert await _listed(client, mod, validity="all") == [m4, m3, m2, m1]
    assert await _listed(client, mod, user_id=owner_id, validity="all") == [m4, m2, m1]
    assert await _listed(client, mod, user_id=424242) == []
    assert await _listed(client, mod, worker_id=w1, validity="all") == [m2, m1]
    assert await _listed(client, mod, worker_id="not-a-worker") == []
    assert await _listed(client, mod, page=2) == []
    assert await _listed(client, mod, page=0) == [m4, m3, m2]
    assert await _listed(client, mod, page=10**6) == []

    shared = (await client.http.post("/api/v2/sharedkeys", json={}, headers={"apikey": owner})).json()["id"]
    for key, query, status, rc in (
        (owner, {"user_id": other_id}, 403, "Forbidden"),
        (owner, {"user_id": 0}, 403, "Forbidden"),
        (mod, {"validity": "soon"}, 400, "BadRequest"),
        (mod, {"user_id": -1}, 400, "BadRequest"),
        (mod, {"user_id": "abc"}, 400, "BadRequest"),
        (mod, {"user_id": 2**31}, 400, "BadRequest"),
        (mod, {"page": "x"}, 400, "BadRequest"),
        (mod, {"worker_id": "w" * 101}, 400, "BadRequest"),
        (shared, {}, 403, "WrongCredentials"),
        ("not-a-key-of-anyone-at", {}, 401, "InvalidAPIKey"),
    ):
        refused = await client.http.get(MESSAGES, params=query, headers={"apikey": key})
        assert (refused.status_code, refused.json()["rc"]) == (status, rc), (query, refused.text)


async def test_refused_messages_store_nothing(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    owner = await client.user("owner")
    other = await client.user("other")
    w1 = await _worker(client, owner, "w1")
    gone = await _worker(client, owner, "gone")
    assert (await client.http.delete(f"/api/v2/workers/{gone}", headers={"apikey": owner})).status_code == 200
    shared = (await client.http.post("/api/v2/sharedkeys", json={}, headers={"apikey": owner})).json()["id"]
    ok = {"worker_id": w1, "message": "hello"}
    for key, body, status, rc in (
        (ANON, ok, 403, "AnonForbidden"),
        (shared, ok, 403, "WrongCredentials"),
        (other, ok, 403, "MessagesOnlyOwnWorkers"),
        (owner, {"message": "to everyone"}, 403, "MessagesOnlyOwnWorkers"),
        (owner, {**ok, "worker_id": "00000000-0000-4000-8000-000000000000"}, 404, "WorkerNotFound"),
        (owner, {**ok, "worker_id": "w1"}, 404, "WorkerNotFound"),
        (owner, {**ok, "worker_id": gone}, 404, "WorkerNotFound"),
        (owner, {**ok, "worker_id": 5}, 400, "BadRequest"),
        (owner, {**ok, "worker_id": "x" * 101}, 400, "BadRequest"),
        (owner, {"worker_id": w1}, 400, "BadRequest"),
        (owner, {**ok, "message": ""}, 400, "BadRequest"),
        (owner, {**ok, "message": " \n\t "}, 400, "BadRequest"),
        (owner, {**ok, "message": "x" * 10_241}, 400, "BadRequest"),
        (owner, {**ok, "message": "ring \x07 ring"}, 400, "BadRequest"),
        (owner, {**ok, "message": "\x1b[31mred"}, 400, "BadRequest"),
        (owner, {**ok, "message": ["hello"]}, 400, "BadRequest"),
        (mod, {**ok, "origin": ""}, 400, "BadRequest"),
        (mod, {**ok, "origin": "   "}, 400, "BadRequest"),
        (mod, {**ok, "origin": "x" * 256}, 400, "BadRequest"),
        (mod, {**ok, "origin": "mods\x9b"}, 400, "BadRequest"),
        (mod, {**ok, "origin": "mods\x7f"}, 400, "BadRequest"),
        (mod, {**ok, "origin": "mods\n"}, 400, "BadRequest"),
        (mod, {**ok, "origin": "a\nb"}, 400, "BadRequest"),
        (owner, {**ok, "expiry": 0}, 400, "BadRequest"),
        (owner, {**ok, "expiry": -1}, 400, "BadRequest"),
        (owner, {**ok, "expiry": "12"}, 400, "BadRequest"),
        (owner, {**ok, "expiry": 1.5}, 400, "BadRequest"),
        (owner, {**ok, "expiry": 2**63}, 400, "BadRequest"),
        (owner, {**ok, "color": "red"}, 400, "BadRequest"),
    ):
        refused = await client.http.post(MESSAGES, json=body, headers={"apikey": key})
        assert (refused.status_code, refused.json()["rc"]) == (status, rc), (body, refused.text)
        assert refused.json()["message"]
    assert await _stored(client) == 0

    # The longest message, line breaks and tabs kept; a lifetime over 30 days is 30 days.
    longest = "x\n\t" * 3413 + "x"
    sent = await _send(client, owner, **{**ok, "message": longest, "expiry": 2**31 - 1})
    assert sent["message"] == longest
    assert _epoch(sent["expiry"]) - _epoch(sent["created"]) == 720 * HOUR
    # At most 3 unexpired messages per user (this module's setting); moderators are not counted.
    await _send(client, owner, **ok, expiry=1)
    await _send(client, owner, **ok)
    full = await client.http.post(MESSAGES, json=ok, headers={"apikey": owner})
    assert (full.status_code, full.json()["rc"]) == (403, "TooManyMessages"), full.text
    for _ in range(4):
        await _send(client, mod, **ok)
    client.clock.advance(HOUR)  # one expired: room for one more
    await _send(client, owner, **ok)
    assert await _stored(client) == 8


async def test_read_and_delete_one(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    owner = await client.user("owner")
    other = await client.user("other")
    w1 = await _worker(client, owner, "w1")
    sent = await _send(client, owner, worker_id=w1, message="mine")
    theirs = await _send(client, owner, worker_id=w1, message="a moderator removes it")

    for message_id in (sent["id"], sent["id"].upper()):
        shown = await client.http.get(f"{MESSAGES}/{message_id}")  # no key: public, as upstream
        assert shown.status_code == 200, shown.text
        assert shown.json() == sent
    for missing in ("00000000-0000-4000-8000-000000000000", "abc", "9" * 40):
        unknown = await client.http.get(f"{MESSAGES}/{missing}")
        assert (unknown.status_code, unknown.json()["rc"]) == (404, "WorkermessageNotFound"), unknown.text

    for key in (other, ANON):
        refused = await client.http.delete(f"{MESSAGES}/{sent['id']}", headers={"apikey": key})
        assert (refused.status_code, refused.json()["rc"]) == (403, "Forbidden"), refused.text
    assert (await client.http.get(f"{MESSAGES}/{sent['id']}")).status_code == 200
    deleted = await client.http.delete(f"{MESSAGES}/{sent['id']}", headers={"apikey": owner})
    assert deleted.json() == {"message": "OK"}, deleted.text
    assert (await client.http.get(f"{MESSAGES}/{sent['id']}")).status_code == 404
    again = await client.http.delete(f"{MESSAGES}/{sent['id']}", headers={"apikey": owner})
    assert again.json()["rc"] == "WorkermessageNotFound"
    by_mod = await client.http.delete(f"{MESSAGES}/{theirs['id']}", headers={"apikey": mod})
    assert by_mod.json() == {"message": "OK"}
    assert await _popped(client, owner, "w1") == []


async def test_the_sweep_deletes_messages_expired_for_longer_than_kept(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    short = (await _send(client, mod, message="an hour", expiry=1))["id"]
    long = (await _send(client, mod, message="two days", expiry=48))["id"]
    client.clock.advance(HOUR + 86400 - 10)  # `short` expired not quite a day ago (the day kept)
    await client.sweep()
    assert await _listed(client, mod, validity="all") == [long, short]
    client.clock.advance(60)
    await client.sweep()
    assert await _listed(client, mod, validity="all") == [long]


async def test_the_dashboards_messages_panel(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    owner = await client.user("owner")
    await _worker(client, owner, "w1")
    as_mod = {"apikey": mod}
    sent = await client.http.post(
        "/dashboard/messages",
        data={"worker": "W1", "message": "From the panel", "expiry": "3"},
        headers=as_mod,
    )
    assert sent.status_code == 200, sent.text
    assert "Sent to W1" in sent.text
    assert 'href="/dashboard#panel-messages"' in sent.text
    client.clock.advance(1)
    everyone = await client.http.post(
        "/dashboard/messages", data={"message": "To all", "origin": "ops"}, headers=as_mod
    )
    assert "Sent to every worker" in everyone.text
    popped = await _popped(client, owner, "w1")
    assert [(m["message"], m["origin"]) for m in popped] == [
        ("From the panel", "Horde moderators"),
        ("To all", "ops"),
    ]
    panel = await client.http.get("/dashboard/panels/messages", headers=as_mod)
    assert panel.status_code == 200
    assert "From the panel" in panel.text
    assert "every worker" in panel.text
    for form, status, said in (
        ({"worker": "nobody", "message": "x"}, 404, "nobody"),
        ({"worker": "w1"}, 400, "message"),
        ({"worker": "w1", "message": "x", "expiry": "soon"}, 400, "expiry"),
    ):
        refused = await client.http.post("/dashboard/messages", data=form, headers=as_mod)
        assert refused.status_code == status, (form, refused.text)
        assert said in refused.text, (form, refused.text)
    refused = await client.http.post("/dashboard/messages", data={"message": "x"}, headers={"apikey": owner})
    assert refused.status_code == 403
    first = popped[0]["id"]
    deleted = await client.http.post(f"/dashboard/messages/{first}/delete", headers=as_mod)
    assert deleted.status_code == 200, deleted.text
    assert [m["message"] for m in await _popped(client, owner, "w1")] == ["To all"]


# --- the worker process ---------------------------------------------------------------------------


@pytest.fixture
async def lite(tmp_path: Path, sqlite_template: Path) -> AsyncIterator[Rig]:
    async with sqlite_rig(tmp_path, sqlite_template) as r:
        yield r


@pytest.mark.slow
async def test_the_worker_logs_each_message_once(lite: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="horde_lite.worker")

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "message from" in r.getMessage()]

    # A message reaches a worker with its next pop's answer: a short wait keeps that pop near.
    async with running(lite.worker("reader", chat=False, wait_seconds=1)):
        await lite.online("reader")
        record = await lite.worker_record("reader")
        assert record is not None
        sent = await lite.http.post(
            MESSAGES, json={"worker_id": record["id"], "message": "line one\nline two"},
            headers={"apikey": lite.key},
        )  # fmt: skip
        assert sent.status_code == 200, sent.text
        await until(lambda: bool(said()))
        # A job's pop carries the message again: it is not logged again.
        created = await lite.http.post(
            "/api/v2/generate/text/async", json={"prompt": "Hi", "params": {"max_length": 16}},
            headers={"apikey": lite.key},
        )  # fmt: skip
        await lite.until_done(created.json()["id"])
    [line] = said()
    origin, expiry = sent.json()["origin"], sent.json()["expiry"]
    assert line == f"reader: message from {origin} (until {expiry}): line one\\nline two"
