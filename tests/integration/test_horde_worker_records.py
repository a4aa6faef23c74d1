"""Worker names, GET /workers?name=, /workers/name/{name}, PUT (info, rename, team) and DELETE
/workers/{id} (docs/reference/horde_api.md), with horde-sdk's own models parsing the answers."""

from __future__ import annotations

from typing import Any

from horde_sdk.ai_horde_api.apimodels import (
    AllWorkersDetailsResponse,
    DeleteWorkerResponse,
    ModifyWorkerResponse,
    SingleWorkerDetailsResponse,
)
from sqlalchemy import text

from tests.support.horde import ANON, HordeClient

MISSING = "00000000-0000-4000-8000-000000000000"


async def _id(client: HordeClient, name: str) -> str:
    listed = (await client.http.get("/api/v2/workers", params={"name": name})).json()
    assert len(listed) == 1, listed
    return listed[0]["id"]


async def _put(client: HordeClient, key: str, worker_id: str, **body: Any) -> Any:
    return await client.http.put(f"/api/v2/workers/{worker_id}", json=body, headers={"apikey": key})


async def _delete(client: HordeClient, key: str | None, worker_id: str) -> Any:
    headers = {"apikey": key} if key else {}
    return await client.http.delete(f"/api/v2/workers/{worker_id}", headers=headers)


async def test_names_differing_by_case_form_or_spacing_are_one_name(client: HordeClient) -> None:
    alice = await client.user("alice")
    bob = await client.user("bob")
    assert (await client.pop(alice, "Night Owl", models=["m"])).status_code == 200
    # Another owner: case, trailing and inner spaces, full-width letters are all the same name.
    for posing in ("night owl", "Night Owl  ", "  NIGHT   OWL", "\uff2eight Owl"):
        refused = await client.pop(bob, posing, models=["m"])
        assert refused.status_code == 403, posing
        assert refused.json()["rc"] == "WrongCredentials"
    # The owner's own pops under those spellings reach the same worker, shown as first named.
    assert (await client.pop(alice, " night  OWL ", models=["m2"])).status_code == 200
    async with client.horde.sessionmaker() as session:
        rows = (await session.execute(text("SELECT name, name_key, models FROM workers"))).all()
    assert len(rows) == 1
    assert rows[0][0] == "Night Owl"
    assert rows[0][1] == "night owl"


async def test_names_outside_the_safe_set_are_refused(client: HordeClient) -> None:
    alice = await client.user("alice")
    await client.pop(alice, "owl", models=["m"])
    bob = await client.user("bob")
    # Cyrillic U+043E posing as Latin 'o'; an emoji; a zero-width space; a lone '#'.
    for name in ("\u043ewl", "owl \U0001f989", "o\u200bwl", "w#1", "   "):
        refused = await client.pop(bob, name, models=["m"])
        assert refused.status_code == 400, (name, refused.text)
        assert refused.json()["rc"] == "BadRequest"
    for name in ("My Worker (4090) [v2]", "a-b_c.d'e"):
        assert (await client.pop(bob, name)).status_code == 200, name
    async with client.horde.sessionmaker() as session:
        assert (await session.execute(text("SELECT count(*) FROM workers"))).scalar_one() == 3


async def test_workers_list_by_name_and_type(client: HordeClient) -> None:
    key = await client.user("owner")
    await client.pop(key, "Alpha", models=["m"])
    await client.pop(key, "Beta", models=["m"])
    every = (await client.http.get("/api/v2/workers")).json()
    AllWorkersDetailsResponse.model_validate(every)
    assert [w["name"] for w in every] == ["Alpha", "Beta"]
    one = (await client.http.get("/api/v2/workers", params={"name": "ALPHA "})).json()
    assert [w["name"] for w in one] == ["Alpha"]
    assert (await client.http.get("/api/v2/workers", params={"name": "gamma"})).json() == []
    assert len((await client.http.get("/api/v2/workers", params={"type": "text"})).json()) == 2
    assert (await client.http.get("/api/v2/workers", params={"type": "image"})).json() == []


async def test_worker_by_name(client: HordeClient) -> None:
    key = await client.user("owner")
    await client.pop(key, "Alpha", models=["m"])
    found = await client.http.get("/api/v2/workers/name/alpha")
    assert found.status_code == 200, found.text
    parsed = SingleWorkerDetailsResponse.model_validate(found.json())
    assert parsed.name == "Alpha"
    assert found.json() == (await client.http.get(f"/api/v2/workers/{parsed.id_}")).json()
    client.clock.advance(3600)  # offline workers are still found by name (not listed)
    assert (await client.http.get("/api/v2/workers/name/Alpha")).json()["online"] is False
    missing = await client.http.get("/api/v2/workers/name/nobody")
    assert missing.status_code == 404
    assert missing.json()["rc"] == "WorkerNotFound"


