"""The OpenAPI schema is the wire: served where clients look for it, with a docs page that needs no
internet, every route the app serves in it with its methods, real answers valid against it, and
schemathesis finding no 5xx and no answer outside it (`pytest -m schema` runs the latter alone)."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from click.testing import CliRunner
from hypothesis import HealthCheck, Phase
from litestar import Litestar
from litestar.routes import HTTPRoute
from litestar.testing import TestClient
from schemathesis.checks import CHECKS as SCHEMATHESIS_CHECKS
from schemathesis.checks import load_all_checks, not_a_server_error
from schemathesis.specs.openapi.checks import positive_data_acceptance

from horde_lite import __version__
from horde_lite.accounts.users import create_user
from horde_lite.clock import ManualClock
from horde_lite.db.engine import make_engine, make_sessionmaker
from tests.conftest import make_settings
from tests.support.apps import app_for
from tests.support.horde import ANON, HordeClient

# Routes that are not the API: the docs pages, their assets, the schema itself and /metrics.
# Not API: metrics, the schema and its UI, the operators' dashboard and the /register page (HTML
# pages for a browser).
NOT_API = re.compile(
    r"^/(metrics|schema(/.*)?|api|api/swagger\.json|api/docs-assets(/.*)?|dashboard(/.*)?|register(/.*)?)$"
)


async def test_schema_is_served_at_both_paths(client: HordeClient) -> None:
    upstream = await client.http.get("/api/swagger.json")
    litestar = await client.http.get("/schema/openapi.json")
    assert upstream.status_code == litestar.status_code == 200
    schema = upstream.json()
    assert schema == litestar.json()
    assert schema["openapi"].startswith("3.1")
    assert schema["info"]["title"] == "horde_lite"
    assert schema["info"]["version"] == __version__
    assert "/metrics" not in schema["paths"]
    components = schema["components"]["schemas"]
    assert set(components["HordeErrorBody"]["required"]) == {"message", "rc"}
    assert components["OpenAIErrorBody"]["required"] == ["error"]


async def test_error_answers_are_documented_in_each_face_shape(client: HordeClient) -> None:
    paths = (await client.http.get("/api/swagger.json")).json()["paths"]
    horde_404 = paths["/api/v2/generate/text/status/{request_id}"]["get"]["responses"]["404"]
    assert horde_404["content"]["application/json"]["schema"]["$ref"].endswith("/HordeErrorBody")
    assert "RequestNotFound" in horde_404["description"]
    v1_429 = paths["/v1/chat/completions"]["post"]["responses"]["429"]
    assert v1_429["content"]["application/json"]["schema"]["$ref"].endswith("/OpenAIErrorBody")


@pytest.mark.parametrize("page", ["/api/", "/api", "/schema"])
async def test_docs_page_works_offline(client: HordeClient, page: str) -> None:
    answer = await client.http.get(page)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/html")
    html = answer.text
    assert "SwaggerUIBundle" in html
    # Every script and stylesheet comes from the app itself, and each one is served.
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
    assert urls
    for url in urls:
        assert url.startswith("/"), f"{url} is fetched from outside"
        asset = await client.http.get(url)
        assert asset.status_code == 200, url
        assert len(asset.content) > 1000, url
    head = html.split("<body>")[0]
    assert "http://" not in head
    assert "https://" not in head


def test_cli_writes_the_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from litestar.cli.main import litestar_group

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HORDE_LITE_DATABASE__URL", f"sqlite+aiosqlite:///{tmp_path}/cli.db")
    out = tmp_path / "openapi.json"
    result = CliRunner().invoke(
        litestar_group, ["--app", "horde_lite.app:create_app", "schema", "openapi", "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert '"title":"horde_lite"' in out.read_text().replace(" ", "")


def served_operations(app: Litestar) -> set[tuple[str, str]]:
    """(path, method) of every API route the app answers, as the schema spells them."""
    out: set[tuple[str, str]] = set()
    for route in app.routes:
        if not isinstance(route, HTTPRoute) or NOT_API.match(route.path):
            continue
        for method in route.methods - {"OPTIONS", "HEAD"}:
            out.add((route.path_format, method.lower()))
    return out


async def test_every_route_is_in_the_schema_with_its_methods(app: Litestar, client: HordeClient) -> None:
    paths = (await client.http.get("/api/swagger.json")).json()["paths"]
    documented = {(path, method) for path, item in paths.items() for method in item if method != "parameters"}
    served = served_operations(app)
    assert served, "no API routes found"
    assert served - documented == set(), "served but not in the schema"
    assert documented - served == set(), "in the schema but not served"


async def test_real_answers_validate_against_the_schema(client: HordeClient) -> None:
    schema = schemathesis.openapi.from_dict((await client.http.get("/api/swagger.json")).json())
    key = await client.user("alice", kudos=1000)

    def valid(path: str, method: str, answer: Any) -> None:
        schema[path][method].validate_response(answer)

    body = {"prompt": "Hi", "params": {"max_length": 16, "max_context_length": 1024}}
    created = await client.create(key, **body)
    valid("/api/v2/generate/text/async", "POST", created)
    request_id = created.json()["id"]
    valid("/api/v2/generate/text/status/{request_id}", "GET", await client.status(request_id))
    valid("/api/v2/generate/text/status/{request_id}", "GET", await client.status(str(uuid.uuid4())))
    valid("/api/v2/generate/text/pop", "POST", await client.pop(key, "w1", models=["m"]))
    valid("/api/v2/status/heartbeat", "GET", await client.http.get("/api/v2/status/heartbeat"))
    valid("/api/v2/status/models", "GET", await client.http.get("/api/v2/status/models"))
    valid("/api/v2/find_user", "GET", await client.http.get("/api/v2/find_user", headers={"apikey": key}))
    valid("/api/v2/workers", "GET", await client.http.get("/api/v2/workers"))
    valid(
        "/v1/models", "GET", await client.http.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
    )
    bad = await client.http.post("/v1/chat/completions", json={"model": 5}, headers={"apikey": key})
    assert bad.status_code == 400
    valid("/v1/chat/completions", "POST", bad)
    valid("/api/v2/generate/text/status/{request_id}", "DELETE", await client.cancel(request_id))


# --- schemathesis ----------------------------------------------------------------------------------

# Answers by design that schemathesis's generic checks take for faults, by status and code:
# - upstream's 400s for a well-formed request that the facts it names refuse (who asks, whom it
#   names): no schema can say them, so a schema-valid body may meet them;
# - the documented 503s that say no worker can take the request (a real HTTP status, by design).
BY_DESIGN = {
    400: {"KudosTransferFromAnon", "InvalidTargetUsername"},
    503: {"NoEligibleWorker", "QueueTimeout", "no_eligible_worker", "queue_timeout"},
}


def _code(response: Any) -> str | None:
    try:
        body = json.loads(response.content)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    return body["error"].get("code") if isinstance(body.get("error"), dict) else body.get("rc")


def _unless_by_design(check: Any) -> Any:
    @schemathesis.check
    def checked(ctx: Any, response: Any, case: Any) -> bool | None:
        if _code(response) in BY_DESIGN.get(response.status_code, ()):
            return None
        return check(ctx, response, case)

    checked.__name__ = f"{check.__name__}_unless_by_design"
    return checked


load_all_checks()
# Every check schemathesis has (status codes, content types, headers, schemas, Allow headers,
# positive data accepted, ...), the two that judge statuses with BY_DESIGN's exceptions.
CHECKS = [
    _unless_by_design(check) if check in (positive_data_acceptance, not_a_server_error) else check
    for check in SCHEMATHESIS_CHECKS.get_all()
]
EXAMPLES_PER_OPERATION = 10


async def _registered_key(db_url: str, name: str) -> str:
    engine = make_engine(db_url, null_pool=True)
    try:
        async with make_sessionmaker(engine)() as session, session.begin():
            _, key = await create_user(session, name, ManualClock().now())
            return key
    finally:
        await engine.dispose()


def _httpx_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """schemathesis speaks `requests`' arguments; the test client is httpx."""
    kwargs.pop("verify", None)
    cookies = kwargs.pop("cookies", None)
    if cookies:
        kwargs["headers"]["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
    if isinstance(kwargs.get("data"), bytes | str):
        kwargs["content"] = kwargs.pop("data")
    return kwargs


def _run_operation(http: TestClient[Any], operation: Any, key: str) -> None:
    @hypothesis.given(case=operation.as_strategy())
    @hypothesis.settings(
        max_examples=EXAMPLES_PER_OPERATION,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        headers = {"apikey": key, "Authorization": f"Bearer {key}"}
        answer = http.request(**_httpx_kwargs(case.as_transport_kwargs(str(http.base_url), headers)))
        case.validate_response(answer, checks=CHECKS)

    run()


@pytest.mark.schema
def test_schemathesis_finds_no_5xx_and_no_answer_outside_the_schema(db_url: str) -> None:
    settings = make_settings(
        db_url,
        ratelimit={"create_per_minute": 0, "status_per_minute": 0, "register_per_hour": 0},
        # A /v1 call with no worker gives up after this instead of waiting.
        chat={"grace_seconds": 0.05, "max_queue_wait_seconds": 0.2},
    )
    app = app_for(settings, ManualClock())
    failures: list[str] = []
    with TestClient(app, timeout=30) as http:
        schema = schemathesis.openapi.from_dict(http.get("/api/swagger.json").json())
        for number, result in enumerate(schema.get_all_operations()):
            operation = result.ok()
            # A user of its own per operation: POST /find_user/rotate_key replaces the key it is sent.
            registered = asyncio.run(_registered_key(db_url, f"schemathesis{number}"))
            for key in (ANON, registered):
                try:
                    _run_operation(http, operation, key)
                except Exception as e:  # collect every operation's failure, not only the first
                    who = "anonymous" if key == ANON else "registered"
                    failures.append(f"{operation.method.upper()} {operation.path} ({who}): {e}")
    assert not failures, "\n\n".join(failures)
