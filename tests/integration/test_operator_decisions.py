"""GET /operator/decisions: the admission and assignment records one by one, for moderators
(docs/reference/operators.md); what `horde-lite demo` explains. Both databases."""

from __future__ import annotations

from tests.support.horde import ANON, HordeClient

MODEL = "acme/text-8B"


async def test_a_moderator_reads_each_decision_after_a_time(client: HordeClient) -> None:
    moderator = await client.user("mod", moderator=True)
    owner = await client.user("owner", trusted=True)
    http = client.http
    headers = {"apikey": moderator}
    empty = await http.get("/operator/decisions", headers=headers)
    assert empty.status_code == 200, empty.text
    assert empty.json() == {"admissions": [], "assignments": []}
    worker = {"models": [MODEL], "max_length": 4096, "max_context_length": 8192}
    assert (await client.pop(owner, "w1", **worker)).status_code == 200
    # Refused: anonymous, two jobs over the free allowance. Downgraded: the same, allowing it.
    big = {"max_length": 4096, "max_context_length": 8192, "n": 2}
    assert (await client.create(ANON, models=[MODEL], params=big)).status_code == 403
    downgraded = await client.create(ANON, models=[MODEL], params=big, allow_downgrade=True)
    assert downgraded.status_code == 202, downgraded.text
    popped = (await client.pop(owner, "w1", **worker)).json()
    assert popped["id"], popped
    answer = (await http.get("/operator/decisions", headers=headers)).json()
    outcomes = [(a["outcome"], a["asked"], a["n"], a["allowance"]) for a in answer["admissions"]]
    assert outcomes == [("refused", 4096, 2, 4096), ("downgraded", 4096, 2, 4096)]
    first = answer["admissions"][0]
    assert first["requester_kind"] == "anonymous"
    assert first["allowance_curve"] == "estimated_wait"
    assert first["estimated_wait"] is not None
    (assignment,) = answer["assignments"]
    assert assignment["worker_name"] == "w1"
    assert assignment["max_length"] == 2048  # each job's share of the allowance
    assert assignment["capacity"] == 1200  # unmeasured: the assumed speed over the window
    assert assignment["over_capacity"] is True
    assert assignment["speed_gate"] == "prefer_capable"
    assert assignment["outcome"] is None  # running
    # After the last one seen: nothing older comes back.
    after = answer["admissions"][-1]["at"]
    later = (await http.get("/operator/decisions", params={"after": after}, headers=headers)).json()
    assert later["admissions"] == []


async def test_bad_input_is_a_clear_error(client: HordeClient) -> None:
    moderator = await client.user("mod", moderator=True)
    headers = {"apikey": moderator}
    answer = await client.http.get("/operator/decisions", params={"after": "soon"}, headers=headers)
    assert answer.status_code == 400
    assert answer.json()["rc"] == "BadRequest"
    assert "after" in answer.json()["message"]