async def test_put_info_and_rename(client: HordeClient) -> None:
    owner = await client.user("owner")
    other = await client.user("other")
    moderator = await client.user("mod", moderator=True)
    await client.pop(owner, "Alpha", models=["m"])
    await client.pop(other, "Taken", models=["m"])
    worker_id = await _id(client, "Alpha")

    changed = await _put(client, owner, worker_id, info="GPU: 4090, https://example.org", name="Alpha Two")
    assert changed.status_code == 200, changed.text
    assert changed.json() == {"info": "GPU: 4090, https://example.org", "name": "Alpha Two"}
    ModifyWorkerResponse.model_validate(changed.json())
    shown = (await client.http.get(f"/api/v2/workers/{worker_id}")).json()
    assert (shown["name"], shown["info"]) == ("Alpha Two", "GPU: 4090, https://example.org")
    # The old name is free; pops under the new one reach the same worker.
    assert (await client.pop(owner, "alpha two", models=["m"])).status_code == 200
    assert (await _id(client, "ALPHA TWO")) == worker_id

    # A case-only rename of its own name is allowed; another worker's name is not.
    assert (await _put(client, owner, worker_id, name="ALPHA two")).json() == {"name": "ALPHA two"}
    taken = await _put(client, owner, worker_id, name="taken ")
    assert taken.status_code == 400
    assert taken.json()["rc"] == "WorkerNameAlreadyExists"
    bad = await _put(client, owner, worker_id, name="\u0430lpha")  # Cyrillic U+0430
    assert bad.status_code == 400
    assert bad.json()["rc"] == "BadRequest"

    # Not the owner: refused, nothing changed; a moderator may.
    for body in ({"info": "mine"}, {"name": "Stolen"}, {"team": ""}):
        refused = await _put(client, other, worker_id, **body)
        assert refused.status_code == 403, body
        assert refused.json()["rc"] == "WrongCredentials"
    assert (await _put(client, moderator, worker_id, info="")).json() == {"info": ""}
    assert (await client.http.get(f"/api/v2/workers/{worker_id}")).json()["info"] is None

    # Teams: horde_lite has none; "" (no team) is upstream's answer, any team id is not found.
    assert (await _put(client, owner, worker_id, team="")).json() == {"team": "None"}
    no_team = await _put(client, owner, worker_id, team="0bed257b-e57c-4327-ac64-40cdfb1ac5e6")
    assert no_team.status_code == 404
    assert no_team.json()["rc"] == "TeamNotFound"
    nothing = await _put(client, owner, worker_id)
    assert nothing.status_code == 400
    assert nothing.json()["rc"] == "NoWorkerModSelected"
    long_info = await _put(client, owner, worker_id, info="x" * 1001)
    assert long_info.status_code == 400
    anon = await _put(client, ANON, worker_id, info="hi")
    assert anon.status_code == 403
    assert anon.json()["rc"] == "AnonForbiddenWorker"


async def test_delete_worker(client: HordeClient) -> None:
    owner = await client.user("owner")
    other = await client.user("other")
    moderator = await client.user("mod", moderator=True)
    requester = await client.user("requester", kudos=1000)
    await client.pop(owner, "Alpha", models=["m"])
    worker_id = await _id(client, "Alpha")
    # It finishes a job and holds another one's lease when deleted.
    done_request = (await client.create(requester, models=["m"])).json()["id"]
    job = (await client.pop(owner, "Alpha", models=["m"])).json()
    assert (await client.submit(owner, job["id"], "hello there")).status_code == 200
    running_request = (await client.create(requester, models=["m"])).json()["id"]
    running = (await client.pop(owner, "Alpha", models=["m"])).json()
    assert running["id"] is not None

    for key, rc in (
        (other, "WrongCredentials"),
        (ANON, "AnonForbiddenWorker"),
        (None, "AnonForbiddenWorker"),
    ):
        refused = await _delete(client, key, worker_id)
        assert refused.status_code == 403, key
        assert refused.json()["rc"] == rc
    assert (await client.http.get(f"/api/v2/workers/{worker_id}")).status_code == 200

    deleted = await _delete(client, owner, worker_id)
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"deleted_id": worker_id, "deleted_name": "Alpha"}
    DeleteWorkerResponse.model_validate(deleted.json())
    assert (await client.http.get(f"/api/v2/workers/{worker_id}")).status_code == 404
    assert (await client.http.get("/api/v2/workers/name/Alpha")).status_code == 404
    assert (await client.http.get("/api/v2/workers")).json() == []
    # Offline at once for every reader: it serves no model any more.
    served = (await client.http.get("/api/v2/status/models")).json()
    assert [m["name"] for m in served if m["count"]] == []
    assert (await _delete(client, moderator, worker_id)).status_code == 404
    assert (await _put(client, owner, worker_id, info="x")).status_code == 404

    # Its history stays: the finished request still names it; its held job may still be submitted.
    finished = (await client.status(done_request)).json()
    assert [g["worker_name"] for g in finished["generations"]] == ["Alpha"]
    assert (await client.submit(owner, running["id"], "late but fine")).status_code == 200
    assert (await client.status(running_request)).json()["done"] is True
    # The name is free: a new worker (of anyone) takes it with a new id.
    assert (await client.pop(other, "alpha", models=["m"])).status_code == 200
    assert (await _id(client, "Alpha")) != worker_id

    # A moderator may delete anyone's worker.
    second = await _id(client, "alpha")
    assert (await _delete(client, moderator, second)).status_code == 200
    assert (await _delete(client, moderator, MISSING)).status_code == 404
    assert (await _delete(client, moderator, "x" * 500)).json()["rc"] == "WorkerNotFound"
