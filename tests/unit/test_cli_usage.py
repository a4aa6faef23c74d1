"""`horde-lite usage` (docs/reference/usage.md): the history grouped by user, model, worker or day,
as a table or CSV, on SQLite and PostgreSQL. The usage is made through the real app over HTTP; the
CLI runs in a thread (it has its own event loop) against the same database."""

from __future__ import annotations

import asyncio
import csv
import io
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from horde_lite import cli
from tests.support.cli import point_settings_at
from tests.support.horde import HordeClient

MODEL = "koboldcpp/Some-Model-12B"


@pytest.fixture
def run(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    point_settings_at(db_url, tmp_path, monkeypatch)

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(cli.usage, list(args), catch_exceptions=False)

    return invoke


async def _finish(client: HordeClient, worker_key: str, worker: str, requester: str, text: str) -> None:
    created = await client.create(requester, models=[MODEL], params={"max_length": 64})
    assert created.status_code == 202, created.text
    job = (await client.pop(worker_key, worker, models=[MODEL], max_length=512)).json()
    assert (await client.submit(worker_key, job["id"], text)).status_code == 200


def _csv(result: Result) -> list[dict[str, str]]:
    assert result.exit_code == 0, result.output
    return list(csv.DictReader(io.StringIO(result.stdout)))


async def test_usage_by_user_model_worker_and_day(client: HordeClient, run: Any) -> None:
    owner = await client.user("owner")
    alice = await client.user("alice", kudos=1000)
    bob = await client.user("bob", kudos=1000)
    await _finish(client, owner, "w-one", alice, "a" * 40)
    await _finish(client, owner, "w-one", alice, "b" * 80)
    await _finish(client, owner, "w-two", bob, "c" * 40)
    today = datetime.fromtimestamp(client.clock.now(), UTC).strftime("%Y-%m-%d")

    by_user = _csv(await asyncio.to_thread(run, "--since", today, "--by", "user", "--csv"))
    assert [r["user"].split("#")[0] for r in by_user] == ["alice", "bob"]  # most tokens first
    assert (by_user[0]["requests"], by_user[0]["jobs"], by_user[0]["tokens"]) == ("2", "2", "30")
    assert float(by_user[0]["kudos_spent"]) > 2  # each job's reward plus the burn of 1
    assert float(by_user[0]["kudos_earned"]) > 0
    assert list(by_user[0]) == ["user", "requests", "jobs", "tokens", "kudos_spent", "kudos_earned"]

    by_model = _csv(await asyncio.to_thread(run, "--since", "1d", "--by", "model", "--csv"))
    assert [(r["model"], r["jobs"], r["tokens"]) for r in by_model] == [(MODEL, "3", "40")]
    by_worker = _csv(
        await asyncio.to_thread(run, "--since", today, "--until", today, "--by", "worker", "--csv")
    )
    assert [(r["worker"], r["tokens"]) for r in by_worker] == [("w-one", "30"), ("w-two", "10")]
    by_day = _csv(await asyncio.to_thread(run, "--since", "3d", "--by", "day", "--csv"))
    assert [(r["day"], r["requests"]) for r in by_day] == [(today, "3")]

    table = await asyncio.to_thread(run, "--since", today)
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["USER", "REQUESTS", "JOBS", "TOKENS", "KUDOS", "SPENT", "KUDOS", "EARNED"]
    assert lines[1].startswith("alice#")
    assert lines[1].split()[1:4] == ["2", "2", "30"]
    # A period with nothing in it says so.
    empty = await asyncio.to_thread(run, "--since", "2000-01-01", "--until", "2000-01-02")
    assert empty.exit_code == 0
    assert "(no usage in that period)" in empty.stdout
    assert _csv(await asyncio.to_thread(run, "--since", "2000-01-01", "--until", "2000-01-02", "--csv")) == []


@pytest.mark.parametrize(
    "args",
    [
        ("--since", "yesterday"),
        ("--since", "2026-13-01"),
        ("--since", "2026-02-30"),
        ("--since", "-1d"),
        ("--since", "9999999d"),
        ("--since", "1d", "--until", "nope"),
        ("--since", "2026-01-02", "--until", "2026-01-01"),
        ("--since", "1d", "--by", "team"),
        ("--since", "2026-01-01\x00"),
        (),
    ],
)
def test_bad_dates_and_groupings_are_refused_plainly(run: Any, args: tuple[str, ...]) -> None:
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert "--since" in result.output or "--until" in result.output or "--by" in result.output
