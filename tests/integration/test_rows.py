"""Rows written with Core inserts from ORM objects (`horde_lite.db.rows`, used where admission queues
a request, its records and its hold) read back exactly as the ORM's own flush writes them: every
column, the defaults of the columns the object was not given included. Both databases."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import inspect, select

from horde_lite.accounts.kudos import hold_key
from horde_lite.db.models import AdmissionRecord, Base, KudosHold, TextRequest, User
from horde_lite.db.rows import insert_rows
from tests.support.horde import HordeClient


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
