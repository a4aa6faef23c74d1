"""The waiting pops' registry (jobs/pop_waiters.py) on its own: whom a wake-up wakes, and how a
wake-up nobody could use is handed on, at most once to each matching waiter; the jobs
notification's payload (core/notify.py) read back, bounded and refused when malformed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from horde_lite.core.notify import JobsArrived
from horde_lite.jobs.pop_waiters import MARGIN, PopWaiters, Waiter
from horde_lite.metrics import Metrics
from tests.support import prom


@pytest.fixture
def metrics() -> Iterator[Metrics]:
    made = Metrics()
    yield made
    made.shutdown()


def woken(waiters: list[Waiter]) -> list[int]:
    return [i for i, w in enumerate(waiters) if w.event.is_set()]


def settle(registry: PopWaiters, waiter: Waiter, jobs: int) -> None:
    """What a woken pop does: its event cleared, then its try reported."""
    waiter.event.clear()
    registry.tried(waiter, jobs)


async def test_a_wake_up_wakes_its_jobs_and_the_margin_longest_waiting_first(metrics: Metrics) -> None:
    registry = PopWaiters(metrics, 1.0)
    waiters = [registry.enter(["m"]) for _ in range(10)]
    registry.wake(["m"], 2, "local")
    assert woken(waiters) == list(range(2 + MARGIN))


async def test_only_matching_waiters_wake_and_no_model_matches_all(metrics: Metrics) -> None:
    registry = PopWaiters(metrics, 1.0)
    others = [registry.enter(["other"]) for _ in range(3)]
    mine = registry.enter(["m", "x"])
    registry.wake(["m"], 1, "local")
    assert woken(others) == []
    assert mine.event.is_set()
    registry.wake([], 1, "local")  # a request naming no model: the idle waiters first
    assert woken(others) == [0, 1, 2]
    assert len(mine.wakes) == 1  # already woken: it comes after the idle ones


async def test_a_job_taken_hands_nothing_on(metrics: Metrics) -> None:
    registry = PopWaiters(metrics, 1.0)
    waiters = [registry.enter(["m"]) for _ in range(10)]
    registry.wake(["m"], 1, "local")
    first, *rest = (waiters[i] for i in woken(waiters))
    settle(registry, first, 1)
    for waiter in rest:
        settle(registry, waiter, 0)
    assert woken(waiters) == []
    text = metrics.render()[0].decode()
    assert prom.value(text, "horde_pop_wakeups_total") == 1 + MARGIN
    assert prom.value(text, "horde_pop_woken_total", outcome="job") == 1


async def test_a_job_nobody_takes_passes_each_matching_waiter_once(metrics: Metrics) -> None:
    registry = PopWaiters(metrics, 1.0)
    waiters = [registry.enter(["m"]) for _ in range(10)]
    registry.enter(["other"])
    registry.wake(["m"], 1, "local")
    tries = 0
    while woken(waiters):
        for i in woken(waiters):
            settle(registry, waiters[i], 0)
            tries += 1
        assert tries <= len(waiters)
    assert tries == len(waiters)
    text = metrics.render()[0].decode()
    assert prom.value(text, "horde_pop_wakeups_total", source="handed") == len(waiters) - (1 + MARGIN)


async def test_a_waiter_that_leaves_with_a_wake_up_hands_it_on(metrics: Metrics) -> None:
    registry = PopWaiters(metrics, 1.0)
    waiters = [registry.enter(["m"]) for _ in range(5)]
    registry.wake(["m"], 1, "local")
    gone = woken(waiters)
    for i in gone:
        registry.leave(waiters[i])  # their clients went before trying
    assert [i for i in woken(waiters) if i not in gone] == [1 + MARGIN]


async def test_a_switch_wakes_every_waiter_once_and_hands_nothing_on(metrics: Metrics) -> None:
    registry = PopWaiters(metrics, 1.0)
    waiters = [registry.enter(["m"]) for _ in range(4)]
    registry.wake_all()
    assert woken(waiters) == [0, 1, 2, 3]
    for waiter in waiters:
        settle(registry, waiter, 0)
    assert woken(waiters) == []


def test_the_jobs_payload_reads_back_and_stays_bounded() -> None:
    arrived = JobsArrived("r1", ("a:b", "c,d", 'q"uote'), 3)
    token, _, body = arrived.payload("tok").partition(":")
    assert token == "tok"
    assert JobsArrived.parse(body) == arrived
    many = JobsArrived("r2", tuple("m" * 255 + str(i) for i in range(100)), 1)
    payload = many.payload("tok")
    assert len(payload.encode()) < 8000
    assert JobsArrived.parse(payload.partition(":")[2]) == JobsArrived("r2", (), 1)  # any model


@pytest.mark.parametrize(
    "body", ["", "x", "[]", '["r", "1", []]', '["r", 1]', '{"a": 1}', "[1, 1, []]", "null"]
)
def test_a_malformed_jobs_payload_is_ignored(body: str) -> None:
    assert JobsArrived.parse(body) is None


async def test_the_watcher_tells_the_idle_answers_only_once_it_has_read_and_while_its_reads_work(
    metrics: Metrics,
) -> None:
    """`watched` starts the watcher for the idle answers (no pop waits), returns its generation
    once it has read where the change log stands, tells what it finds (a request's models; none
    for "too many to list"), None after a failed read, and a new generation for a new watcher."""
    told: list[tuple[str, ...]] = []
    reads: list[int | None] = []
    answers: list[tuple[int, list[JobsArrived] | None] | Exception] = [
        (5, []), (6, [JobsArrived("r", ("m",), 1)]), (7, None), RuntimeError("database away"), (8, []),
    ]  # fmt: skip

    read = {n: asyncio.Event() for n in (4, 5)}

    async def changed(last: int | None) -> tuple[int, list[JobsArrived] | None]:
        reads.append(last)
        if len(reads) in read:
            read[len(reads)].set()  # seen by the test once this read has been taken in
        answer = answers.pop(0) if answers else (8, [])
        if isinstance(answer, Exception):
            raise answer
        return answer

    registry = PopWaiters(metrics, 0.05, changed=changed, told=lambda models: told.append(tuple(models)))
    assert registry.watched(0.3) is None  # started: it has not read yet
    await registry.watching()
    first = registry.watched(0.3)
    assert first is not None
    await read[4].wait()
    assert told[:2] == [("m",), ()]
    assert registry.watched(0.3) is None  # its last read failed
    await read[5].wait()
    assert registry.watched(0.05) == first  # the same watcher, reading again
    await asyncio.sleep(0.5)  # no pop waits and nobody asks: it stops
    assert registry.watched(0.3) is None  # a new watcher, not yet read
    await registry.watching()
    assert registry.watched(0.3) == first + 1
    await registry.stop()
