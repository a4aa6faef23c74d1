"""Screening a request's texts against the filters in force: the rule admission applies to every
prompt (POST /generate/text/async, /v1/completions) and every chat message's text (its content, or
each text part of it; the native `chat` payload and /v1/chat/completions), before the request is
judged, so a refused request is never authenticated, priced or stored.

- Blocking filters (types 10 to 19) are matched first, against the texts as sent: the first match
  refuses the request (`CorruptPrompt`), in the words of the filter's description (a generic
  line when it has none), never its pattern.
- Then each replacing filter (types 20 to 29), in id order, replaces every match with its
  replacement, taken literally; the request is admitted with the replaced texts.
- Bounds: each match is cut off after `[filters] match_seconds` and all of one request's matching
  after `admission_seconds`; either refuses the request (it fails closed) and is logged. A text
  may grow by replacements to twice its length plus `GROWTH` characters; past it the request is
  refused too.

The matching runs in a worker thread (the `regex` package releases the interpreter's lock while it
matches), so a slow match holds up its own request, not the server's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import regex

from horde_lite.core.context import Caller, Horde
from horde_lite.core.errors import HordeError
from horde_lite.filters.cache import Compiled, FilterSet
from horde_lite.filters.patterns import Action
from horde_lite.inputs import ChatMessage, ChatPayload, TextRequestInput
from horde_lite.rc import Rc
from horde_lite.settings import FilterSettings

log = logging.getLogger("horde_lite.filters")

GROWTH = 1024  # characters a text may grow by beyond doubling, through replacements
GENERIC = "This prompt appears to violate this horde's terms of service."
SHOWN_MATCH = 200  # characters of a match a moderator's check shows


@dataclass(frozen=True, slots=True)
class Screened:
    """The texts as admitted (replacements made), or the filter that refused them."""

    texts: list[str]
    refused_by: Compiled | None = None
    timed_out: bool = False  # refused because a match or the request's matching ran out of time
    too_long: bool = False  # refused because replacements would grow a text past its bound


class _TooLong(Exception):
    pass


def _replace(f: Compiled, text: str, ceiling: int, timeout: float) -> str:
    """`text` with every match of `f` replaced by its replacement, literally; `_TooLong` as soon as
    the result would pass `ceiling` characters (before it is built)."""
    length = len(text)

    def one(match: regex.Match[str]) -> str:
        nonlocal length
        length += len(f.replacement) - (match.end() - match.start())
        if length > ceiling:
            raise _TooLong
        return f.replacement

    return f.pattern.sub(one, text, timeout=timeout, concurrent=True)


def screen(
    filters: FilterSet,
    texts: Sequence[str],
    bounds: FilterSettings,
    clock: Callable[[], float] = time.monotonic,
) -> Screened:
    """Apply `filters` to `texts` within `bounds` (see the module's rule). Blocking before replacing."""
    deadline = clock() + bounds.admission_seconds
    sent = list(texts)
    for f in filters.blocking:
        for text in sent:
            left = deadline - clock()
            if left <= 0:
                return Screened(sent, f, timed_out=True)
            try:
                if f.pattern.search(text, timeout=min(bounds.match_seconds, left), concurrent=True):
                    return Screened(sent, f)
            except TimeoutError:
                return Screened(sent, f, timed_out=True)
    out = list(sent)
    ceilings = [2 * len(t) + GROWTH for t in sent]
    for f in filters.replacing:
        for i, text in enumerate(out):
            left = deadline - clock()
            if left <= 0:
                return Screened(sent, f, timed_out=True)
            try:
                out[i] = _replace(f, text, ceilings[i], min(bounds.match_seconds, left))
            except TimeoutError:
                return Screened(sent, f, timed_out=True)
            except _TooLong:
                return Screened(sent, f, too_long=True)
    return Screened(out)


def refusal(screened: Screened, param: str = "prompt") -> HordeError:
    """The client's answer for a refused request: the filter's description, never its pattern."""
    f = screened.refused_by
    assert f is not None
    if screened.timed_out:
        message = "This prompt could not be checked against this horde's filters in time, so it was refused."
    elif screened.too_long:
        message = "This prompt's filtered text would be too long, so it was refused; send a shorter prompt."
    else:
        message = f"This prompt was refused by a filter: {f.description}" if f.description else GENERIC
    return HordeError(Rc.CorruptPrompt, message, param=param)


async def _screened(horde: Horde, caller: Caller, texts: list[str], param: str) -> list[str] | None:
    """The texts as admitted (None: no filter, nothing changed); HordeError when refused (`param`:
    the field the /v1 face names)."""
    filters = await horde.filters.current(horde)
    if not filters or not texts:
        return None
    screened = await asyncio.to_thread(screen, filters, texts, horde.settings.filters)
    f = screened.refused_by
    if f is None:
        return screened.texts
    if screened.timed_out:
        log.warning("filter %d (type %d) ran out of time on a request from %s: refused (fail closed)",
                    f.id, f.filter_type, caller.address)  # fmt: skip
    else:
        log.info("filter %d (type %d) refused a request from %s%s", f.id, f.filter_type, caller.address,
                 " (its replacements grew too long)" if screened.too_long else "")  # fmt: skip
    raise refusal(screened, param)


def _is_text(part: dict[str, Any]) -> bool:
    return part.get("type") == "text" and isinstance(part.get("text"), str)


def chat_texts(payload: ChatPayload) -> list[str]:
    """Every message's text: its content, or each text part of it, in order."""
    texts: list[str] = []
    for message in payload.messages:
        if isinstance(message.content, str):
            texts.append(message.content)
        elif isinstance(message.content, list):
            texts += [p["text"] for p in message.content if _is_text(p)]
    return texts


def with_chat_texts(payload: ChatPayload, texts: list[str]) -> ChatPayload:
    """`payload` with its texts (`chat_texts`' order) replaced by `texts`."""
    left = iter(texts)
    messages: list[ChatMessage] = []
    for message in payload.messages:
        content = message.content
        if isinstance(content, str):
            content = next(left)
        elif isinstance(content, list):
            content = [{**p, "text": next(left)} if _is_text(p) else p for p in content]
        messages.append(msgspec.structs.replace(message, content=content))
    return msgspec.structs.replace(payload, messages=messages)


async def screened_chat(horde: Horde, caller: Caller, payload: ChatPayload) -> ChatPayload:
    """A chat payload as admitted: refused (HordeError), or with its replacements made."""
    texts = await _screened(horde, caller, chat_texts(payload), "messages")
    return payload if texts is None else with_chat_texts(payload, texts)


async def screened_request(horde: Horde, caller: Caller, body: TextRequestInput) -> TextRequestInput:
    """A text request as admitted: its chat payload's messages when it has one, else its prompt."""
    if body.chat is not None:
        return msgspec.structs.replace(body, chat=await screened_chat(horde, caller, body.chat))
    texts = await _screened(horde, caller, [body.prompt], "prompt")
    return body if texts is None else msgspec.structs.replace(body, prompt=texts[0])


# --- a moderator's check (POST /filters) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FilterHit:
    """One filter's verdict on a checked prompt: what it matched, or that it ran out of time."""

    filter: Compiled
    match: str | None  # None: cut off (counted as a match)
    timed_out: bool = False


@dataclass(frozen=True, slots=True)
class Inspection:
    hits: list[FilterHit] = field(default_factory=list)

    @property
    def suspicion(self) -> int:
        """Upstream's scale, where 2 or more means refused: 2 when a blocking filter matched (or
        ran out of time), 1 when only replacing filters matched, else 0."""
        if any(h.filter.action is Action.BLOCK or h.timed_out for h in self.hits):
            return 2
        return 1 if self.hits else 0


def inspect(
    filters: FilterSet, prompt: str, bounds: FilterSettings, clock: Callable[[], float] = time.monotonic
) -> Inspection:
    """Every filter's verdict on `prompt` (each within the bounds screening applies)."""
    deadline = clock() + bounds.admission_seconds
    hits: list[FilterHit] = []
    for f in (*filters.blocking, *filters.replacing):
        left = deadline - clock()
        if left <= 0:
            hits.append(FilterHit(f, None, timed_out=True))
            continue
        try:
            found = f.pattern.search(prompt, timeout=min(bounds.match_seconds, left), concurrent=True)
        except TimeoutError:
            hits.append(FilterHit(f, None, timed_out=True))
            continue
        if found is not None:
            hits.append(FilterHit(f, found.group()[:SHOWN_MATCH]))
    return Inspection(hits)


async def inspect_prompt(horde: Horde, prompt: str, filter_type: int | None) -> Inspection:
    """POST /filters: how the filters in force (of `filter_type`, when given) judge `prompt`."""
    filters = (await horde.filters.current(horde)).of_type(filter_type)
    if not filters:
        return Inspection()
    return await asyncio.to_thread(inspect, filters, prompt, horde.settings.filters)
