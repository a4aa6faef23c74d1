"""Every field of upstream's text request is honoured or refused by name (on SQLite and PostgreSQL,
through HTTP): at upstream's defaults, as clients send them, all are accepted; a value horde_lite
cannot honour is a 400 naming the field, leaving nothing behind; `disable_batching` gives a pop one
job at a time, for trusted requesters as upstream; a field upstream does not have is refused by
its name. (`webhook`: tests/integration/test_webhooks.py.)"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from horde_lite.db.models import TextRequest
from horde_lite.requests.upstream_fields import REFUSED_FIELDS
from tests.support.horde import ANON, HordeClient

# Every field of upstream's GenerationInputKobold at its default, as a client may send it.
UPSTREAM_DEFAULTS: dict[str, Any] = {
    "prompt": "Hello.",
    "params": {},
    "softprompt": None,
    "trusted_workers": False,
    "validated_backends": True,
    "slow_workers": True,
    "workers": [],
    "worker_blacklist": False,
    "models": [],
    "dry_run": False,
    "proxied_account": None,
    "extra_source_images": [],
    "disable_batching": False,
    "allow_downgrade": False,
    "webhook": None,
    "style": None,
    "extra_slow_workers": False,
}


async def requests_kept(client: HordeClient) -> int:
    async with client.horde.sessionmaker() as session:
        return (await session.execute(select(func.count(TextRequest.id)))).scalar_one()


async def test_upstreams_defaults_and_the_choices_horde_lite_meets_are_accepted(client: HordeClient) -> None:
    owner = await client.user("owner")
    accepted: list[dict[str, Any]] = [
        UPSTREAM_DEFAULTS,
        {"proxied_account": "", "extra_source_images": None},  # upstream reads both as none
        {"validated_backends": False, "extra_slow_workers": True},  # any worker qualifies either way
        {"disable_batching": True},  # one job: nothing to batch, for anyone
    ]
    for fields in accepted:
        created = await client.create(ANON, **{"prompt": "Hello.", **fields})
        assert created.status_code == 202, (fields, created.text)
    for _ in accepted:  # each is served like any other request
        assert (await client.pop(owner, "w1")).json()["id"] is not None


async def test_what_horde_lite_cannot_honour_is_refused_by_name_and_keeps_nothing(
    client: HordeClient,
) -> None:
    key = await client.user("alice", kudos=100)
    refused: list[tuple[dict[str, Any], str, str]] = [
        ({"softprompt": "my-softprompt"}, "BadRequest", "softprompt"),
        ({"softprompt": ""}, "BadRequest", "softprompt"),  # upstream refuses it too (min length 1)
        ({"softprompt": []}, "BadRequest", "softprompt"),
        ({"style": "00000000-0000-0000-0000-000000000000"}, "BadRequest", "style"),
        ({"style": "a style name"}, "BadRequest", "style"),
        ({"extra_source_images": [{"image": "aGk=", "strength": 1}]}, "BadRequest", "extra_source_images"),
        ({"extra_source_images": "aGk="}, "BadRequest", "extra_source_images"),
        ({"proxied_account": "someone#5"}, "OnlyServiceAccountProxy", "proxied_account"),
        ({"proxied_account": 5}, "OnlyServiceAccountProxy", "proxied_account"),
        ({"disable_batching": True, "params": {"n": 2}}, "RequiresTrust", "disable_batching"),
        ({"disable_batching": "yes"}, "BadRequest", "disable_batching"),
        ({"validated_backends": None}, "BadRequest", "validated_backends"),
    ]
    for fields, rc, field in refused:
        for dry_run in (False, True):
            answer = await client.create(key, **{"prompt": "Hello.", **fields, "dry_run": dry_run})
            assert answer.status_code == 400, (fields, answer.text)
            body = answer.json()
            assert body["rc"] == rc, (fields, body)
            assert field in body["message"], (fields, body)
            if field in REFUSED_FIELDS:
                assert body["errors"] == {field: REFUSED_FIELDS[field]}
    several = await client.create(key, softprompt="x", style="y")
    assert several.json()["errors"] == {
        "softprompt": REFUSED_FIELDS["softprompt"],
        "style": REFUSED_FIELDS["style"],
    }
    # A chat payload on the same route meets the same rules.
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert (await client.create(key, prompt="", chat=chat, style="y")).json()["errors"] == {
        "style": REFUSED_FIELDS["style"]
    }
    assert await requests_kept(client) == 0
    assert await client.balance("alice") == 100


async def test_a_field_upstream_does_not_have_is_refused_by_its_name(client: HordeClient) -> None:
    for field in ("softprompts", "censor_nsfw", "n", "\u0430llow_downgrade", "webhooks"):
        answer = await client.create(ANON, **{field: True})
        assert answer.status_code == 400, (field, answer.text)
        body = answer.json()
        assert body["rc"] == "BadRequest"
        assert body["errors"] == {field: f"Object contains unknown field `{field}`"}
        assert f"`{field}`" in body["message"]
    assert await requests_kept(client) == 0


async def test_disable_batching_gives_a_pop_one_job_at_a_time(client: HordeClient) -> None:
    owner = await client.user("owner")
    trusted = await client.user("trusted", kudos=1000, trusted=True)
    moderator = await client.user("mod", kudos=1000, moderator=True)
    untrusted = await client.user("untrusted", kudos=1000)
    for key in (untrusted, ANON):
        refused = await client.create(key, disable_batching=True, params={"n": 3})
        assert refused.json()["rc"] == "RequiresTrust"
    one_by_one = await client.create(trusted, disable_batching=True, params={"n": 3, "max_length": 16})
    assert one_by_one.status_code == 202, one_by_one.text
    for _ in range(3):
        job = (await client.pop(owner, "w1", amount=3)).json()
        assert len(job["ids"]) == 1
        assert job["payload"]["n"] == 1
    assert (await client.pop(owner, "w1", amount=3)).json()["id"] is None
    by_moderator = await client.create(moderator, disable_batching=True, params={"n": 2, "max_length": 16})
    assert by_moderator.status_code == 202, by_moderator.text
    assert len((await client.pop(owner, "w1", amount=3)).json()["ids"]) == 1
    await client.pop(owner, "w1", amount=3)
    batched = await client.create(trusted, params={"n": 3, "max_length": 16})  # the default: batched
    assert batched.status_code == 202
    assert len((await client.pop(owner, "w1", amount=3)).json()["ids"]) == 3
