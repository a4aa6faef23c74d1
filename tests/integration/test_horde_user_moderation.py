"""Moderating users over the horde API (docs/reference/accounts.md, "Moderating users"): POST /users,
every field of PUT /users/{id} honoured or refused by name, DELETE /users/{id} and POST /kudos/award,
with who may do what, hostile values and ids, and nothing changed by a refusal; horde-sdk's own
models parse the answers it has models for."""

from __future__ import annotations

from typing import Any

import pytest
from horde_sdk.ai_horde_api.apimodels import ModifyUserResponse, UserDetailsResponse
from sqlalchemy import text

from horde_lite.accounts.profiles import REFUSED_FIELDS
from horde_lite.settings import Settings
from tests.conftest import make_settings
from tests.integration.test_horde_user_records import _ledger_matches_balances
from tests.support.horde import ANON, HordeClient


@pytest.fixture
def settings(db_url: str) -> Settings:
    """The per-user worker limit on, as by default (the suite's defaults turn it off)."""
    return make_settings(db_url, worker={"max_per_user": 3, "max_per_trusted_user": 20})


HOSTILE_IDS = ("-1", "1e9", "abc", "1.0", "9" * 40, "\u0661", "%20")


async def _me(client: HordeClient, key: str) -> dict[str, Any]:
    found = await client.http.get("/api/v2/find_user", headers={"apikey": key})
    assert found.status_code == 200, found.text
    return dict(found.json())


async def _shown(client: HordeClient, user_id: int, key: str | None = None) -> dict[str, Any]:
    headers = {"apikey": key} if key else {}
    found = await client.http.get(f"/api/v2/users/{user_id}", headers=headers)
    assert found.status_code == 200, found.text
    UserDetailsResponse.model_validate(found.json())
    return dict(found.json())


async def _state(client: HordeClient) -> tuple[Any, ...]:
    """Everything a refused action must leave as it was."""
    async with client.horde.sessionmaker() as session:
        row = await session.execute(
            text(
                "SELECT (SELECT count(*) FROM users), (SELECT count(*) FROM kudos_events), "
                "(SELECT coalesce(sum(kudos), 0) FROM users), (SELECT count(*) FROM shared_keys), "
                "(SELECT count(*) FROM workers WHERE deleted_at IS NULL)"
            )
        )
        users = await session.execute(
            text(
                "SELECT id, username, api_key_hash, trusted, moderator, contact, admin_comment, "
                "public_workers, worker_invited FROM users ORDER BY id"
            )
        )
        return (*row.one(), tuple(users.all()))


def _refused(answer: Any, status: int, rc: str, *named: str) -> None:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert body["rc"] == rc, body
    for name in named:
        assert name in body["message"], (name, body)


# --- POST /users -------------------------------------------------------------------------------------


async def test_a_moderator_creates_a_user_whose_key_works(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    made = await client.http.post(
        "/api/v2/users", json={"username": "newbie", "kudos": 25, "trusted": True}, headers={"apikey": mod}
    )
    assert made.status_code == 200, made.text
    body = made.json()
    assert set(body) == {"id", "username", "api_key"}
    assert body["username"] == f"newbie#{body['id']}"
    assert len(body["api_key"]) == 22
    me = await _me(client, body["api_key"])
    assert (me["id"], me["kudos"], me["trusted"], me["moderator"]) == (body["id"], 25, True, False)
    assert me["kudos_details"]["admin"] == 25  # the starting balance is a grant in the ledger
    async with client.horde.sessionmaker() as session:
        dump = repr((await session.execute(text("SELECT * FROM users"))).all())
    assert body["api_key"] not in dump  # only its hash is kept
    await _ledger_matches_balances(client)


async def test_only_a_moderator_creates_users(client: HordeClient) -> None:
    bob = await client.user("bob")
    mod = await client.user("mod", moderator=True)
    shared = (await client.http.post("/api/v2/sharedkeys", json={}, headers={"apikey": mod})).json()["id"]
    before = await _state(client)
    for key, status, rc in (
        (bob, 403, "NotModerator"),
        (ANON, 403, "NotModerator"),
        ("x" * 22, 401, "InvalidAPIKey"),
        (shared, 403, "WrongCredentials"),  # a moderator's shared key is not the moderator
    ):
        answer = await client.http.post("/api/v2/users", json={"username": "sneaky"}, headers={"apikey": key})
        _refused(answer, status, rc)
    assert (await client.http.post("/api/v2/users", json={"username": "sneaky"})).status_code == 403
    assert await _state(client) == before


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("", "username"),
        ("   ", "1 to 100"),
        ("a" * 101, "username"),
        ("a" * 10_000, "username"),
        ("bob", "already exists"),
        ("BOB", "already exists"),  # ASCII names compare without case
        ("\uff42\uff4f\uff42", "already exists"),  # fullwidth "bob" folds to "bob"
        ("bo\u200bb", "format"),  # a zero-width space would pass for "bob"
        ("bob\u202e", "format"),  # a bidi override
        ("x\x07y", "control"),
        ("Anonymous", "reserved"),
        ("aNoNyMoUs", "reserved"),
        ("eve#1", "reserved"),
        ("deleted#3", "reserved"),
        (None, "username"),
        (12, "username"),
    ],
)
async def test_a_new_users_name_is_checked(client: HordeClient, name: object, why: str) -> None:
    await client.user("bob")
    mod = await client.user("mod", moderator=True)
    before = await _state(client)
    answer = await client.http.post("/api/v2/users", json={"username": name}, headers={"apikey": mod})
    _refused(answer, 400, "BadRequest", why)
    assert await _state(client) == before


