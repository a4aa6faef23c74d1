"""The prompt filters' rules without a database: what a pattern may be (checked in a bounded child
process), what a filter type does, and screening's order, bounds and rewriting of chat texts."""

from __future__ import annotations

import itertools

import msgspec
import pytest

from horde_lite.core.errors import HordeError
from horde_lite.filters import patterns
from horde_lite.filters.cache import Compiled, FilterSet
from horde_lite.filters.patterns import Action, action_of, compile_pattern
from horde_lite.filters.screen import chat_texts, inspect, screen, with_chat_texts
from horde_lite.inputs import ChatPayload
from horde_lite.rc import Rc
from horde_lite.settings import FilterSettings

BOUNDS = FilterSettings()


def _filter(filter_id: int, pattern: str, filter_type: int, replacement: str = "") -> Compiled:
    return Compiled(
        filter_id, filter_type, action_of(filter_type), compile_pattern(pattern), None, replacement
    )


def test_types_10_to_19_refuse_and_20_to_29_replace() -> None:
    assert {action_of(t) for t in range(10, 20)} == {Action.BLOCK}
    assert {action_of(t) for t in range(20, 30)} == {Action.REPLACE}


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("", "is empty"),
        ("a" * 2001, "longer than 2000"),
        ("a{1001}", "above 1000"),
        ("a{2,99999999999999999999999}", "above 1000"),
        ("(?:a|bc){200000}", "above 1000"),  # this one crashes the library's compiler outright
    ],
)
def test_what_is_refused_before_anything_compiles(pattern: str, problem: str) -> None:
    found = patterns.static_problem(pattern)
    assert found is not None
    assert problem in found


def test_the_probes_run_the_patterns_own_letters() -> None:
    found = dict(patterns.probes("(x+Y+)+z"))
    assert {"a run of 'x'", "a run of 'y'", "a run of 'z'", "words", "spaces"} <= set(found)
    assert len(found["a run of 'x'"]) == patterns.PROBE_CHARS + 1


@pytest.mark.parametrize(
    ("pattern", "said"),
    [
        ("((a{100}){100}){100}", "memory"),
        ("(x+x+)+y", "catastrophic"),
        ("(?<=a", "not a valid pattern"),
        ("(?=)", "empty text"),
    ],
)
async def test_the_child_refuses_what_the_server_could_not_afford(pattern: str, said: str) -> None:
    with pytest.raises(HordeError) as refused:
        await patterns.check(pattern)
    assert refused.value.rc is Rc.BadRequest
    assert said in refused.value.message
    assert refused.value.extra["errors"]["regex"] in refused.value.message


async def test_the_child_passes_what_upstream_writes() -> None:
    for pattern in (r"(?<!1)girl", r"\bkill\s+(all|every)\s+\w+", "|".join(f"w{i}" for i in range(200))):
        await patterns.check(pattern)


def test_blocking_comes_first_and_reads_the_texts_as_sent() -> None:
    # The replacement would make "bad" out of "good": the block reads what was sent.
    filters = FilterSet((_filter(1, "bad", 10),), (_filter(2, "good", 20, "bad"),))
    assert screen(filters, ["good"], BOUNDS).texts == ["bad"]
    refused = screen(filters, ["fine", "BAD"], BOUNDS)
    assert (refused.refused_by, refused.timed_out) == (filters.blocking[0], False)


def test_replacements_apply_in_order_literally_and_within_the_growth_bound() -> None:
    filters = FilterSet((), (_filter(1, "(cat)", 20, r"\1 \g<1>"), _filter(2, "dog", 21, "")))
    assert screen(filters, ["cat dog", ""], BOUNDS).texts == [r"\1 \g<1> ", ""]
    growing = FilterSet((), (_filter(1, "a", 20, "b" * 255),))
    assert screen(growing, ["a" * 4], BOUNDS).texts == ["b" * 1020]  # within 2 x 4 + 1024
    too_long = screen(growing, ["a" * 5], BOUNDS)  # 1275 > 2 x 5 + 1024
    assert (too_long.refused_by, too_long.too_long, too_long.texts) == (growing.replacing[0], True, ["a" * 5])


def test_the_requests_bound_stops_the_matching() -> None:
    """A clock past the deadline before the second filter: refused as cut off, never let through."""
    ticks = itertools.count(0.0, 0.4)
    filters = FilterSet((_filter(1, "x", 10), _filter(2, "y", 10)), ())
    refused = screen(filters, ["zzz"], BOUNDS, clock=lambda: next(ticks))
    assert (refused.refused_by, refused.timed_out) == (filters.blocking[1], True)
    checked = inspect(filters, "zzz", BOUNDS, clock=lambda: next(itertools.count(0.0, 0.4)))
    assert checked.hits == []  # a fresh clock: both matched in time


def test_a_chat_payloads_texts_are_read_and_written_in_order() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://x/y.png"}}
    parts = [{"type": "text", "text": "two"}, image, {"type": "text", "text": "three"}]
    messages = [
        {"role": "system", "content": "one"},
        {"role": "user", "content": parts},
        {"role": "assistant", "content": None},
    ]
    payload = msgspec.convert({"messages": messages}, ChatPayload)
    assert chat_texts(payload) == ["one", "two", "three"]
    rewritten = with_chat_texts(payload, ["1", "2", "3"])
    assert [m.content for m in rewritten.messages] == [
        "1", [{"type": "text", "text": "2"}, image, {"type": "text", "text": "3"}], None,
    ]  # fmt: skip
