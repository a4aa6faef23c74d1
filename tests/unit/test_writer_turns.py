"""WriterTurns (db/writer_turns.py): one turn at a time, none nested, a bounded wait."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import exc

from horde_lite.db.writer_turns import WriterTurns


async def _holding(turns: WriterTurns) -> tuple[asyncio.Task[None], asyncio.Event]:
    """A task that holds a turn until the returned event is set."""
    inside, done = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with turns.turn():
            inside.set()
            await done.wait()

    task = asyncio.create_task(hold())
    await inside.wait()
    return task, done


async def test_a_turn_not_given_within_the_patience_is_a_pool_timeout() -> None:
    turns = WriterTurns(enabled=True, patience=0.05)
    holder, done = await _holding(turns)
    with pytest.raises(exc.TimeoutError):
        async with turns.turn():
            pass
    done.set()
    await holder
    async with asyncio.timeout(1):  # the turn is free again, and the timed-out wait took nothing
        async with turns.turn():
            pass


async def test_a_turn_taken_inside_a_turn_does_not_wait_for_it() -> None:
    turns = WriterTurns(enabled=True, patience=5)
    async with turns.turn(), asyncio.timeout(1):
        async with turns.turn():
            pass
        await asyncio.create_task(_enter(turns))  # a task started inside one holds it too


async def _enter(turns: WriterTurns) -> None:
    async with turns.turn():
        pass


async def test_disabled_turns_never_wait() -> None:
    turns = WriterTurns(enabled=False, patience=0.05)
    holder, done = await _holding(turns)
    async with turns.turn():  # no TimeoutError: nothing is held
        pass
    done.set()
    await holder
