"""Teams (docs/reference/teams.md) on SQLite and PostgreSQL, through HTTP: create, list, show, change
and delete in upstream's shapes, who may do what, names compared like worker names, the per-user
limit (also under concurrent creations), workers joining and leaving (horde-sdk's worker models,
the only team shapes it has, parse those answers), a deleted team or worker leaving no reference
behind, and the stats after real jobs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import schemathesis
from horde_sdk.ai_horde_api.apimodels import (
    AllWorkersDetailsResponse,
    ModifyWorkerResponse,
    SingleWorkerDetailsResponse,
    TeamDetailsLite,
)
from litestar.testing import AsyncTestClient
from sqlalchemy import text

from horde_lite.clock import ManualClock
from tests.conftest import make_settings
from tests.integration.test_horde_jobs import concurrently
from tests.support.apps import app_for
from tests.support.horde import ANON, HordeClient

MISSING = "00000000-0000-4000-8000-000000000000"


async def _create(client: HordeClient, key: str | None, **body: Any) -> Any:
    headers = {"apikey": key} if key is not None else {}
    return await client.http.post("/api/v2/teams", json=body, headers=headers)


async def _patch(client: HordeClient, key: str, team_id: str, **body: Any) -> Any:
    return await client.http.patch(f"/api/v2/teams/{team_id}", json=body, headers={"apikey": key})


async def _delete(client: HordeClient, key: str, team_id: str) -> Any:
    return await client.http.delete(f"/api/v2/teams/{team_id}", headers={"apikey": key})


async def _show(client: HordeClient, team_id: str) -> dict[str, Any]:
    shown = await client.http.get(f"/api/v2/teams/{team_id}")
    assert shown.status_code == 200, shown.text
    TeamDetailsLite.model_validate(shown.json())  # name and id, as horde-sdk reads them
    return shown.json()


async def _join(client: HordeClient, key: str, worker_id: str, team: str) -> Any:
    return await client.http.put(f"/api/v2/workers/{worker_id}", json={"team": team}, headers={"apikey": key})


async def _worker_id(client: HordeClient, key: str, name: str) -> str:
    assert (await client.pop(key, name, models=["m"])).status_code == 200
    listed = (await client.http.get("/api/v2/workers", params={"name": name})).json()
    return listed[0]["id"]


async def _rows(client: HordeClient, sql: str, **params: Any) -> list[Any]:
    async with client.horde.sessionmaker() as session:
        return list((await session.execute(text(sql), params)).all())


async def _user_id(client: HordeClient, key: str) -> int:
    return (await client.http.get("/api/v2/find_user", headers={"apikey": key})).json()["id"]


async def test_create_list_show_change_delete(client: HordeClient) -> None:
    alice = await client.user("alice", trusted=True)
    assert (await client.http.get("/api/v2/teams")).json() == []

    created = await _create(client, alice, name="  Night   Owls ", info="We run 7B models.")
    assert created.status_code == 200, created.text
    team = created.json()
    assert team["name"] == "Night Owls"  # trimmed, inner spaces as one, as worker names
    assert team["info"] == "We run 7B models."
    team_id = team["id"]

    shown = await _show(client, team_id)
    assert shown == {
        "name": "Night Owls", "id": team_id, "info": "We run 7B models.",
        "creator": f"alice#{await _user_id(client, alice)}", "worker_count": 0, "workers": [],
        "models": [], "contributions": 0, "requests_fulfilled": 0, "kudos": 0.0, "uptime": 0,
        "performance": 0.0, "total_speed": 0.0,
    }  # fmt: skip
    listed = await client.http.get("/api/v2/teams")
    assert listed.status_code == 200
    assert listed.json() == [shown]

    changed = await _patch(client, alice, team_id, name="Early Birds", info="")
    assert changed.status_code == 200, changed.text
    assert changed.json() == {"id": team_id, "name": "Early Birds", "info": None}
    assert ((await _show(client, team_id))["name"], (await _show(client, team_id))["info"]) == (
        "Early Birds",
        None,
    )
    # The old name is free again.
    assert (await _create(client, alice, name="night owls")).status_code == 200

    deleted = await _delete(client, alice, team_id)
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"deleted_id": team_id, "deleted_name": "Early Birds"}
    gone = await client.http.get(f"/api/v2/teams/{team_id}")
    assert gone.status_code == 404
    assert gone.json()["rc"] == "TeamNotFound"
    assert [t["name"] for t in (await client.http.get("/api/v2/teams")).json()] == ["night owls"]
    again = await _delete(client, alice, team_id)
    assert (again.status_code, again.json()["rc"]) == (404, "TeamNotFound")


async def test_who_may_create_change_and_delete(client: HordeClient) -> None:
    creator = await client.user("creator", trusted=True)
    untrusted = await client.user("untrusted", kudos=100)
    other = await client.user("other", trusted=True)
    moderator = await client.user("mod", moderator=True)  # not trusted: a moderator may all the same

    for key, status, rc in (
        (ANON, 403, "AnonForbidden"),
        (None, 403, "AnonForbidden"),
        (untrusted, 403, "UntrustedTeamCreation"),
        ("not-a-key-at-all-xyzw", 401, "InvalidAPIKey"),
    ):
        refused = await _create(client, key, name="Refused Team")
        assert (refused.status_code, refused.json()["rc"]) == (status, rc), key
    shared = await client.http.post("/api/v2/sharedkeys", json={"kudos": 10}, headers={"apikey": untrusted})
    via_shared = await _create(client, shared.json()["id"], name="Refused Team")
    assert (via_shared.status_code, via_shared.json()["rc"]) == (403, "WrongCredentials")
    assert await _rows(client, "SELECT count(*) FROM teams") == [(0,)]

    team_id = (await _create(client, creator, name="Owls", info="first")).json()["id"]
    assert (await _create(client, moderator, name="Mods Team")).status_code == 200

    # Not the creator: upstream's codes (NotOwner for the info, NotModerator for the name and a
    # deletion), nothing changed.
    for key in (other, untrusted, ANON):
        for body, rc in (({"info": "mine"}, "NotOwner"), ({"name": "Stolen"}, "NotModerator")):
            refused = await _patch(client, key, team_id, **body)
            assert (refused.status_code, refused.json()["rc"]) == (403, rc), (key, body)
        refused = await _delete(client, key, team_id)
        assert (refused.status_code, refused.json()["rc"]) == (403, "NotModerator")
    shown = await _show(client, team_id)
    assert (shown["name"], shown["info"]) == ("Owls", "first")

    # A moderator may change and delete any team.
    assert (await _patch(client, moderator, team_id, info="moderated")).json()["info"] == "moderated"
    assert (await _delete(client, moderator, team_id)).status_code == 200
    assert (await client.http.get(f"/api/v2/teams/{team_id}")).status_code == 404


async def test_names_are_compared_like_worker_names(client: HordeClient) -> None:
    alice = await client.user("alice", trusted=True)
    bob = await client.user("bob", trusted=True)
    owls = (await _create(client, alice, name="Night Owls")).json()["id"]
    # Case, spacing and full-width forms are the same name: refused by name, nothing stored.
    for posing in ("night owls", "  NIGHT   OWLS ", "\uff2eight Owls"):
        refused = await _create(client, bob, name=posing)
        assert (refused.status_code, refused.json()["rc"]) == (400, "TeamNameAlreadyExists"), posing
    larks = (await _create(client, bob, name="Larks")).json()["id"]
    taken = await _patch(client, bob, larks, name="NIGHT owls")
    assert (taken.status_code, taken.json()["rc"]) == (400, "TeamNameAlreadyExists")
    # Its own name in another case is a rename.
    assert (await _patch(client, alice, owls, name="NIGHT OWLS")).json()["name"] == "NIGHT OWLS"

    # Outside the name rule: a Cyrillic homoglyph, an emoji, a zero-width space, '#', too short
    # (upstream's 3) or only spaces, too long; NUL, refused before anything is read.
    for name in ("L\u0430rks2", "Owls \U0001f989", "Ow\u200bls", "Owls#1", "ab", " ab   ", "     "):
        refused = await _create(client, alice, name=name)
        assert (refused.status_code, refused.json()["rc"]) == (400, "BadRequest"), name
        renamed = await _patch(client, alice, owls, name=name)
        assert (renamed.status_code, renamed.json()["rc"]) == (400, "BadRequest"), name
    for body in ({"name": "x" * 101}, {"name": "Owls\u0000"}, {"name": "Owls", "info": "i" * 1001}, {}):
        refused = await _create(client, alice, **body)
        assert refused.status_code == 400, body
        assert refused.json()["rc"] == "BadRequest"
    for body, rc in (({"info": "i" * 1001}, "BadRequest"), ({}, "NoTeamModSelected")):
        refused = await _patch(client, alice, owls, **body)
        assert (refused.status_code, refused.json()["rc"]) == (400, rc), body
    names = await _rows(client, "SELECT name, name_key FROM teams ORDER BY name_key")
    assert names == [("Larks", "larks"), ("NIGHT OWLS", "night owls")]

    # Ids that are no team's: unknown, too long, not an id.
    for team_id in (MISSING, "x" * 500, "not-an-id", "%20"):
        for answer in (
            await client.http.get(f"/api/v2/teams/{team_id}"),
            await _patch(client, alice, team_id, info="x"),
            await _delete(client, alice, team_id),
        ):
            assert (answer.status_code, answer.json()["rc"]) == (404, "TeamNotFound"), team_id


@pytest.fixture
async def limited(db_url: str, clock: ManualClock) -> AsyncIterator[HordeClient]:
    """The horde with `[teams] max_per_user` 2."""
    app = app_for(make_settings(db_url, teams={"max_per_user": 2}), clock)
    async with AsyncTestClient(app=app, timeout=30) as http:
        yield HordeClient(http, app.state.horde)


async def test_teams_per_user_at_the_limit_and_under_concurrent_creations(limited: HordeClient) -> None:
    client = limited
    alice = await client.user("alice", trusted=True)
    first = (await _create(client, alice, name="Team One")).json()["id"]
    assert (await _create(client, alice, name="Team Two")).status_code == 200
    over = await _create(client, alice, name="Team Three")
    assert (over.status_code, over.json()["rc"]) == (403, "TooManyTeams")
    assert (await _delete(client, alice, first)).status_code == 200
    assert (await _create(client, alice, name="Team Three")).status_code == 200
    assert await _rows(client, "SELECT count(*) FROM teams") == [(2,)]

    # Five creations of one user at once: exactly two fit.
    bob = await client.user("bob", trusted=True)
    calls = [(bob, {"name": f"Bob Team {i}"}) for i in range(5)]
    answers = await concurrently(client, "/api/v2/teams", calls, allowed=("TooManyTeams",))
    assert sum(1 for a in answers if a.get("rc") == "TooManyTeams") == 3
    bob_id = await _user_id(client, bob)
    assert await _rows(client, "SELECT count(*) FROM teams WHERE owner_id = :o", o=bob_id) == [(2,)]
    # One name wanted by several users at once: one team, the others refused by name.
    keys = [await client.user(f"user{i}", trusted=True) for i in range(4)]
    same = [(key, {"name": "Wanted"}) for key in keys]
    answers = await concurrently(client, "/api/v2/teams", same, allowed=("TeamNameAlreadyExists",))
    assert sum(1 for a in answers if "id" in a) == 1
    assert await _rows(client, "SELECT count(*) FROM teams WHERE name_key = 'wanted'") == [(1,)]


async def test_a_worker_joins_and_leaves_a_team(client: HordeClient) -> None:
    creator = await client.user("creator", trusted=True)
    owner = await client.user("owner")
    other = await client.user("other")
    moderator = await client.user("mod", moderator=True)
    team_id = (await _create(client, creator, name="Owls")).json()["id"]
    worker_id = await _worker_id(client, owner, "Hoot")

    shown = (await client.http.get(f"/api/v2/workers/{worker_id}")).json()
    assert shown["team"] == {"name": None, "id": None}
    SingleWorkerDetailsResponse.model_validate(shown)

    # Another user (even the team's creator) cannot move someone's worker; nothing changes.
    for key, rc in (
        (other, "WrongCredentials"),
        (creator, "WrongCredentials"),
        (ANON, "AnonForbiddenWorker"),
    ):
        refused = await _join(client, key, worker_id, team_id)
        assert (refused.status_code, refused.json()["rc"]) == (403, rc)
    for missing, status in ((MISSING, 404), ("no-such-team", 404), ("x" * 37, 400)):
        refused = await _join(client, owner, worker_id, missing)
        assert refused.status_code == status, missing
        assert refused.json()["rc"] == ("TeamNotFound" if status == 404 else "BadRequest")
    assert await _rows(client, "SELECT team_id FROM workers") == [(None,)]

    joined = await _join(client, owner, worker_id, team_id)
    assert joined.status_code == 200, joined.text
    assert joined.json() == {"team": "Owls"}  # upstream's answer: the team's name
    ModifyWorkerResponse.model_validate(joined.json())
    assert (await _join(client, owner, worker_id, team_id)).json() == {"team": "Owls"}  # again: no change
    shown = (await client.http.get(f"/api/v2/workers/{worker_id}")).json()
    assert shown["team"] == {"name": "Owls", "id": team_id}
    SingleWorkerDetailsResponse.model_validate(shown)
    listed = (await client.http.get("/api/v2/workers", params={"name": "hoot"})).json()
    assert listed[0]["team"] == {"name": "Owls", "id": team_id}
    assert AllWorkersDetailsResponse.model_validate(listed).root[0].team == TeamDetailsLite(
        name="Owls", id=team_id
    )
    assert (await client.http.get("/api/v2/workers/name/Hoot")).json()["team"]["id"] == team_id
    team = await _show(client, team_id)
    assert team["worker_count"] == 1
    assert team["workers"] == [{"type": "text", "name": "Hoot", "id": worker_id, "online": True}]
    assert team["models"] == [{"name": "m", "count": 1}]

    # "" leaves (upstream's answer "None"); a moderator may set it too.
    assert (await _join(client, owner, worker_id, "")).json() == {"team": "None"}
    assert (await client.http.get(f"/api/v2/workers/{worker_id}")).json()["team"] == {
        "name": None,
        "id": None,
    }
    assert (await _show(client, team_id))["worker_count"] == 0
    assert (await _join(client, moderator, worker_id, team_id)).json() == {"team": "Owls"}
    assert (await _show(client, team_id))["worker_count"] == 1


async def test_a_deleted_team_or_worker_leaves_no_reference(client: HordeClient) -> None:
    creator = await client.user("creator", trusted=True)
    owner = await client.user("owner")
    team_id = (await _create(client, creator, name="Owls")).json()["id"]
    hoot = await _worker_id(client, owner, "Hoot")
    screech = await _worker_id(client, owner, "Screech")
    for worker_id in (hoot, screech):
        assert (await _join(client, owner, worker_id, team_id)).status_code == 200
    assert (await _show(client, team_id))["worker_count"] == 2

    # A deleted worker leaves its team.
    assert (
        await client.http.delete(f"/api/v2/workers/{screech}", headers={"apikey": owner})
    ).status_code == 200
    assert [w["id"] for w in (await _show(client, team_id))["workers"]] == [hoot]
    assert await _rows(client, "SELECT team_id FROM workers WHERE id = :w", w=screech) == [(None,)]

    # A deleted team's workers leave it; its id is then no team's.
    assert (await _delete(client, creator, team_id)).status_code == 200
    assert await _rows(client, "SELECT count(*) FROM workers WHERE team_id IS NOT NULL") == [(0,)]
    assert (await client.http.get(f"/api/v2/workers/{hoot}")).json()["team"] == {"name": None, "id": None}
    refused = await _join(client, owner, hoot, team_id)
    assert (refused.status_code, refused.json()["rc"]) == (404, "TeamNotFound")
    # The worker keeps working.
    assert (await client.pop(owner, "Hoot", models=["m"])).status_code == 200


async def test_stats_are_the_team_workers_own(client: HordeClient) -> None:
    creator = await client.user("creator", trusted=True)
    owner = await client.user("owner")
    second = await client.user("second")
    requester = await client.user("requester", kudos=10_000)
    team_id = (await _create(client, creator, name="Owls")).json()["id"]
    hoot = await _worker_id(client, owner, "Hoot")
    screech = await _worker_id(client, second, "Screech")
    outsider = await _worker_id(client, second, "Outsider")
    assert (await _join(client, owner, hoot, team_id)).status_code == 200
    assert (await _join(client, second, screech, team_id)).status_code == 200
    await client.set_worker_speed("Screech", 30.0)

    for key, name, text_out in (
        (owner, "Hoot", "one two three"),
        (second, "Screech", "four five six seven"),
        (second, "Outsider", "not counted"),
        (owner, "Hoot", "eight"),
    ):
        assert (await client.create(requester, models=["m"], params={"max_length": 32})).status_code == 202
        job = (await client.pop(key, name, models=["m"])).json()
        assert job["id"] is not None
        client.clock.advance(5)
        assert (await client.submit(key, job["id"], text_out)).status_code == 200

    records = [(await client.http.get(f"/api/v2/workers/{w}")).json() for w in (hoot, screech)]
    team = await _show(client, team_id)
    assert team["requests_fulfilled"] == 3 == sum(r["requests_fulfilled"] for r in records)
    assert team["contributions"] == sum(r["tokens_generated"] for r in records) > 0
    assert team["kudos"] == pytest.approx(sum(r["kudos_rewards"] for r in records), abs=0.02)
    assert team["kudos"] > 0
    assert team["uptime"] == sum(r["uptime"] for r in records) > 0
    # Both online: the assumed 10 tokens/s and the measured 30 (the submits measured Hoot anew).
    speeds = [r["lease_speed"] or r["assumed_speed"] for r in records]
    assert team["total_speed"] == pytest.approx(sum(speeds), abs=0.1)
    assert team["performance"] == pytest.approx(sum(speeds) / 2, abs=0.1)
    assert team["models"] == [{"name": "m", "count": 2}]
    outside = (await client.http.get(f"/api/v2/workers/{outsider}")).json()
    assert outside["requests_fulfilled"] == 1  # done, and not the team's

    # A worker that leaves takes its figures along.
    assert (await _join(client, second, screech, "")).status_code == 200
    after = await _show(client, team_id)
    assert after["requests_fulfilled"] == records[0]["requests_fulfilled"] == 2
    assert after["contributions"] == records[0]["tokens_generated"]


@pytest.mark.slow
async def test_answers_validate_against_the_schema(client: HordeClient) -> None:
    schema = schemathesis.openapi.from_dict((await client.http.get("/api/swagger.json")).json())
    creator = await client.user("creator", trusted=True)
    owner = await client.user("owner")

    def valid(path: str, method: str, answer: Any) -> None:
        schema[path][method].validate_response(answer)

    created = await _create(client, creator, name="Owls", info="hoot")
    valid("/api/v2/teams", "POST", created)
    team_id = created.json()["id"]
    worker_id = await _worker_id(client, owner, "Hoot")
    valid("/api/v2/workers/{worker_id}", "PUT", await _join(client, owner, worker_id, team_id))
    valid("/api/v2/workers/{worker_id}", "GET", await client.http.get(f"/api/v2/workers/{worker_id}"))
    valid("/api/v2/teams", "GET", await client.http.get("/api/v2/teams"))
    valid("/api/v2/teams/{team_id}", "GET", await client.http.get(f"/api/v2/teams/{team_id}"))
    valid("/api/v2/teams/{team_id}", "PATCH", await _patch(client, creator, team_id, info=""))
    valid("/api/v2/teams/{team_id}", "PATCH", await _patch(client, owner, team_id, name="Mine"))
    valid("/api/v2/teams/{team_id}", "DELETE", await _delete(client, creator, team_id))
    valid("/api/v2/teams/{team_id}", "GET", await client.http.get(f"/api/v2/teams/{team_id}"))
