"""Rows written with Core inserts from ORM objects (`horde_lite.db.rows`, used where admission queues
a request, its records and its hold) read back exactly as the ORM's own flush writes them: every
column, the defaults of the columns the object was not given included. Both databases."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, cast

import pytest
from sqlalchemy import Table, inspect, select
from sqlalchemy.orm.attributes import get_history

from horde_lite.accounts.kudos import hold_key
from horde_lite.db.models import (
    AdmissionRecord,
    Base,
    KudosEvent,
    KudosHold,
    RequestModel,
    TextRequest,
    UsageRecord,
    User,
)
from horde_lite.db.rows import WRITES_TOGETHER, Write, insert_rows, values_of, write_all_changes, write_rows
from tests.support.horde import HordeClient
from tests.support.statements import statements_sent


def _request(user_id: int, request_id: str) -> TextRequest:
    # Only what admission always gives; everything else takes its column default.
    return TextRequest(
        id=request_id, user_id=user_id, requester_kind="registered", max_length=64, max_context_length=1024,
        effective_start=10.0, created_at=10.0, expires_at=1210.0, requested_max_length=64,
        models=["a-7B"], params={"max_length": 64},
    )  # fmt: skip


def _hold(user_id: int, request_id: str) -> KudosHold:
    return KudosHold(key=hold_key(request_id), user_id=user_id, request_id=request_id, amount=5.0,
                     remaining=5.0, active=True, created_at=10.0)  # fmt: skip


def _record(user_id: int, request_id: str) -> AdmissionRecord:
    return AdmissionRecord(at=10.0, request_id=request_id, requester_kind="registered", is_chat=False,
                           requested_max_length=64, n=1, allowance=512, outcome="free",
                           allowance_curve="estimated_wait")  # fmt: skip


def _columns(row: Base) -> dict[str, Any]:
    skip = {"id", "key", "request_id"}  # what differs between the two copies by construction
    return {a.key: getattr(row, a.key) for a in inspect(row).mapper.column_attrs if a.key not in skip}


@pytest.mark.parametrize("make", [_request, _hold, _record], ids=["request", "hold", "record"])
async def test_a_core_insert_writes_what_a_flush_writes(
    client: HordeClient, make: Callable[[int, str], Base]
) -> None:
    await client.user("owner")
    async with client.horde.sessionmaker() as session, session.begin():
        user_id = (await session.execute(select(User.id).where(User.username == "owner"))).scalar_one()
        flushed_id, inserted_id = str(uuid.uuid4()), str(uuid.uuid4())
        for request_id in (flushed_id, inserted_id):
            if make is not _request:  # holds and records refer to a request
                await insert_rows(session, [_request(user_id, request_id)])
        session.add(make(user_id, flushed_id))
        await session.flush()
        inserted = make(user_id, inserted_id)
        await insert_rows(session, [inserted])
    async with client.horde.sessionmaker() as session:
        model = type(inserted)
        rows = (await session.execute(select(model))).scalars().all()
        by_request = {row.request_id if model is not TextRequest else row.id: row for row in rows}
        assert _columns(by_request[inserted_id]) == _columns(by_request[flushed_id])


async def test_changes_of_several_rows_are_written_in_one_call(client: HordeClient) -> None:
    """`write_all_changes` writes each row's changed attributes among those named, nothing else, and
    leaves the objects with nothing for the commit's flush to write (those written whole leave the
    session)."""
    await client.user("owner")
    await client.user("other")
    request_id = str(uuid.uuid4())
    async with client.horde.sessionmaker() as session, session.begin():
        users = (await session.execute(select(User).order_by(User.username))).scalars().all()
        owner = next(u for u in users if u.username == "owner")
        other = next(u for u in users if u.username == "other")
        await insert_rows(session, [_request(owner.id, request_id)])
        request = (await session.execute(select(TextRequest))).scalar_one()
        owner.kudos, owner.trusted = 123.5, True
        other.kudos = other.kudos  # named, unchanged: nothing to write for it
        request.state, request.kudos_spent, request.prompt = "done", 7.25, "not named, not written"
        await write_all_changes(
            session, ((owner, ("kudos", "trusted")), (other, ("kudos",)), (request, ("state", "kudos_spent")))
        )
        assert not get_history(owner, "kudos").has_changes()
        assert not get_history(request, "state").has_changes()
        assert get_history(request, "prompt").has_changes()  # left to the flush, which writes it
        # Written whole, the owner leaves the session: the commit has no flush to run for it. The
        # request, with a change left, stays for the flush; `other` was not written.
        assert owner not in session
        assert request in session
        assert other in session
        session.expunge(request)  # so the commit's flush writes nothing of it
    async with client.horde.sessionmaker() as session:
        users = {u.username: u for u in (await session.execute(select(User))).scalars()}
        stored = (await session.execute(select(TextRequest))).scalar_one()
    assert (users["owner"].kudos, users["owner"].trusted) == (123.5, True)
    assert users["other"].kudos == other.kudos
    assert (stored.state, stored.kudos_spent, stored.prompt) == ("done", 7.25, "")


async def test_several_writes_together_write_what_their_statements_write(client: HordeClient) -> None:
    """`write_rows`: an update, an insert and inserts of two rows referring to it, sent together (one
    statement on PostgreSQL), store what a flush stores, the inserted row's defaults included; so do
    writes to one table apart from each other."""
    await client.user("owner")
    flushed_id, written_id = str(uuid.uuid4()), str(uuid.uuid4())
    async with client.horde.sessionmaker() as session, session.begin():
        owner = (await session.execute(select(User).where(User.username == "owner"))).scalar_one()
        session.add(_request(owner.id, flushed_id))
        await session.flush()
        users, requests = cast(Table, User.__table__), cast(Table, TextRequest.__table__)
        models = cast(Table, RequestModel.__table__)
        await write_rows(session, [
            Write(users, {"kudos": 42.5}, owner.id),
            Write(requests, values_of(_request(owner.id, written_id))),
            Write(models, {"request_id": written_id, "model": "a-7B"}),
            Write(models, {"request_id": written_id, "model": "b-13B"}),
        ])  # fmt: skip
        # A table written by two parts apart, the same table twice (each row a part of its own).
        await write_rows(session, [
            Write(models, {"request_id": written_id, "model": "c-1B"}),
            Write(users, {"kudos": 50.0}, owner.id),
            Write(models, {"request_id": written_id, "model": "d-1B"}),
        ])  # fmt: skip
    async with client.horde.sessionmaker() as session:
        kudos = (await session.execute(select(User.kudos).where(User.username == "owner"))).scalar_one()
        by_id = {r.id: r for r in (await session.execute(select(TextRequest))).scalars()}
        listed = (await session.execute(select(RequestModel.request_id, RequestModel.model))).all()
    assert kudos == 50.0
    assert _columns(by_id[written_id]) == _columns(by_id[flushed_id])
    assert sorted(m for r, m in listed if r == written_id) == ["a-7B", "b-13B", "c-1B", "d-1B"]


async def test_writes_sent_together_are_compiled_once(client: HordeClient) -> None:
    """Every statement `write_rows` sends is one SQLAlchemy can cache (a statement without a cache
    key is compiled again at every execution, and never enters the cache): two rows into one table,
    an adding insert and an update leave each statement they sent in the connection's cache."""
    await client.user("owner")
    compiled: dict[Any, Any] = {}
    async with client.horde.sessionmaker() as session, session.begin():
        await session.connection(execution_options={"compiled_cache": compiled})
        owner = (await session.execute(select(User).where(User.username == "owner"))).scalar_one()
        before = len(compiled)
        granted = {"user_id": owner.id, "kind": "grant", "ref": "a", "created_at": 1.0}
        await write_rows(session, [
            Write(_events, {**granted, "amount": 1.0}),
            Write(_events, {**granted, "amount": 2.0}),
            Write(_usage, _used(owner.id, jobs=1), adds=("jobs", "tokens")),
            Write(cast(Table, User.__table__), {"kudos": 3.0}, owner.id),
        ])  # fmt: skip
    statements = 1 if client.horde.engine.dialect.name == "postgresql" else 3
    assert len(compiled) - before == statements


