"""History and candidate policies (docs/reference/policies.md, "Candidates in shadow" and
"What if": decision 0027): the records written at each pop, job end and admission decision (a
refusal's included) outlive their requests; a candidate gate and curve are judged in shadow; and
`horde-lite whatif` (and the report functions behind it) judges any installed gate or curve over
that history, with exact numbers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from horde_lite.app import create_app
from horde_lite.clock import ManualClock
from horde_lite.db.models import AdmissionRecord, AssignmentRecord, CandidateRecord
from horde_lite.policies.registry import PolicyError
from horde_lite.whatif import allowance_whatif, render_allowance, render_speed_gate, speed_gate_whatif
from tests.conftest import is_postgres, make_settings
from tests.support.apps import app_for
from tests.support.horde import ANON, HordeClient

HORDE_LITE = Path(sys.executable).with_name("horde-lite")
MODEL = "acme/chat-8B"
CHAT_BLOCK: dict[str, Any] = {"max_completion_tokens": 2048, "max_context_tokens": 8192}
HI = [{"role": "user", "content": "Hi"}]
LEGACY = {"max_length": 1024, "max_context_length": 2048}  # what the workers declare for legacy jobs


async def _all(client: HordeClient, model: Any) -> list[Any]:
    async with client.horde.sessionmaker() as session:
        return list((await session.execute(select(model))).scalars())


async def _job(client: HordeClient, key: str, name: str, **body: Any) -> dict[str, Any]:
    job = (await client.pop(key, name, models=[MODEL], chat=CHAT_BLOCK, **LEGACY, **body)).json()
    assert job["id"], job
    return job


async def _submitted(client: HordeClient, key: str, job: dict[str, Any], state: str = "ok") -> None:
    answer = await client.submit(key, job["id"], "an answer", state=state)
    assert answer.status_code == 200, answer.text


def _since(client: HordeClient) -> float:
    return client.clock.now() - 86400


# --- the records -----------------------------------------------------------------------------------


async def test_records_are_written_at_pop_end_and_admission_and_outlive_their_requests(
    client: HordeClient,
) -> None:
    owner = await client.user("owner")
    await _job_free_pop(client, owner)
    started = client.clock.now()
    created = await client.create(ANON, models=[MODEL], params={"max_length": 256})
    assert created.status_code == 202, created.text
    done = await _job(client, owner, "w1")
    client.clock.advance(12)
    await _submitted(client, owner, done)
    lapsing = await client.create(ANON, models=[MODEL], params={"max_length": 128})
    lapsed = await _job(client, owner, "w1")
    # A refusal (no online worker declares 8192 tokens: the floor allowance) and a dry run.
    refused = await client.create(
        ANON, models=[MODEL], params={"max_length": 8192, "max_context_length": 9000}
    )
    assert (refused.status_code, refused.json()["rc"]) == (503, "NoEligibleWorker"), refused.text
    quote = await client.create(ANON, models=[MODEL], params={"max_length": 256}, dry_run=True)
    assert quote.status_code == 200, quote.text

    client.clock.advance(151)  # the second job's lease lapses
    assert (await client.sweep())[0] == 1
    client.clock.advance(1300)  # both requests expire
    assert (await client.sweep())[1] == 2
    assert (await client.status(created.json()["id"])).status_code == 404

    assignments = {a.generation_id: a for a in await _all(client, AssignmentRecord)}
    assert set(assignments) == {done["id"], lapsed["id"]}
    first, second = assignments[done["id"]], assignments[lapsed["id"]]
    assert (first.at, first.request_id, first.max_length, first.is_chat) == (
        started,
        created.json()["id"],
        256,
        False,
    )
    assert (first.over_capacity, first.capable_online, first.speed_gate) == (False, None, "prefer_capable")
    assert (first.capacity, first.speed, first.worker_trusted) == (1200, 10.0, False)
    assert (first.outcome, first.ended_at) == ("completed", started + 12)
    assert (second.request_id, second.outcome) == (lapsing.json()["id"], "aborted")
    # The first submit measured w1 at 3 tokens in 12 s: capacity 30, and no capable worker online.
    assert (second.capacity, second.over_capacity, second.capable_online) == (30, True, False)
    assert second.ended_at == started + 12 + 151

    admissions = sorted(await _all(client, AdmissionRecord), key=lambda a: a.id)
    assert [(a.request_id, a.outcome) for a in admissions] == [
        (created.json()["id"], "free"),
        (lapsing.json()["id"], "free"),
        (None, "refused"),  # kept though its transaction was rolled back; the dry run left none
    ]
    free, _, no = admissions
    assert (free.requester_kind, free.is_chat, free.requested_max_length, free.n) == (
        "anonymous",
        False,
        256,
        1,
    )
    assert (free.allowance, free.allowance_curve, free.estimated_wait, free.eligible_threads) == (
        4096,
        "estimated_wait",
        0.0,
        1,
    )
    # estimated_wait does not read the horde-wide totals: recorded as not read.
    assert (free.online_text_threads, free.queued_text_requests) == (None, None)
    assert (free.slow_workers, free.downgrade_allowed, free.can_fund) == (True, False, None)
    assert (no.requested_max_length, no.allowance, no.can_fund, no.eligible_threads) == (8192, 512, False, 0)
    assert await _all(client, CandidateRecord) == []  # no candidate configured

    # The history replays: the curve in force reproduces every outcome; a curve that reads the
    # horde-wide totals cannot judge decisions that did not read them.
    async with client.horde.sessionmaker() as session:
        same = await allowance_whatif(session, "estimated_wait", _since(client), None)
        totals = await allowance_whatif(session, "horde_queue", _since(client), None)
    assert (same.total.decisions, same.total.changed, same.total.unknown) == (3, 0, 0)
    assert (
        same.total.would_be == same.total.in_force == {"free": 2, "funded": 0, "downgraded": 0, "refused": 1}
    )
    assert (totals.total.unknown, totals.total.unknown_totals) == (3, 3)


async def _job_free_pop(client: HordeClient, key: str) -> None:
    """Bring worker w1 online (a pop that finds nothing)."""
    empty = await client.pop(key, "w1", models=[MODEL], chat=CHAT_BLOCK, **LEGACY)
    assert empty.json()["id"] is None


# --- a candidate speed gate ------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_candidate_speed_gate_in_shadow_and_whatif_count_the_jobs_it_would_refuse(
    db_url: str, tmp_path: Path
) -> None:
    settings = make_settings(
        db_url, policies={"speed_gate": "prefer_capable", "candidate_speed_gate": "enforce_all"}
    )
    app = app_for(settings, ManualClock())
    async with AsyncTestClient(app=app, timeout=30) as http:
        client = HordeClient(http, app.state.horde)
        expected = await _mixed_fleet(client)
        candidates = await _all(client, CandidateRecord)
        assert len(candidates) == expected["refused"]
        assert {(c.kind, c.candidate, c.in_force, c.decision, c.candidate_decision) for c in candidates} == {
            ("speed_gate", "enforce_all", "prefer_capable", "assigned", "refused")
        }
        assert sorted(bool(c.capable_online) for c in candidates) == [False, False, True, True]

        async with client.horde.sessionmaker() as session:
            report = await speed_gate_whatif(session, "enforce_all", _since(client), None)
            chat_only = await speed_gate_whatif(session, "enforce_chat", _since(client), None)
            in_force = await speed_gate_whatif(session, "prefer_capable", _since(client), None)
        t = report.total
        assert (t.assignments, t.over_capacity) == (expected["assignments"], expected["refused"])
        assert (t.refused, t.moved, t.no_eligible_worker, t.capable_unknown) == (
            expected["refused"],
            expected["moved"],
            expected["no_worker"],
            0,
        )
        assert (t.aborts_avoided, t.completed, t.faulted, t.running) == (1, 2, 1, 0)
        assert t.service_seconds == 30 + 40  # the refused jobs that completed: pop to submit
        assert t.aborted_lease_seconds == 151
        # Summed over days: the manual clock starts at the wall clock's time, so the jobs may
        # straddle midnight (UTC) and fall in two days' cells.
        refused: dict[tuple[str, bool], int] = {}
        for c in report.cells:
            refused[(c.size_bucket, c.trusted)] = refused.get((c.size_bucket, c.trusted), 0) + c.refused
        assert refused == {
            ("<=512", False): 3,
            ("513-1024", False): 1,
        }
        assert report.in_force == ["prefer_capable"]
        # enforce_chat refuses only the two chat jobs; the gate in force refused nothing it assigned.
        assert (chat_only.total.refused, chat_only.total.moved, chat_only.total.no_eligible_worker) == (
            2,
            0,
            2,
        )
        assert in_force.total.refused == 0
        text = render_speed_gate(report)
        assert "Jobs this gate would have refused: 4. Moved to other workers" in text
        assert "not known: the wait a moved job would have had" in text

        if not is_postgres(db_url):  # the command itself, once, on the SQLite file
            env = {k: v for k, v in os.environ.items() if not k.startswith("HORDE_LITE_")}
            env["HORDE_LITE_DATABASE__URL"] = db_url
            day_ago = datetime.fromtimestamp(_since(client), tz=UTC).isoformat()
            run = await asyncio.to_thread(
                subprocess.run,
                [str(HORDE_LITE), "whatif", "--speed-gate", "enforce_all", "--since", day_ago],
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            assert run.returncode == 0, run.stderr
            assert (
                "Jobs this gate would have refused: 4. Moved to other workers (a capable worker was "
                "online): 2. Would have found no eligible worker: 2." in " ".join(run.stdout.split())
            )
            assert "Aborts avoided: 1" in run.stdout
            (tmp_path / "whatif.txt").write_text(run.stdout)
            bad = await asyncio.to_thread(
                subprocess.run,
                [str(HORDE_LITE), "whatif", "--speed-gate", "fastest"],
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            assert bad.returncode != 0
            flat = " ".join(bad.stderr.replace("│", " ").split())  # the CLI draws a box around errors
            assert "installed speed_gate policies: enforce_all, enforce_chat, off, prefer_capable" in flat


async def _mixed_fleet(client: HordeClient) -> dict[str, int]:
    """A slow worker (4 tokens/s: capacity 480) and a capable one (unmeasured: 1200) under
    prefer_capable. Returns what the test counts itself: every real assignment, the over-capacity
    ones (which enforce_all would refuse), and of those, the ones made while the capable worker was
    online (moved) or not (no worker)."""
    owner = await client.user("owner")
    # Two owners: a lapse refuses its request to every worker of the owner whose worker lapsed.
    keys = {"slow": owner, "fast": await client.user("other")}
    for name, key in keys.items():
        await client.pop(key, name, models=[MODEL], chat=CHAT_BLOCK, **LEGACY)
    await client.set_worker_speed("slow", 4.0)
    counted = {"assignments": 0, "refused": 0, "moved": 0, "no_worker": 0}

    async def submitted(job: dict[str, Any], by: str, state: str = "ok") -> None:
        await _submitted(client, keys[by], job, state)
        # Each submit measures its worker; keep the two speeds where the scenario put them.
        await client.set_worker_speed("slow", 4.0)
        await client.set_worker_speed("fast", None)

    def took(job: dict[str, Any], size: int, by: str, fast_online: bool) -> None:
        counted["assignments"] += 1
        if by == "slow" and size > 480:
            counted["refused"] += 1
            counted["moved" if fast_online else "no_worker"] += 1

    # The capable worker online. A legacy request of 512 goes to the slow worker (prefer_capable
    # refuses only chat requests), and completes after 30 s.
    await client.create(owner, models=[MODEL], params={"max_length": 512, "max_context_length": 1024})
    job = await _job(client, owner, "slow")
    took(job, 512, "slow", True)
    client.clock.advance(30)
    await submitted(job, "slow")
    # Another one lapses on the slow worker; then the capable worker takes it back (within capacity).
    await client.create(owner, models=[MODEL], params={"max_length": 512, "max_context_length": 1024})
    job = await _job(client, owner, "slow")
    took(job, 512, "slow", True)
    client.clock.advance(151)
    await client.pop(owner, "slow", models=[MODEL], chat=CHAT_BLOCK, **LEGACY)  # stays online, nothing for it
    assert (await client.sweep())[0] == 1
    job = await _job(client, keys["fast"], "fast")
    took(job, 512, "fast", True)
    await submitted(job, "fast")
    # A chat request of 512: refused to the slow worker while the capable one is online.
    await client.create(owner, models=[MODEL], chat={"messages": HI, "max_tokens": 512})
    assert (await client.pop(owner, "slow", models=[MODEL], chat=CHAT_BLOCK, **LEGACY)).json()["id"] is None
    job = await _job(client, keys["fast"], "fast")
    took(job, 512, "fast", True)
    await submitted(job, "fast")

    # The capable worker goes offline (no check-in for longer than the online window).
    client.clock.advance(301)
    await client.pop(owner, "slow", models=[MODEL], chat=CHAT_BLOCK, **LEGACY)
    await client.create(owner, models=[MODEL], chat={"messages": HI, "max_tokens": 512})
    job = await _job(client, owner, "slow")
    took(job, 512, "slow", False)
    await submitted(job, "slow", state="faulted")
    await client.create(owner, models=[MODEL], chat={"messages": HI, "max_tokens": 600})
    job = await _job(client, owner, "slow")
    took(job, 600, "slow", False)
    client.clock.advance(40)
    await submitted(job, "slow")
    # Within its capacity: nothing to refuse.
    await client.create(owner, models=[MODEL], chat={"messages": HI, "max_tokens": 256})
    job = await _job(client, owner, "slow")
    took(job, 256, "slow", False)
    await submitted(job, "slow")
    return counted


# --- a candidate allowance curve -------------------------------------------------------------------


async def test_a_candidate_allowance_curve_in_shadow_and_its_whatif(db_url: str) -> None:
    settings = make_settings(db_url, policies={"candidate_allowance_curve": "horde_queue"})
    app = app_for(settings, ManualClock())
    async with AsyncTestClient(app=app, timeout=30) as http:
        client = HordeClient(http, app.state.horde)
        rich = await client.user("rich", kudos=10_000)
        big = {"max_length": 8192, "max_context_length": 16384}
        await client.pop(rich, "w1", models=[MODEL], **big)  # online: a short wait, the ceiling (4096)
        asks = {"max_length": 1024, "max_context_length": 2048}
        answers = [
            await client.create(ANON, models=[MODEL], params=asks),  # free; horde_queue: refused
            await client.create(rich, models=[MODEL], params=asks),  # free; horde_queue: funded
            await client.create(ANON, models=[MODEL], params=asks, allow_downgrade=True),  # -> downgraded
            await client.create(ANON, models=[MODEL], params={"max_length": 256}),  # free under both
            await client.create(
                ANON, models=[MODEL], params={**big, "max_context_length": 9000}
            ),  # refused by both
            await client.create(ANON, models=[MODEL], params=asks, dry_run=True),  # a dry run: no record
        ]
        assert [a.status_code for a in answers] == [202, 202, 202, 202, 403, 200]

        admissions = sorted(await _all(client, AdmissionRecord), key=lambda a: a.id)
        # estimated_wait: the queue ahead lengthens the wait, yet each stays free but the 8192 one.
        assert [a.outcome for a in admissions] == ["free", "free", "free", "free", "refused"]
        assert admissions[0].allowance == 4096
        # The candidate reads the horde-wide totals, so they were read and kept.
        assert [(a.online_text_threads, a.queued_text_requests) for a in admissions] == [
            (1, 1),
            (1, 2),
            (1, 3),
            (1, 4),
            (1, 5),
        ]
        assert [(a.can_fund, a.downgrade_allowed) for a in admissions] == [
            (False, False),  # read for the candidate: anonymous
            (True, False),
            (False, True),
            (None, False),  # free under both: never read
            (False, False),
        ]
        candidates = sorted(await _all(client, CandidateRecord), key=lambda c: c.id)
        # horde_queue: 512 + 5 x 1 thread - 0.9 x queued, at most 512.
        assert [
            (c.decision, c.candidate_decision, c.allowance, c.candidate_allowance, c.request_id)
            for c in candidates
        ] == [
            (a.outcome, outcome, a.allowance, 512, a.request_id)
            for a, outcome in zip(
                admissions, ["refused", "funded", "downgraded", "free", "refused"], strict=True
            )
        ]
        assert candidates[-1].request_id is None
        assert {(c.kind, c.candidate, c.in_force) for c in candidates} == {
            ("allowance_curve", "horde_queue", "estimated_wait")
        }

        async with client.horde.sessionmaker() as session:
            report = await allowance_whatif(session, "horde_queue", _since(client), None)
            cheap = await allowance_whatif(session, "horde_queue", _since(client), None, {"maximum": 300})
            waits = await allowance_whatif(session, "jobs_per_thread", _since(client), None)
        t = report.total
        assert (t.decisions, t.unknown, t.changed, t.allowance_lower) == (5, 0, 3, 5)
        assert t.in_force == {"free": 4, "funded": 0, "downgraded": 0, "refused": 1}
        assert t.would_be == {"free": 1, "funded": 1, "downgraded": 1, "refused": 2}
        assert t.transitions == {"free -> refused": 1, "free -> funded": 1, "free -> downgraded": 1}
        # With a lower maximum, the 256-token request is still free; the rest as before.
        assert cheap.total.would_be == {"free": 1, "funded": 1, "downgraded": 1, "refused": 2}
        assert cheap.options == {"maximum": 300}
        # jobs_per_thread (0 to 4 jobs ahead per thread): the same outcomes as the curve in force.
        assert waits.total.changed == 0
        assert "free -> refused 1" in render_allowance(report)


# --- start-up --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "kind", "installed"),
    [
        ("candidate_speed_gate", "speed_gate", "enforce_all, enforce_chat, off, prefer_capable"),
        ("candidate_allowance_curve", "allowance_curve", "estimated_wait, horde_queue, jobs_per_thread"),
    ],
)
def test_a_candidate_that_is_not_installed_stops_start_up(setting: str, kind: str, installed: str) -> None:
    settings = make_settings("sqlite+aiosqlite:///does-not-matter.db", policies={setting: "fastest"})
    with pytest.raises(PolicyError) as info:
        create_app(settings, ManualClock(), run_sweeper=False)
    assert str(info.value) == (
        f"[policies] {setting} = 'fastest' is not installed; installed {kind} policies: {installed}"
    )


# --- the prose says what is missing --------------------------------------------------------------


# A dash standing alone for a value ("in force: -", "held their lease - before"); list bullets, the
# table's "in force -> would be" arrows and hyphenated words are not placeholders.
BARE_DASH = r"(^|\s|:)-(\s|$|\))"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["--speed-gate", "enforce_all"],
            [
                "gate in force: none known (no assignment recorded in this window)",
                "Aborts avoided: none",
                "no job this gate would have refused completed",
            ],
        ),
        (
            ["--allowance-curve", "horde_queue"],
            ["curve in force: none known (no admission recorded in this window)"],
        ),
    ],
    ids=["speed-gate", "allowance-curve"],
)
def test_whatif_over_an_empty_window_says_in_words_what_is_missing(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], words: list[str]
) -> None:
    import re

    from click.testing import CliRunner

    from horde_lite import cli
    from tests.support.cli import point_settings_at

    point_settings_at(db_url, tmp_path, monkeypatch)
    result = CliRunner().invoke(cli.cli, ["whatif", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    for expected in words:
        assert expected in result.stdout
    lines = result.stdout.splitlines()
    prose = [line.removeprefix("- ") for line in lines if not line.startswith(("day", "total", "20"))]
    assert [line for line in prose if re.search(BARE_DASH, line)] == [], result.stdout
