"""The Dockerfile and compose.yaml say what docs/reference/operators.md says (no image can be built
on the machines that run the tests, so their settings are checked as text)."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import yaml

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


def test_compose_runs_it_on_postgresql_as_documented() -> None:
    services = _compose()["services"]
    db, horde = services["db"], services["horde"]
    assert db["image"] == "postgres:15"
    env = db["environment"]
    user, password, database = env["POSTGRES_USER"], env["POSTGRES_PASSWORD"], env["POSTGRES_DB"]
    assert f"`{user}`/`{password}`/`{database}`" in DOCS
    assert db["volumes"] == ["pgdata:/var/lib/postgresql/data"]
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])
    assert horde["build"] == "."
    assert horde["ports"] == ["8000:8000"]
    assert horde["depends_on"] == {"db": {"condition": "service_healthy"}}
    url = horde["environment"]["HORDE_LITE_DATABASE__URL"]
    assert url == f"postgresql+asyncpg://{user}:{password}@db:5432/{database}"
    assert f"`HORDE_LITE_DATABASE__URL={url}`" in DOCS
    assert "pgdata" in _compose()["volumes"]


def test_the_image_gets_every_file_the_package_needs() -> None:
    copied = " ".join(_dockerfile()["COPY"])
    mapped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for needed in ("pyproject.toml", "README.md", "litestar.toml", "horde_lite", *mapped.values()):
        assert needed in copied
