"""Text requests on the horde API (docs/reference/horde_api.md, "Requests"): upstream defaults,
validation with the upstream rc codes (never a 500, nothing left behind), n jobs, model matching,
worker targeting, dry runs, the status and cancel routes, queue order and ageing, expiry,
TooManyPrompts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from litestar.testing import AsyncTestClient
from sqlalchemy import text

from horde_lite.clock import ManualClock
from tests.conftest import make_settings
from tests.support.apps import app_for
from tests.support.horde import ANON, HordeClient
from tests.support.horde import quote as quote_of

STATUS_FIELDS = {
    "finished", "processing", "restarted", "waiting", "done", "faulted", "wait_time",
    "queue_position", "kudos", "is_possible", "generations",
}  # fmt: skip


@asynccontextmanager
async def custom_client(db_url: str, **tables: dict[str, object]) -> AsyncIterator[HordeClient]:
    app = app_for(make_settings(db_url, **tables), ManualClock())
    async with AsyncTestClient(app=app, timeout=30) as http:
        yield HordeClient(http, app.state.horde)


async def _scalar(client: HordeClient, sql: str, **params: Any) -> Any:
    async with client.horde.sessionmaker() as session:
        return (await session.execute(text(sql), params)).scalar_one()


async def _nothing_left(client: HordeClient) -> None:
    for table in ("text_requests", "request_models", "kudos_holds", "generations"):
        assert await _scalar(client, f"SELECT count(*) FROM {table}") == 0, table


async def _request_of(client: HordeClient, generation_id: str) -> str:
    return await _scalar(client, "SELECT request_id FROM generations WHERE id = :g", g=generation_id)


async def _worker_id(client: HordeClient, name: str) -> str:
    return await _scalar(client, "SELECT id FROM workers WHERE name = :n", n=name)


# --- defaults and validation --------------------------------------------------------------------


async def test_upstream_defaults_are_applied_on_the_server(client: HordeClient) -> None:
    key = await client.user("worker-owner")
    created = await client.http.post("/api/v2/generate/text/async", json={"prompt": "Once upon"})
    assert created.status_code == 202, created.text
    body = created.json()
    assert set(body) >= {"id", "kudos"}
    job = (await client.pop(key, "w1")).json()
    assert job["payload"]["max_length"] == 80
    assert job["payload"]["max_context_length"] == 2048
    assert job["payload"]["n"] == 1
    assert job["payload"]["prompt"] == "Once upon"
    assert job["ids"] == [job["id"]]
    row = await _scalar(
        client, "SELECT max_length || ':' || max_context_length || ':' || n_total FROM text_requests"
    )
    assert row == "80:2048:1"


async def test_sampling_params_reach_the_worker(client: HordeClient) -> None:
    key = await client.user("worker-owner")
    params = {"max_length": 100, "temperature": 0.7, "top_p": 0.9, "rep_pen": 1.1, "stop_sequence": ["\n"]}
    await client.create(ANON, params=params)
    payload = (await client.pop(key, "w1")).json()["payload"]
    for name, value in params.items():
        assert payload[name] == value


BAD_BODIES: list[tuple[str, Any, int, str]] = [
    ("no prompt", {}, 400, "MissingPrompt"),
    ("empty prompt", {"prompt": ""}, 400, "MissingPrompt"),
    ("blank prompt", {"prompt": "   \n"}, 400, "MissingPrompt"),
    ("context below length", {"prompt": "p", "params": {"max_length": 512, "max_context_length": 256}}, 400,
     "TokenOverflow"),
    ("max_length 15", {"prompt": "p", "params": {"max_length": 15}}, 400, "BadRequest"),
    ("max_length 16385", {"prompt": "p", "params": {"max_length": 16385, "max_context_length": 20000}}, 400,
     "BadRequest"),
    ("max_length 0", {"prompt": "p", "params": {"max_length": 0}}, 400, "BadRequest"),
    ("n 0", {"prompt": "p", "params": {"n": 0}}, 400, "BadRequest"),
    ("n 21", {"prompt": "p", "params": {"n": 21}}, 400, "BadRequest"),
    ("n negative", {"prompt": "p", "params": {"n": -1}}, 400, "BadRequest"),
    ("context 79", {"prompt": "p", "params": {"max_length": 16, "max_context_length": 79}}, 400,
     "BadRequest"),
    ("prompt number", {"prompt": 5}, 400, "BadRequest"),
    ("params string", {"prompt": "p", "params": "x"}, 400, "BadRequest"),
    ("max_length string", {"prompt": "p", "params": {"max_length": "80"}}, 400, "BadRequest"),
    ("max_length float", {"prompt": "p", "params": {"max_length": 80.5}}, 400, "BadRequest"),
    ("max_length bool", {"prompt": "p", "params": {"max_length": True}}, 400, "BadRequest"),
    ("n string", {"prompt": "p", "params": {"n": "2"}}, 400, "BadRequest"),
    ("n huge", {"prompt": "p", "params": {"n": 10**30}}, 400, "BadRequest"),
    ("context string", {"prompt": "p", "params": {"max_context_length": []}}, 400, "BadRequest"),
    ("models string", {"prompt": "p", "models": "m"}, 400, "BadRequest"),
    ("models numbers", {"prompt": "p", "models": [1, 2]}, 400, "BadRequest"),
    ("workers not list", {"prompt": "p", "workers": {"a": 1}}, 400, "BadRequest"),
    ("blacklist string", {"prompt": "p", "worker_blacklist": "w"}, 400, "BadRequest"),
    ("trusted string", {"prompt": "p", "trusted_workers": "yes"}, 400, "BadRequest"),
    ("dry_run number", {"prompt": "p", "dry_run": 1}, 400, "BadRequest"),
    ("body list", [1, 2], 400, "BadRequest"),
    ("body string", "prompt", 400, "BadRequest"),
]  # fmt: skip


async def test_bad_requests_get_their_rc_and_leave_nothing(client: HordeClient) -> None:
    rich = await client.user("rich", kudos=100_000)
    for case, body, status, rc in BAD_BODIES:
        for key in (ANON, rich):
            response = await client.http.post(
                "/api/v2/generate/text/async", json=body, headers={"apikey": key}
            )
            assert response.status_code == status, (case, response.text)
            answer = response.json()
            assert isinstance(answer["rc"], str)
            assert answer["rc"] == rc, case
            assert isinstance(answer["message"], str)
            assert answer["message"]
            assert set(answer) <= {"message", "rc", "errors"}
            if "errors" in answer:  # the SDK reads "errors" as payload validation: only for that
                assert rc == "BadRequest"
        await _nothing_left(client)


async def test_malformed_json_is_a_400(client: HordeClient) -> None:
    for raw in (b"{", b'{"prompt": "x",}', b"\xff\xfe", b"prompt=x", b'{"prompt": "x"} trailing', b"[" * 5000,
                b"null", b"42"):  # fmt: skip
        response = await client.http.post(
            "/api/v2/generate/text/async", content=raw, headers={"content-type": "application/json"}
        )
        assert response.status_code == 400, (raw[:20], response.text)
        assert response.json()["rc"] == "BadRequest"
    await _nothing_left(client)


async def test_bad_json_on_the_worker_routes(client: HordeClient) -> None:
    key = await client.user("owner")
    for path, body in (
        ("/api/v2/generate/text/pop", {"name": ""}),
        ("/api/v2/generate/text/pop", {"name": "w", "max_length": 8}),
        ("/api/v2/generate/text/pop", {"name": "w", "max_context_length": 40}),
        ("/api/v2/generate/text/pop", {"name": "w", "models": "m"}),
        ("/api/v2/generate/text/pop", {"name": "w", "threads": 0}),
        ("/api/v2/generate/text/pop", {"name": "w", "amount": 0}),
        ("/api/v2/generate/text/submit", {"generation": "x"}),
        ("/api/v2/generate/text/submit", {"id": "x", "state": "great"}),
        ("/api/v2/generate/text/submit", {"id": 5}),
    ):
        response = await client.http.post(path, json=body, headers={"apikey": key})
        assert response.status_code == 400, (path, body, response.text)
        assert response.json()["rc"] == "BadRequest"
    for path in ("/api/v2/generate/text/pop", "/api/v2/generate/text/submit"):
        response = await client.http.post(
            path, content=b"{nope", headers={"apikey": key, "content-type": "application/json"}
        )
        assert response.status_code == 400
        assert response.json()["rc"] == "BadRequest"
    assert await _scalar(client, "SELECT count(*) FROM workers") == 0


async def test_boundaries_are_accepted(client: HordeClient) -> None:
    rich = await client.user("rich", kudos=100_000)
    ok = [
        {"params": {"max_length": 16}},
        {"params": {"n": 20}},
        {"params": {"max_length": 2048, "max_context_length": 2048}},
        {"params": {"max_length": 16384, "max_context_length": 16384}},
        {"params": {"max_context_length": 80}},
    ]
    for body in ok:
        response = await client.create(rich, **body)
        assert response.status_code == 202, (body, response.text)
    assert await _scalar(client, "SELECT max(max_length) FROM text_requests") == 16384


# --- n jobs, models, targeting -------------------------------------------------------------------


async def test_n_jobs_become_n_generations(client: HordeClient) -> None:
    key = await client.user("owner")
    request_id = (await client.create(ANON, params={"n": 3})).json()["id"]
    ids = []
    for i in range(3):
        job = (await client.pop(key, f"w{i}")).json()
        assert job["id"] is not None
        assert job["payload"]["n"] == 1
        ids.append(job["id"])
    assert len(set(ids)) == 3
    assert (await client.pop(key, "w9")).json()["id"] is None
    status = (await client.status(request_id)).json()
    assert (status["waiting"], status["processing"], status["finished"]) == (0, 3, 0)
    for i, gen in enumerate(ids):
        assert (await client.submit(key, gen, f"answer {i}")).status_code == 200
    status = (await client.status(request_id)).json()
    assert status["done"] is True
    assert sorted(g["text"] for g in status["generations"]) == ["answer 0", "answer 1", "answer 2"]


async def test_amount_takes_several_jobs_in_one_pop(client: HordeClient) -> None:
    key = await client.user("owner")
    await client.create(ANON, params={"n": 3})
    job = (await client.pop(key, "w1", amount=2, threads=2)).json()
    assert len(job["ids"]) == 2
    assert job["id"] == job["ids"][0]
    assert job["payload"]["n"] == 2
    rest = (await client.pop(key, "w1", amount=5, threads=2)).json()
    assert len(rest["ids"]) == 1


async def test_models_must_match(client: HordeClient) -> None:
    key = await client.user("owner")
    request_id = (await client.create(ANON, models=["alpha-7B", "beta-13B"])).json()["id"]
    assert (await client.pop(key, "other", models=["gamma"])).json()["id"] is None
    assert (await client.pop(key, "none", models=[])).json()["id"] is None
    job = (await client.pop(key, "right", models=["gamma", "beta-13B"])).json()
    assert job["id"] is not None
    assert job["model"] == "beta-13B"
    assert await _request_of(client, job["id"]) == request_id
    # A request without models takes any worker; the job names the worker's first model.
    await client.create(ANON)
    any_job = (await client.pop(key, "other", models=["gamma"])).json()
    assert any_job["model"] == "gamma"


async def test_worker_limits_are_honoured(client: HordeClient) -> None:
    key = await client.user("owner")
    await client.create(ANON, params={"max_length": 300, "max_context_length": 4096})
    small = (await client.pop(key, "small", max_length=256, max_context_length=8192)).json()
    assert small["id"] is None
    assert small["skipped"] == {"max_length": 1}
    short = (await client.pop(key, "short", max_length=512, max_context_length=2048)).json()
    assert short["id"] is None
    assert short["skipped"] == {"max_context_length": 1}
    assert (await client.pop(key, "big", max_length=512, max_context_length=4096)).json()["id"] is not None


async def test_skipped_counts_each_legacy_request_once_and_no_chat_request(client: HordeClient) -> None:
    """`skipped` counts the head of the queue: a request too long and too wide counts as too long
    only, a chat request counts under neither (upstream's keys are Kobold's)."""
    key = await client.user("owner")
    rich = await client.user("rich", kudos=1_000_000)
    await client.create(ANON, params={"max_length": 300, "max_context_length": 4096})  # both
    await client.create(ANON, params={"max_length": 100, "max_context_length": 4096})  # wider only
    chat = {"messages": [{"role": "user", "content": "Hi."}], "max_tokens": 300}
    assert (await client.create(rich, chat=chat)).status_code == 202
    popped = (await client.pop(key, "small", max_length=256, max_context_length=2048)).json()
    assert popped["id"] is None
    assert popped["skipped"] == {"max_length": 1, "max_context_length": 1}


async def test_workers_allow_list(client: HordeClient) -> None:
    key = await client.user("owner")
    for name in ("w1", "w2", "w3"):
        await client.pop(key, name)
    w2, w3 = await _worker_id(client, "w2"), await _worker_id(client, "w3")
    await client.create(ANON, workers=[w2, w3], params={"n": 2})
    assert (await client.pop(key, "w1")).json()["id"] is None
    assert (await client.pop(key, "w2")).json()["id"] is not None
    assert (await client.pop(key, "w3")).json()["id"] is not None


async def test_worker_blacklist(client: HordeClient) -> None:
    key = await client.user("owner")
    for name in ("w1", "w2"):
        await client.pop(key, name)
    w1 = await _worker_id(client, "w1")
    await client.create(ANON, worker_blacklist=[w1])
    assert (await client.pop(key, "w1")).json()["id"] is None
    assert (await client.pop(key, "w2")).json()["id"] is not None
    # Upstream's form: `workers` plus `worker_blacklist: true` is a deny-list.
    await client.create(ANON, workers=[w1], worker_blacklist=True)
    assert (await client.pop(key, "w1")).json()["id"] is None
    assert (await client.pop(key, "w2")).json()["id"] is not None


async def test_trusted_workers(client: HordeClient) -> None:
    untrusted = await client.user("untrusted")
    trusted = await client.user("trusted", trusted=True)
    request_id = (await client.create(ANON, trusted_workers=True)).json()["id"]
    assert (await client.pop(untrusted, "w-u")).json()["id"] is None
    job = (await client.pop(trusted, "w-t")).json()
    assert await _request_of(client, job["id"]) == request_id


async def test_slow_workers_false_skips_slow_workers(client: HordeClient) -> None:
    rich = await client.user("rich", kudos=1000)
    key = await client.user("owner")
    await client.pop(key, "slow")
    await client.set_worker_speed("slow", 1.0)
    await client.create(rich, slow_workers=False)
    assert (await client.pop(key, "slow")).json()["id"] is None
    assert (await client.pop(key, "fast")).json()["id"] is not None  # unmeasured: 10 tokens/s


# --- dry run ---------------------------------------------------------------------------------------


async def test_dry_run_returns_a_quote_and_keeps_nothing(client: HordeClient) -> None:
    rich = await client.user("rich", kudos=1000)
    quote = await client.create(rich, models=["Rocinante-X-12B-v1"], params={"max_length": 80, "n": 2},
                                dry_run=True)  # fmt: skip
    assert quote.status_code == 200, quote.text
    # 80 tokens of a 12B model at the context they need ("Hello there." is 3 tokens), two jobs.
    assert quote.json()["kudos"] == quote_of(80, 12, 83, n=2)
    assert "id" not in quote.json()
    funded = await client.create(rich, slow_workers=False, dry_run=True)
    assert funded.status_code == 200
    assert funded.json()["kudos"] == quote_of(80, 13, 83)  # no model: priced as 13B
    await _nothing_left(client)
    assert await client.balance("rich") == 1000


# --- status and cancel ------------------------------------------------------------------------------


async def test_status_fields_and_types(client: HordeClient) -> None:
    key = await client.user("owner")
    await client.pop(key, "w1")
    request_id = (await client.create(ANON, params={"n": 2})).json()["id"]
    status = (await client.status(request_id)).json()
    assert set(status) == STATUS_FIELDS
    assert isinstance(status["wait_time"], int)
    assert isinstance(status["queue_position"], int)
    assert status["queue_position"] == 1
    assert status["wait_time"] == 16  # 2 x 80 tokens at the assumed 10 tokens/s
    assert (status["waiting"], status["processing"], status["finished"], status["done"]) == (2, 0, 0, False)
    assert status["is_possible"] is True
    assert status["generations"] == []

    first = (await client.pop(key, "w1")).json()["id"]
    second = (await client.pop(key, "w1")).json()["id"]
    await client.submit(key, first, "one", seed=42, gen_metadata=[{"type": "x", "value": "y"}])
    status = (await client.status(request_id)).json()
    assert (status["waiting"], status["processing"], status["finished"], status["done"]) == (0, 1, 1, False)
    assert (status["wait_time"], status["queue_position"]) == (0, 0)
    # Only finished generations are listed (the SDK stops polling at the first listed one).
    assert len(status["generations"]) == 1
    gen = status["generations"][0]
    assert gen["text"] == "one"
    assert gen["state"] == "ok"
    assert gen["worker_name"] == "w1"
    assert gen["worker_id"] == await _worker_id(client, "w1")
    assert gen["seed"] == 42
    assert gen["gen_metadata"] == [{"type": "x", "value": "y"}]
    assert "model" in gen
    await client.submit(key, second, "two")
    status = (await client.status(request_id)).json()
    assert status["done"] is True
    assert status["kudos"] > 0


async def test_status_is_possible_without_workers(client: HordeClient) -> None:
    request_id = (await client.create(ANON, models=["nobody-serves-this"])).json()["id"]
    status = (await client.status(request_id)).json()
    assert status["is_possible"] is False
    assert (status["wait_time"], status["queue_position"]) == (0, 1)


async def test_cancel_returns_the_status(client: HordeClient) -> None:
    key = await client.user("owner")
    request_id = (await client.create(ANON, params={"n": 3})).json()["id"]
    running = (await client.pop(key, "w1")).json()["id"]
    cancelled = await client.cancel(request_id)
    assert cancelled.status_code == 200
    body = cancelled.json()
    assert set(body) == STATUS_FIELDS
    assert (body["waiting"], body["processing"], body["done"]) == (0, 1, False)
    assert (await client.pop(key, "w2")).json()["id"] is None  # nothing more is handed out
    # The running job still finishes and is listed.
    assert (await client.submit(key, running, "late")).status_code == 200
    status = (await client.status(request_id)).json()
    assert status["done"] is True
    assert [g["text"] for g in status["generations"]] == ["late"]
    # Cancelling again is harmless.
    again = await client.cancel(request_id)
    assert again.status_code == 200
    assert again.json()["done"] is True


async def test_unknown_request_id(client: HordeClient) -> None:
    for request_id in ("00000000-0000-4000-8000-000000000000", "nope", "x" * 300):
        for response in (await client.status(request_id), await client.cancel(request_id)):
            assert response.status_code == 404
            assert response.json()["rc"] == "RequestNotFound"


# --- queue order and ageing ---------------------------------------------------------------------------


async def _popped_order(client: HordeClient, key: str, count: int) -> list[str]:
    order = []
    for _ in range(count):
        job = (await client.pop(key, "w1")).json()
        order.append(await _request_of(client, job["id"]))
    return order


async def test_queue_order_is_priority_then_age(client: HordeClient) -> None:
    key = await client.user("worker-owner")
    poor = await client.user("poor", kudos=0)
    rich = await client.user("rich", kudos=1000)
    first_poor = (await client.create(poor)).json()["id"]
    client.clock.advance(1)
    second_poor = (await client.create(poor)).json()["id"]
    client.clock.advance(1)
    rich_id = (await client.create(rich)).json()["id"]
    assert await _popped_order(client, key, 3) == [rich_id, first_poor, second_poor]


async def test_anonymous_negative_kudos_do_not_sink_the_priority(client: HordeClient) -> None:
    key = await client.user("worker-owner")
    # Anonymous kudos go negative as its jobs are charged; its priority stays clamped at 0.
    served = (await client.create(ANON)).json()["id"]
    job = (await client.pop(key, "w1")).json()
    await client.submit(key, job["id"], "x" * 400)
    assert await client.balance("Anonymous") < 0
    assert served
    anon_id = (await client.create(ANON)).json()["id"]
    client.clock.advance(1)
    poor = await client.user("poor")
    poor_id = (await client.create(poor)).json()["id"]
    assert await _popped_order(client, key, 2) == [anon_id, poor_id]


async def test_ageing_lets_an_old_request_catch_up(client: HordeClient) -> None:
    key = await client.user("worker-owner")
    poor = await client.user("poor", kudos=0)
    rich = await client.user("rich", kudos=100)  # a head start of 100 / 5 = 20 s
    old = (await client.create(poor)).json()["id"]
    client.clock.advance(19)
    overtaking = (await client.create(rich)).json()["id"]
    client.clock.advance(2)  # 21 s after the old one: not enough to overtake it
    behind = (await client.create(rich)).json()["id"]
    assert await _popped_order(client, key, 3) == [overtaking, old, behind]


async def test_owner_and_priority_users_first_at_pop(client: HordeClient) -> None:
    owner = await client.user("owner", kudos=0)
    friend = await client.user("friend", kudos=0)
    rich = await client.user("rich", kudos=10_000)
    rich_id = (await client.create(rich)).json()["id"]
    friend_id = (await client.create(friend)).json()["id"]
    own_id = (await client.create(owner)).json()["id"]
    # The owner's own request first, then its priority user's, then everyone's by priority.
    order = []
    for _ in range(3):
        job = (await client.pop(owner, "w1", priority_usernames=["friend"])).json()
        order.append(await _request_of(client, job["id"]))
    assert order[0] in (own_id, friend_id)
    assert set(order[:2]) == {own_id, friend_id}
    assert order[2] == rich_id
    # Another worker without the priority list takes the queue in plain priority order.
    rich2 = (await client.create(rich)).json()["id"]
    await client.create(friend)
    other = await client.user("other")
    job = (await client.pop(other, "w2")).json()
    assert await _request_of(client, job["id"]) == rich2


async def test_priority_usernames_with_id(client: HordeClient) -> None:
    owner = await client.user("owner")
    friend = await client.user("friend")
    rich = await client.user("rich", kudos=10_000)
    friend_id = (await client.http.get("/api/v2/find_user", headers={"apikey": friend})).json()["id"]
    await client.create(rich)
    friends = (await client.create(friend)).json()["id"]
    job = (await client.pop(owner, "w1", priority_usernames=[f"friend#{friend_id}"])).json()
    assert await _request_of(client, job["id"]) == friends


# --- expiry and limits ------------------------------------------------------------------------------


async def test_expiry_removes_the_request_its_results_and_its_hold(client: HordeClient) -> None:
    key = await client.user("owner")
    rich = await client.user("rich", kudos=1000)
    assert (await client.pop(key, "bystander", models=["elsewhere-7B"])).status_code == 200
    bystander = (await client.http.get("/api/v2/workers/name/bystander")).json()["id"]
    request_id = (
        await client.create(rich, slow_workers=False, params={"n": 2}, worker_blacklist=[bystander])
    ).json()["id"]
    assert await _scalar(client, "SELECT count(*) FROM kudos_holds WHERE active") == 1
    assert await _scalar(client, "SELECT count(*) FROM queue_refusals") == 1
    job = (await client.pop(key, "w1")).json()
    await client.submit(key, job["id"], "kept for a while")
    assert await _scalar(client, "SELECT count(*) FROM generations") == 1

    client.clock.advance(1199)  # the pop renewed the expiry: 1200 s from then
    await client.sweep()
    assert (await client.status(request_id)).status_code == 200
    client.clock.advance(2)
    await client.sweep()
    gone = await client.status(request_id)
    assert gone.status_code == 404
    assert gone.json()["rc"] == "RequestNotFound"
    await _nothing_left_but_holds(client)
    assert await _scalar(client, "SELECT count(*) FROM kudos_holds WHERE active") == 0


async def _nothing_left_but_holds(client: HordeClient) -> None:
    for table in ("text_requests", "request_models", "generations", "queue_refusals"):
        assert await _scalar(client, f"SELECT count(*) FROM {table}") == 0, table


async def test_expired_request_is_not_offered_before_the_sweep(client: HordeClient) -> None:
    key = await client.user("owner")
    await client.create(ANON)
    client.clock.advance(1201)
    assert (await client.pop(key, "w1")).json()["id"] is None


async def test_a_pop_renews_the_expiry(client: HordeClient) -> None:
    key = await client.user("owner")
    request_id = (await client.create(ANON, params={"n": 2})).json()["id"]
    client.clock.advance(1100)
    job = (await client.pop(key, "w1")).json()
    client.clock.advance(140)  # 1240 s after creation, 140 s after the pop
    await client.sweep()
    assert (await client.submit(key, job["id"], "made it")).status_code == 200
    client.clock.advance(1000)  # 2240 s after creation, 1140 s after the pop
    await client.sweep()
    assert (await client.status(request_id)).json()["waiting"] == 1
    client.clock.advance(100)
    await client.sweep()
    assert (await client.status(request_id)).status_code == 404


async def test_too_many_prompts(db_url: str) -> None:
    async with custom_client(
        db_url, request={"max_waiting_per_user": 2, "max_waiting_anonymous": 3}
    ) as client:
        key = await client.user("busy")
        for _ in range(2):
            assert (await client.create(key)).status_code == 202
        refused = await client.create(key)
        assert refused.status_code == 429
        assert refused.json()["rc"] == "TooManyPrompts"
        assert refused.headers["retry-after"]
        for _ in range(3):
            assert (await client.create(ANON)).status_code == 202
        assert (await client.create(ANON)).json()["rc"] == "TooManyPrompts"
        assert await _scalar(client, "SELECT count(*) FROM text_requests") == 5
        # A finished request no longer counts.
        worker = await client.user("worker-owner")
        job = (await client.pop(worker, "w1")).json()
        await client.submit(worker, job["id"], "done")
        owner_of = await _scalar(
            client,
            "SELECT u.username FROM text_requests r JOIN users u ON u.id = r.user_id WHERE r.state = 'done'",
        )
        again = await client.create(key if owner_of == "busy" else ANON)
        assert again.status_code == 202


async def test_values_the_database_cannot_store_are_a_400(client: HordeClient) -> None:
    """PostgreSQL refuses NUL in text and over-long VARCHARs; both databases answer the same 400."""
    key = await client.user("owner")
    await client.create(ANON)
    job = (await client.pop(key, "w1")).json()
    cases = [
        ("/api/v2/generate/text/async", {"prompt": "p", "models": ["m" * 256]}),
        ("/api/v2/generate/text/async", {"prompt": "a\x00b"}),
        ("/api/v2/generate/text/async", {"prompt": "p", "models": ["a\x00b"]}),
        ("/api/v2/generate/text/async", {"prompt": "p", "params": {"stop_sequence": ["\x00"]}}),
        ("/api/v2/generate/text/pop", {"name": "w2", "models": ["m" * 256]}),
        ("/api/v2/generate/text/pop", {"name": "a\x00b"}),
        ("/api/v2/generate/text/submit", {"id": job["id"], "generation": "x", "seed": "9" * 65}),
        ("/api/v2/generate/text/submit", {"id": job["id"], "generation": "x", "seed": 10**30}),
        ("/api/v2/generate/text/submit", {"id": job["id"], "generation": "nul\x00"}),
    ]
    for path, body in cases:
        response = await client.http.post(path, json=body, headers={"apikey": key})
        assert response.status_code == 400, (path, body, response.text)
        assert response.json()["rc"] == "BadRequest"
    assert await _scalar(client, "SELECT count(*) FROM text_requests") == 1
    assert await _scalar(client, "SELECT count(*) FROM workers") == 1
    # The limits themselves are fine, and so is a "\u0000" that is only text.
    assert (await client.create(ANON, models=["m" * 255], prompt="a \\u0000 b")).status_code == 202
    done = await client.submit(key, job["id"], "x", seed=-(2**63))
    assert done.status_code == 200, done.text


async def test_refusals_at_admission_leave_nothing(client: HordeClient) -> None:
    poor = await client.user("poor", kudos=30)  # 5 spendable above the registered floor of 25
    refusals = [
        (ANON, {"slow_workers": False}, 403, "KudosUpfront"),
        (poor, {"slow_workers": False, "models": ["m-12B"]}, 403, "KudosUpfront"),
        (ANON, {"models": ["nobody-serves-this"], "params": {"max_length": 2048}}, 503, "NoEligibleWorker"),
    ]
    for key, body, status, rc in refusals:
        for dry_run in (False, True):
            response = await client.create(key, dry_run=dry_run, **body)
            assert response.status_code == status, response.text
            assert response.json()["rc"] == rc
    await _nothing_left(client)
    assert await client.balance("poor") == 30
