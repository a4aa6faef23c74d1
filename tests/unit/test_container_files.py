"""The Dockerfile and compose.yaml say what docs/reference/operators.md says (no image can be built
on the machines that run the tests, so their settings are checked as text), and the image's health
check, its exact command, is run against a real server."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from bench.soak_servers import free_port
from tests.support.server import served

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "docs/reference/operators.md").read_text()


def _dockerfile() -> dict[str, list[str]]:
    """Instruction -> its arguments, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            out.setdefault(word.upper(), []).append(rest.strip())
    return out


def _compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def test_the_image_runs_the_server_as_documented() -> None:
    docker = _dockerfile()
    entry = json.loads(docker["ENTRYPOINT"][0]) + json.loads(docker["CMD"][0])
    assert entry == ["horde-lite", "run", "--host", "0.0.0.0", "--port", "8000"]
    assert f"    {shlex.join(entry)}\n" in DOCS
    assert docker["FROM"] == ["python:3.11-slim"]
    assert docker["USER"] == ["horde"]
    assert "uid 10001" in DOCS
    assert "--uid 10001" in docker["RUN"][0]
    assert json.loads(docker["VOLUME"][0]) == ["/data"]
    assert docker["EXPOSE"] == ["8000"]
    [env] = [e for e in docker["ENV"] if "HORDE_LITE_DATABASE__URL" in e]
    url = re.search(r"HORDE_LITE_DATABASE__URL=(\S+)", env)
    assert url is not None
    assert url.group(1) == "sqlite+aiosqlite:////data/horde_lite.db"
    assert f"`HORDE_LITE_DATABASE__URL={url.group(1)}`" in DOCS


def _env_example() -> dict[str, str]:
    lines = (ROOT / ".env.example").read_text().splitlines()
    pairs = [line.partition("=") for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return {key.strip(): value.strip() for key, _, value in pairs}


# compose's interpolation: ${NAME}, ${NAME:-default}, ${NAME:?error}.
VARIABLE = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")


def _interpolated(text: str, env: dict[str, str]) -> str:
    def one(found: re.Match[str]) -> str:
        name, how, rest = found.groups()
        if env.get(name):
            return env[name]
        assert how == "-", f"${{{name}}} has no default: {rest}"
        return rest

    return VARIABLE.sub(one, text)


def test_compose_runs_it_on_postgresql_as_documented() -> None:
    compose = _compose()
    db, horde = compose["services"]["db"], compose["services"]["horde"]
    assert db["image"] == "postgres:15"
    env = db["environment"]
    user, database = env["POSTGRES_USER"], env["POSTGRES_DB"]
    assert (user, database) == ("horde", "horde")
    assert db["volumes"] == ["pgdata:/var/lib/postgresql/data"]
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])
    assert horde["build"] == "."
    assert horde["depends_on"] == {"db": {"condition": "service_healthy"}}
    url = horde["environment"]["HORDE_LITE_DATABASE__URL"]
    shown = VARIABLE.sub(lambda found: "${" + found[1] + "}", url)
    assert shown == f"postgresql+asyncpg://{user}:${{POSTGRES_PASSWORD}}@db:5432/{database}"
    assert f"`HORDE_LITE_DATABASE__URL={shown}`" in DOCS
    assert "pgdata" in compose["volumes"]


def test_compose_keeps_the_password_in_env_and_the_port_on_loopback() -> None:
    compose = _compose()
    db, horde = compose["services"]["db"], compose["services"]["horde"]
    # The password only through a variable that must be set (compose stops without it).
    for where in (db["environment"]["POSTGRES_PASSWORD"], horde["environment"]["HORDE_LITE_DATABASE__URL"]):
        [password] = [m for m in VARIABLE.finditer(where) if m[1] == "POSTGRES_PASSWORD"]
        assert password[2] == "?", where
        assert ".env" in password[3], where
    assert "change-me" not in (ROOT / "compose.yaml").read_text()
    example = _env_example()
    assert example["POSTGRES_PASSWORD"] == ""  # the example holds no password to forget to change
    # Every variable compose.yaml reads is in .env.example, and .env itself is never committed.
    used = {m[1] for m in VARIABLE.finditer((ROOT / "compose.yaml").read_text())}
    assert used <= set(example), used - set(example)
    assert ".env" in (ROOT / ".gitignore").read_text().splitlines()
    assert ".env" in (ROOT / ".dockerignore").read_text().splitlines()  # nor sent into the image
    # Published on loopback by default, with or without .env.example's values; widened by a variable.
    [port] = horde["ports"]
    assert _interpolated(port, {}) == "127.0.0.1:8000:8000"
    assert _interpolated(port, example) == "127.0.0.1:8000:8000"
    assert _interpolated(port, {"HORDE_LITE_BIND": "0.0.0.0"}) == "0.0.0.0:8000:8000"
    for documented in (
        "127.0.0.1:8000",
        "HORDE_LITE_BIND=0.0.0.0",
        "cp .env.example .env",
        "HORDE_LITE_PORT",
    ):
        assert documented in DOCS, documented


def test_the_image_gets_every_file_the_package_needs() -> None:
    copied = " ".join(_dockerfile()["COPY"])
    mapped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for needed in ("pyproject.toml", "README.md", "litestar.toml", "horde_lite", *mapped.values()):
        assert needed in copied


# --- the image's health check, run against a real server ---------------------------------------


def _healthcheck() -> tuple[list[str], str]:
    """The HEALTHCHECK's command (exec form) and the URL the image gives it."""
    [check] = _dockerfile()["HEALTHCHECK"]
    options, _, command = check.partition("CMD ")
    assert "--timeout=5s" in options, options
    assert "--interval=30s" in options, options
    [env] = [e for e in _dockerfile()["ENV"] if e.startswith("HORDE_LITE_HEALTHCHECK_URL=")]
    return json.loads(command), env.partition("=")[2]


def _run(command: list[str], url: str) -> subprocess.CompletedProcess[str]:
    """The command as the container runs it; `python` is this test's interpreter (the image's has
    horde_lite installed the same way), the URL the image's with another port."""
    assert command[0] == "python"
    env = {**os.environ, "HORDE_LITE_HEALTHCHECK_URL": url}
    return subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.slow
def test_the_health_check_passes_on_a_serving_horde_and_fails_on_a_closed_port(
    db_url: str, tmp_path: Path
) -> None:
    command, url = _healthcheck()
    parsed = urlsplit(url)
    assert (parsed.hostname, parsed.port, parsed.path) == ("127.0.0.1", 8000, "/api/v2/status/heartbeat")
    assert _dockerfile()["EXPOSE"] == [str(parsed.port)]
    assert f"`{url}`" in DOCS
    with served(db_url, {}, tmp_path) as server:
        ok = _run(command, parsed._replace(netloc=f"127.0.0.1:{server.port}").geturl())
        assert ok.returncode == 0, ok.stderr
        # A route that is not the heartbeat answers 404: the check fails on it too.
        missing = _run(command, f"{server.base}/api/v2/status/no-such-route")
        assert missing.returncode != 0
    closed = _run(command, parsed._replace(netloc=f"127.0.0.1:{free_port()}").geturl())
    assert closed.returncode != 0
    assert "Connection refused" in closed.stderr
