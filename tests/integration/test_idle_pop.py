"""An idle pop (a known worker, nothing for it) is answered before any transaction by one
statement, which reads its owner and worker, its `skipped` counts and whether its first page holds a
row: the answer is the one the whole pop gives. One whose check-in is due writes it in one more
statement: alone on PostgreSQL, in a transaction on SQLite, and neither counts `skipped` again."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from horde_lite.accounts.workers import CHECK_IN_RESOLUTION
from horde_lite.db.engine import READ_ONLY
from horde_lite.db.models import Worker
from tests.support.horde import ANON, HordeClient
from tests.support.statements import statements_sent

SMALL = {"max_length": 256, "max_context_length": 2048}


async def _queue(client: HordeClient, too_long: int, too_wide: int) -> None:
    rich = await client.user("rich", kudos=1_000_000)
    for _ in range(too_long):  # too long and too wide: counted as too long only
        await client.create(ANON, params={"max_length": 300, "max_context_length": 4096})
    for _ in range(too_wide):
        await client.create(ANON, params={"max_length": 100, "max_context_length": 4096})
    chat = {"messages": [{"role": "user", "content": "Hi."}], "max_tokens": 300}
    assert (await client.create(rich, chat=chat)).status_code == 202  # counted under neither


async def _idle(client: HordeClient, key: str, name: str) -> dict[str, Any]:
    answer = (await client.pop(key, name, **SMALL)).json()
    assert answer["id"] is None
    return answer


async def test_an_idle_pop_of_a_known_worker_answers_as_a_first_pop(client: HordeClient) -> None:
    key = await client.user("owner")
    known = await _idle(client, key, "known")  # created: the whole pop
    assert known == {"id": None, "ids": [], "payload": {}, "skipped": {}, "messages": []}
    await _queue(client, too_long=3, too_wide=2)
    with statements_sent(client.horde.engine) as sent:
        idle = await _idle(client, key, "known")  # known, nothing to write: answered by the look
    assert [s.statement.lstrip()[:12] for s in sent] == ["SELECT users"]  # no page read, no transaction
    first = await _idle(client, key, "new")  # a first pop: counted in the pop's transaction
    assert idle["skipped"] == first["skipped"] == {"max_length": 3, "max_context_length": 2}
    assert idle == first


async def test_an_idle_pop_counts_only_what_its_worker_is_too_small_for(client: HordeClient) -> None:
    key = await client.user("owner")
    await _idle(client, key, "known")
    await _queue(client, too_long=0, too_wide=2)
    assert (await _idle(client, key, "known"))["skipped"] == {"max_context_length": 2}
    wide = (await client.pop(key, "known", max_length=256, max_context_length=4096)).json()
    assert wide["id"] is not None  # its new declaration fits: the whole pop hands a job


async def _check_in_of(client: HordeClient, name: str) -> tuple[float, str | None]:
    async with client.horde.sessionmaker() as session:
        query = select(Worker.last_check_in, Worker.ipaddr).where(Worker.name == name)
        row = (await session.execute(query)).one()
        return float(row[0]), row[1]


async def test_an_idle_pop_whose_check_in_is_due_writes_it_alone(client: HordeClient) -> None:
    key = await client.user("owner")
    await _idle(client, key, "known")
    await _queue(client, too_long=3, too_wide=2)
    client.clock.advance(CHECK_IN_RESOLUTION)
    with statements_sent(client.horde.engine) as sent:
        due = await _idle(client, key, "known")
    assert due == await _idle(client, key, "new")  # what a first pop answers
    assert due["skipped"] == {"max_length": 3, "max_context_length": 2}
    assert (await _check_in_of(client, "known"))[0] == client.clock.now()
    work = [s for s in sent if not s.control]
    assert len(work) == 2, [s.statement for s in work]  # the look (owner, worker, `skipped`, probe), stamp
    stamp = work[-1]
    assert stamp.statement.lstrip().upper().startswith("UPDATE WORKERS"), stamp.statement
    postgres = client.horde.engine.dialect.name == "postgresql"
    assert bool(stamp.options.get(READ_ONLY)) is postgres  # PostgreSQL: on the reading connection
    assert any(s.control for s in sent) is not postgres  # SQLite: in a transaction (BEGIN IMMEDIATE)
    # Not due again at once: the next idle pop writes nothing.
    client.clock.advance(1)
    with statements_sent(client.horde.engine) as sent:
        await _idle(client, key, "known")
    assert not any(s.statement.lstrip().upper().startswith("UPDATE") for s in sent)
    assert (await _check_in_of(client, "known"))[0] == client.clock.now() - 1