async def test_an_adding_insert_adds_to_the_row_it_meets(client: HordeClient) -> None:
    """A `Write` with `adds` inserts its row, or adds those columns to the row of its primary key;
    alone or beside other writes (one statement on PostgreSQL), the other columns as first written."""
    await client.user("owner")
    async with client.horde.sessionmaker() as session, session.begin():
        owner = (await session.execute(select(User).where(User.username == "owner"))).scalar_one()
        await write_rows(
            session, [Write(_usage, _used(owner.id, jobs=1, tokens=10), adds=("jobs", "tokens"))]
        )
        await write_rows(session, [
            Write(_usage, _used(owner.id, jobs=2, tokens=5, owner_id=999), adds=("jobs", "tokens")),
            Write(cast(Table, User.__table__), {"kudos": 7.0}, owner.id),
        ])  # fmt: skip
        await write_rows(session, [Write(_usage, _used(owner.id, jobs=4, tokens=1), adds=("jobs",))])
    async with client.horde.sessionmaker() as session:
        row = (await session.execute(select(UsageRecord))).scalar_one()
        kudos = (await session.execute(select(User.kudos).where(User.id == owner.id))).scalar_one()
    assert (row.jobs, row.tokens, row.owner_id, kudos) == (7, 15, owner.id, 7.0)


_events = cast(Table, KudosEvent.__table__)
_usage = cast(Table, UsageRecord.__table__)


def _used(user_id: int, *, jobs: int, tokens: int = 0, owner_id: int | None = None) -> dict[str, Any]:
    return {"hour": 3600, "user_id": user_id, "worker_id": "w", "model": "m", "shared_key_hash": "",
            "owner_id": owner_id or user_id, "requests": 0, "jobs": jobs, "tokens": tokens,
            "kudos_spent": 0.0, "kudos_earned": 0.0}  # fmt: skip


async def test_more_writes_than_go_together_are_sent_apart(client: HordeClient) -> None:
    """Past `WRITES_TOGETHER` writes, each run of one shape is its own statement (an executemany):
    what they store is the same."""
    await client.user("owner")
    request_id = str(uuid.uuid4())
    models = cast(Table, RequestModel.__table__)
    async with client.horde.sessionmaker() as session, session.begin():
        owner = (await session.execute(select(User).where(User.username == "owner"))).scalar_one()
        await insert_rows(session, [_request(owner.id, request_id)])
        named = [f"m{i}-7B" for i in range(WRITES_TOGETHER)]
        with statements_sent(client.horde.engine) as sent:
            await write_rows(session, [
                Write(cast(Table, User.__table__), {"kudos": 9.0}, owner.id),
                *(Write(models, {"request_id": request_id, "model": m}) for m in named),
            ])  # fmt: skip
    assert len(sent) == 2  # the update, then one executemany of the model rows
    async with client.horde.sessionmaker() as session:
        stored = (await session.execute(select(RequestModel.model))).scalars().all()
        kudos = (await session.execute(select(User.kudos).where(User.username == "owner"))).scalar_one()
    assert (sorted(stored), kudos) == (sorted(named), 9.0)