async def test_a_new_users_body_is_checked(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    before = await _state(client)
    for body, named in (
        ({}, "username"),
        ({"username": "ok", "kudos": -1}, "kudos"),
        ({"username": "ok", "kudos": 1e308}, "kudos"),
        ({"username": "ok", "kudos": 2**62}, "kudos"),
        ({"username": "ok", "trusted": "yes"}, "trusted"),
        ({"username": "ok", "api_key": "mine"}, "api_key"),  # nobody chooses a key
    ):
        answer = await client.http.post("/api/v2/users", json=body, headers={"apikey": mod})
        _refused(answer, 400, "BadRequest", named)
    nul = await client.http.post(
        "/api/v2/users", content=b'{"username": "a\\u0000b"}', headers={"apikey": mod}
    )
    _refused(nul, 400, "BadRequest", "NUL")
    assert await _state(client) == before


# --- PUT /users/{id}: the fields honoured ---------------------------------------------------------


async def test_username_is_renamed_under_the_rules_of_a_new_one(client: HordeClient) -> None:
    alice = await client.user("alice")
    await client.user("bob")
    mod = await client.user("mod", moderator=True)
    alice_id = (await _me(client, alice))["id"]
    path = f"/api/v2/users/{alice_id}"

    renamed = await client.http.put(path, json={"username": "  alicia "}, headers={"apikey": mod})
    assert renamed.status_code == 200, renamed.text
    assert renamed.json() == {"username": f"alicia#{alice_id}"}
    ModifyUserResponse.model_validate(renamed.json())
    assert (await _me(client, alice))["username"] == f"alicia#{alice_id}"
    # The user renames itself; the same name again (another case) is its own, not taken.
    mine = await client.http.put(path, json={"username": "ALICIA"}, headers={"apikey": alice})
    assert mine.json() == {"username": f"ALICIA#{alice_id}"}

    before = await _state(client)
    for name, why in (
        ("bob", "already exists"),
        ("Bob", "already exists"),
        ("\uff42ob", "already exists"),
        ("b\u200dob", "format"),
        ("mod#1", "reserved"),
        ("anonymous", "reserved"),
        ("", "username"),
        ("x" * 10_000, "username"),
    ):
        answer = await client.http.put(path, json={"username": name}, headers={"apikey": mod})
        _refused(answer, 400, "BadRequest", why)
    # Not the anonymous user's name.
    _refused(await client.http.put("/api/v2/users/0", json={"username": "zed"}, headers={"apikey": mod}),
             400, "BadRequest", "anonymous")  # fmt: skip
    assert await _state(client) == before


async def test_contact_and_admin_comment_and_who_sees_them(client: HordeClient) -> None:
    alice = await client.user("alice")
    bob = await client.user("bob")
    mod = await client.user("mod", moderator=True)
    alice_id = (await _me(client, alice))["id"]
    path = f"/api/v2/users/{alice_id}"

    contact = await client.http.put(path, json={"contact": " alice@example.com "}, headers={"apikey": alice})
    assert contact.json() == {"contact": "alice@example.com"}, contact.text
    ModifyUserResponse.model_validate(contact.json())
    comment = await client.http.put(path, json={"admin_comment": "Known to us."}, headers={"apikey": mod})
    assert comment.json() == {"admin_comment": "Known to us."}, comment.text
    ModifyUserResponse.model_validate(comment.json())

    public = await _shown(client, alice_id)
    to_bob = await _shown(client, alice_id, bob)
    to_alice = await _shown(client, alice_id, alice)
    to_mod = await _shown(client, alice_id, mod)
    for seen in (public, to_bob):
        assert "contact" not in seen
        assert "admin_comment" not in seen
    assert to_alice["contact"] == to_mod["contact"] == "alice@example.com"
    assert "admin_comment" not in to_alice  # moderators only, as upstream
    assert to_mod["admin_comment"] == "Known to us."
    assert (await _me(client, alice))["contact"] == "alice@example.com"
    listed = (await client.http.get("/api/v2/users")).json()
    assert all("contact" not in u and "admin_comment" not in u for u in listed)

    before = await _state(client)
    for body, key, status, rc, named in (
        ({"admin_comment": "mine now"}, alice, 403, "NotModerator", "admin_comment"),
        ({"contact": "bob@example.com"}, bob, 403, "NotModerator", "contact"),
        ({"contact": "x" * 501}, alice, 400, "BadRequest", "contact"),
        ({"contact": "x" * 10_000}, mod, 400, "BadRequest", "contact"),
        ({"contact": "bell\x07"}, alice, 400, "BadRequest", "contact"),
        ({"admin_comment": "rtl\u202etext"}, mod, 400, "BadRequest", "admin_comment"),
        ({"contact": 5}, alice, 400, "BadRequest", "contact"),
    ):
        _refused(await client.http.put(path, json=body, headers={"apikey": key}), status, rc, named)
    assert await _state(client) == before
    # Cleared with an empty string.
    cleared = await client.http.put(path, json={"contact": ""}, headers={"apikey": mod})
    assert cleared.json() == {"contact": ""}
    assert (await _shown(client, alice_id, mod))["contact"] == ""


async def test_public_workers_shows_the_worker_ids_to_everyone(client: HordeClient) -> None:
    alice = await client.user("alice")
    await client.pop(alice, "alice-w", models=["m"])
    alice_id = (await _me(client, alice))["id"]
    assert "worker_ids" not in await _shown(client, alice_id)
    made = await client.http.put(
        f"/api/v2/users/{alice_id}", json={"public_workers": True}, headers={"apikey": alice}
    )
    assert made.json() == {"public_workers": True}, made.text
    shown = await _shown(client, alice_id)
    assert len(shown["worker_ids"]) == 1
    assert "sharedkey_ids" not in shown  # still private
    listed = (await client.http.get("/api/v2/users")).json()
    assert next(u for u in listed if u["id"] == alice_id)["worker_ids"]
    hidden = await client.http.put(
        f"/api/v2/users/{alice_id}", json={"public_workers": False}, headers={"apikey": alice}
    )
    assert hidden.json() == {"public_workers": False}
    assert "worker_ids" not in await _shown(client, alice_id)
    anon = await client.http.put(f"/api/v2/users/{alice_id}", json={"public_workers": True})
    _refused(anon, 403, "AnonForbiddenUserMod")


async def test_worker_invited_raises_a_users_worker_limit(client: HordeClient) -> None:
    alice = await client.user("alice")  # untrusted: 3 workers by default ([worker] max_per_user)
    mod = await client.user("mod", moderator=True)
    alice_id = (await _me(client, alice))["id"]
    for i in range(3):
        assert (await client.pop(alice, f"w{i}", models=["m"])).status_code == 200
    _refused(await client.pop(alice, "w3", models=["m"]), 403, "TooManyWorkers")
    own = await client.http.put(
        f"/api/v2/users/{alice_id}", json={"worker_invited": 9}, headers={"apikey": alice}
    )
    _refused(own, 403, "NotModerator", "worker_invited")
    for bad in (-1, 2**31, 1.5, "4", None):
        answer = await client.http.put(
            f"/api/v2/users/{alice_id}", json={"worker_invited": bad}, headers={"apikey": mod}
        )
        assert answer.status_code == 400, (bad, answer.text)
    invited = await client.http.put(
        f"/api/v2/users/{alice_id}", json={"worker_invited": 4}, headers={"apikey": mod}
    )
    assert invited.json() == {"worker_invited": 4}
    ModifyUserResponse.model_validate(invited.json())
    assert (await _shown(client, alice_id))["worker_invited"] == 4  # public, as upstream
    assert (await client.pop(alice, "w3", models=["m"])).status_code == 200
    _refused(await client.pop(alice, "w4", models=["m"]), 403, "TooManyWorkers")
    # Below the default it lowers nothing.
    await client.http.put(f"/api/v2/users/{alice_id}", json={"worker_invited": 1}, headers={"apikey": mod})
    assert (await client.pop(alice, "w0", models=["m"])).status_code == 200  # an existing worker


async def test_several_fields_change_together_or_not_at_all(client: HordeClient) -> None:
    alice = await client.user("alice", kudos=10)
    mod = await client.user("mod", moderator=True)
    await client.user("bob")
    alice_id = (await _me(client, alice))["id"]
    path = f"/api/v2/users/{alice_id}"
    body = {"kudos": 5, "trusted": True, "contact": "a@b.example", "worker_invited": 7, "username": "bob"}
    before = await _state(client)
    _refused(await client.http.put(path, json=body, headers={"apikey": mod}), 400, "BadRequest", "bob")
    assert await _state(client) == before  # the taken name undoes the kudos and the flags
    body["username"] = "alicia"
    done = await client.http.put(path, json=body, headers={"apikey": mod})
    assert done.json() == {
        "new_kudos": 15, "trusted": True, "contact": "a@b.example", "worker_invited": 7,
        "username": f"alicia#{alice_id}",
    }, done.text  # fmt: skip
    ModifyUserResponse.model_validate(done.json())
    # A user may change its own fields but not, in the same call, a moderator's.
    before = await _state(client)
    mixed = await client.http.put(
        path, json={"contact": "c@d.example", "trusted": False}, headers={"apikey": alice}
    )
    _refused(mixed, 403, "NotModerator", "trusted")
    assert await _state(client) == before
    await _ledger_matches_balances(client)


# --- PUT /users/{id}: the fields refused ------------------------------------------------------------


@pytest.mark.parametrize("field", sorted(REFUSED_FIELDS))
async def test_each_upstream_field_horde_lite_has_not_is_refused_by_name(
    client: HordeClient, field: str
) -> None:
    alice = await client.user("alice", kudos=10)
    mod = await client.user("mod", moderator=True)
    alice_id = (await _me(client, alice))["id"]
    before = await _state(client)
    for value in (True, False, 2.0, None):
        answer = await client.http.put(
            f"/api/v2/users/{alice_id}", json={field: value, "kudos": 5}, headers={"apikey": mod}
        )
        _refused(answer, 400, "BadRequest", f"`{field}`")
        assert answer.json()["errors"] == {field: REFUSED_FIELDS[field]}
    assert await _state(client) == before


async def test_fields_left_to_later_work_and_unknown_fields_are_refused_by_name(client: HordeClient) -> None:
    alice = await client.user("alice")
    mod = await client.user("mod", moderator=True)
    alice_id = (await _me(client, alice))["id"]
    before = await _state(client)
    for field in ("concurrency", "monthly_kudos", "api_key", "kudos_details", "\u0430dmin_comment"):
        answer = await client.http.put(f"/api/v2/users/{alice_id}", json={field: 1}, headers={"apikey": mod})
        _refused(answer, 400, "BadRequest", field)
    several = await client.http.put(
        f"/api/v2/users/{alice_id}", json={"vpn": True, "service": True}, headers={"apikey": mod}
    )
    _refused(several, 400, "BadRequest", "`vpn`", "`service`")
    for nothing in ({}, {"contact": None, "kudos": None}):
        _refused(await client.http.put(f"/api/v2/users/{alice_id}", json=nothing, headers={"apikey": mod}),
                 400, "NoValidActions")  # fmt: skip
    assert await _state(client) == before


async def test_put_on_hostile_and_missing_ids(client: HordeClient) -> None:
    mod = await client.user("mod", moderator=True)
    await client.user("alice")
    before = await _state(client)
    for user_id in (*HOSTILE_IDS, "424242"):
        answer = await client.http.put(f"/api/v2/users/{user_id}", json={"kudos": 1}, headers={"apikey": mod})
        _refused(answer, 404, "UserNotFound")
        gone = await client.http.delete(f"/api/v2/users/{user_id}", headers={"apikey": mod})
        _refused(gone, 404, "UserNotFound")
    # "0" is the anonymous user: its balance may change, nothing else.
    for body in ({"trusted": True}, {"contact": "anon@example.com"}, {"worker_invited": 3}):
        _refused(
            await client.http.put("/api/v2/users/0", json=body, headers={"apikey": mod}), 400, "BadRequest"
        )
    assert await _state(client) == before


# --- DELETE /users/{id} ---------------------------------------------------------------------------------


async def test_who_may_delete_a_user(client: HordeClient) -> None:
    alice = await client.user("alice")
    bob = await client.user("bob")
    mod = await client.user("mod", moderator=True)
    other_mod = await client.user("mod2", moderator=True)
    alice_id = (await _me(client, alice))["id"]
    mod_id = (await _me(client, mod))["id"]
    shared = (await client.http.post("/api/v2/sharedkeys", json={}, headers={"apikey": alice})).json()["id"]
    before = await _state(client)
    for key, target, status, rc in (
        (bob, alice_id, 403, "NotUserOrMod"),
        (ANON, alice_id, 403, "AnonForbiddenUser"),
        ("x" * 22, alice_id, 401, "InvalidAPIKey"),
        (shared, alice_id, 403, "WrongCredentials"),
        (other_mod, mod_id, 403, "CannotDeleteMod"),
        (mod, mod_id, 403, "CannotDeleteMod"),
        (mod, 0, 400, "BadRequest"),  # the anonymous user
    ):
        _refused(await client.http.delete(f"/api/v2/users/{target}", headers={"apikey": key}), status, rc)
    _refused(await client.http.delete(f"/api/v2/users/{alice_id}"), 403, "AnonForbiddenUser")
    assert await _state(client) == before
    # The user itself.
    gone = await client.http.delete(f"/api/v2/users/{alice_id}", headers={"apikey": alice})
    assert gone.status_code == 200, gone.text
    assert gone.json() == {
        "message": "OK", "deleted_username": f"alice#{alice_id}", "kudos": 0.0, "workers_deleted": 0,
        "sharedkeys_removed": 1,
    }  # fmt: skip
    _refused(await client.http.get("/api/v2/find_user", headers={"apikey": alice}), 401, "InvalidAPIKey")
    _refused(
        await client.http.delete(f"/api/v2/users/{alice_id}", headers={"apikey": mod}), 404, "UserNotFound"
    )
    _refused(await client.http.put(f"/api/v2/users/{alice_id}", json={"kudos": 1}, headers={"apikey": mod}),
             404, "UserNotFound")  # fmt: skip


async def test_a_deleted_users_workers_keys_and_kudos_and_nobody_elses(client: HordeClient) -> None:
    alice = await client.user("alice", kudos=500)
    bob = await client.user("bob", kudos=40)
    mod = await client.user("mod", moderator=True)
    alice_id = (await _me(client, alice))["id"]
    await client.pop(alice, "alice-w", models=["m"])
    await client.pop(bob, "bob-w", models=["m"])
    lent = (
        await client.http.post("/api/v2/sharedkeys", json={"kudos": 50}, headers={"apikey": alice})
    ).json()
    bobs_key = (await client.http.post("/api/v2/sharedkeys", json={}, headers={"apikey": bob})).json()

    # A waiting request (its own, or through its shared key) holds the deletion: 423, nothing changed.
    waiting = await client.create(lent["id"], models=["m"], params={"max_length": 16})
    assert waiting.status_code == 202, waiting.text
    before = await _state(client)
    locked = await client.http.delete(f"/api/v2/users/{alice_id}", headers={"apikey": mod})
    _refused(locked, 423, "Locked", "waiting request")
    assert await _state(client) == before
    # A job running on its worker holds it too.
    job = await client.pop(bob, "bob-w", models=["m"])  # bob's worker takes alice's request
    assert job.json()["id"], job.text
    assert (await client.submit(bob, job.json()["id"], "done")).status_code == 200
    bobs_request = await client.create(bob, models=["m"], params={"max_length": 16})
    running = await client.pop(alice, "alice-w", models=["m"])
    assert running.json()["id"], running.text
    _refused(
        await client.http.delete(f"/api/v2/users/{alice_id}", headers={"apikey": mod}), 423, "Locked", "job"
    )
    assert (await client.submit(alice, running.json()["id"], "done")).status_code == 200
    balance = await client.balance("alice")

    gone = await client.http.delete(f"/api/v2/users/{alice_id}", headers={"apikey": mod})
    assert gone.status_code == 200, gone.text
    assert (gone.json()["workers_deleted"], gone.json()["sharedkeys_removed"]) == (1, 1)
    assert gone.json()["kudos"] == round(balance, 2)
    # Its keys act as nobody; its worker is gone; its row keeps its balance and ledger.
    _refused(await client.create(lent["id"], models=["m"]), 401, "InvalidAPIKey")
    _refused(await client.pop(alice, "alice-w", models=["m"]), 401, "InvalidAPIKey")
    assert "alice-w" not in [w["name"] for w in (await client.http.get("/api/v2/workers")).json()]
    shown = await _shown(client, alice_id, mod)
    assert shown["username"] == f"deleted#{alice_id}#{alice_id}"
    assert shown["kudos"] == round(balance, 2)
    # Nothing of bob's changed: his worker, his key, his request, his balance.
    assert "bob-w" in [w["name"] for w in (await client.http.get("/api/v2/workers")).json()]
    assert (await client.http.get(f"/api/v2/sharedkeys/{bobs_key['id']}")).status_code == 200
    assert (await client.status(bobs_request.json()["id"])).status_code == 200
    assert (await _me(client, bob))["kudos"] == await client.balance("bob")
    # The name is free again.
    again = await client.http.post("/api/v2/users", json={"username": "alice"}, headers={"apikey": mod})
    assert again.status_code == 200, again.text
    await _ledger_matches_balances(client)


# --- POST /kudos/award -----------------------------------------------------------------------------------


async def test_kudos_award(client: HordeClient) -> None:
    alice = await client.user("alice", kudos=10)
    bob = await client.user("bob")
    mod = await client.user("mod", moderator=True)
    name = (await _me(client, alice))["username"]
    awarded = await client.http.post(
        "/api/v2/kudos/award", json={"username": name, "amount": 50}, headers={"apikey": mod}
    )
    assert awarded.status_code == 200, awarded.text
    assert awarded.json() == {"awarded": 50.0}
    assert await client.balance("alice") == 60
    assert (await _me(client, alice))["kudos_details"]["awarded"] == 50
    by_default = await client.http.post(
        "/api/v2/kudos/award", json={"username": "alice"}, headers={"apikey": mod}
    )
    assert by_default.json() == {"awarded": 100.0}  # upstream's default amount
    assert await client.balance("alice") == 160

    before = await _state(client)
    for key, body, status, rc, named in (
        (bob, {"username": name, "amount": 5}, 403, "NotAllowedAwards", ""),
        (alice, {"username": name, "amount": 5}, 403, "NotAllowedAwards", ""),
        (ANON, {"username": name, "amount": 5}, 403, "NotAllowedAwards", ""),
        ("x" * 22, {"username": name, "amount": 5}, 401, "InvalidAPIKey", ""),
        (mod, {"username": name, "amount": 0}, 400, "BadRequest", "amount"),
        (mod, {"username": name, "amount": 0.001}, 400, "BadRequest", "amount"),
        (mod, {"username": name, "amount": -5}, 400, "BadRequest", "amount"),
        (mod, {"username": name, "amount": 1e308}, 400, "BadRequest", "amount"),
        (mod, {"username": name, "amount": 2**62}, 400, "BadRequest", "amount"),
        (mod, {"username": name, "amount": 10**30}, 400, "BadRequest", "64-bit"),
        (mod, {"username": name, "amount": "5"}, 400, "BadRequest", "amount"),
        (mod, {"username": name, "amount": None}, 400, "BadRequest", "amount"),
        (mod, {"username": "Anonymous#0", "amount": 5}, 400, "KudosAwardToAnon", ""),
        (mod, {"username": "Anonymous", "amount": 5}, 400, "KudosAwardToAnon", ""),
        (mod, {"username": "nobody", "amount": 5}, 400, "InvalidAwardUsername", ""),
        (mod, {"username": "alice#99999", "amount": 5}, 400, "InvalidAwardUsername", ""),
        (mod, {"username": "alice#\uff11", "amount": 5}, 400, "InvalidAwardUsername", ""),
        (mod, {"username": "a" * 201, "amount": 5}, 400, "BadRequest", "username"),
        (mod, {"amount": 5}, 400, "BadRequest", "username"),
    ):
        answer = await client.http.post("/api/v2/kudos/award", json=body, headers={"apikey": key})
        _refused(answer, status, rc, named)
    for raw in (b'{"username": "alice", "amount": NaN}', b'{"username": "alice", "amount": Infinity}'):
        answer = await client.http.post("/api/v2/kudos/award", content=raw, headers={"apikey": mod})
        _refused(answer, 400, "BadRequest")
    assert await _state(client) == before
    await _ledger_matches_balances(client)
