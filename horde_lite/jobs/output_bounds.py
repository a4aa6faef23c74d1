"""What one job may store: its output's size, derived from its token limit, and how many progress
posts it may make, how fast.

The bound is `max_length x [request] output_chars_per_token + OUTPUT_SLACK_CHARS`, `max_length`
being the job's own (a chat job's applied max_tokens). A token is a few characters on average (about
4 in English prose, fewer in most other scripts); the longest single tokens of common vocabularies
(runs of spaces or punctuation) are a few dozen, but the bound is on the whole output, where their
average stays far under 16. The slack covers short jobs, whose first token may open with a long
run, and a tool call's JSON framing. Content is counted in characters, tool calls as their JSON.

Progress posts: accepted ones (a repeat changes nothing) number at most `max_length +
PROGRESS_SLACK_POSTS` (a job of L tokens needs at most one post per token, plus a few tool-call
fragments), and at most `progress_burst + progress_per_second x seconds since the pop`. Both read
only the generation row the post loads anyway: no statement is added.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from horde_lite.core.errors import HordeError
from horde_lite.rc import Rc
from horde_lite.settings import Settings

OUTPUT_SLACK_CHARS = 1024
PROGRESS_SLACK_POSTS = 16
ROLE_CHARS = 32  # a chat message's role ("assistant") is framing, not output, up to this long

_encode = msgspec.json.Encoder().encode


def output_bound(max_length: int, settings: Settings) -> int:
    """The characters a job of `max_length` tokens may store as its output."""
    return max_length * settings.request.output_chars_per_token + OUTPUT_SLACK_CHARS


def json_size(value: Any) -> int:
    """The length of `value` as JSON (0 for nothing)."""
    return len(_encode(value)) if value else 0


def check_progress(
    *,
    seq: int,
    max_length: int,
    stored_content: str,
    stored_tool_calls: list[Any],
    content: str | None,
    tool_calls: list[Any] | None,
    popped_at: float,
    now: float,
    settings: Settings,
) -> None:
    """Refuse the progress post `seq` (the next one expected) of a job of `max_length` tokens when it
    is one too many, comes too fast, or would take the job's output past its bound."""
    most = max_length + PROGRESS_SLACK_POSTS
    if seq > most:
        raise HordeError(
            Rc.TooManyProgressPosts,
            f"This job of {max_length} tokens takes at most {most} progress posts; submit its result "
            "instead (the job is still yours until its lease ends).",
        )
    chat = settings.chat
    elapsed = max(0.0, now - popped_at)
    # A millionth of a post of tolerance: epoch seconds lose digits in the subtraction.
    allowed = chat.progress_burst + chat.progress_per_second * elapsed + 1e-6
    if seq > allowed:
        wait = max(1, math.ceil((seq - chat.progress_burst) / chat.progress_per_second - elapsed))
        raise HordeError(
            Rc.ProgressTooFast,
            f"Progress seq {seq} comes too fast: a job takes at most {chat.progress_burst} posts plus "
            f"{chat.progress_per_second:g} a second since its pop. Batch the output and post this seq "
            f"again in {wait} s; nothing was stored.",
            retry_after=wait,
        )
    bound = output_bound(max_length, settings)
    # The tool calls as they would be stored: the list with this post's fragments appended.
    calls = [*stored_tool_calls, *tool_calls] if tool_calls else stored_tool_calls
    size = len(stored_content) + len(content or "") + json_size(calls)
    if size > bound:
        raise HordeError(
            Rc.ProgressTooLong,
            f"This post would take the job's streamed output to {size} characters; a job of "
            f"{max_length} tokens holds at most {bound}. Nothing was stored; submit its result "
            "instead (the job is still yours until its lease ends).",
            bound=bound,
        )


def submitted_size(generation: str, message: dict[str, Any] | None) -> int:
    """A submit's output as the bound counts it: its text (the `generation`, or the chat message's
    content when that is longer: a worker may send the same text in both) and the rest of its chat
    message (tool calls and the like) as JSON, its role aside while it is a role's short word."""
    if message is None:
        return len(generation)
    content = message.get("content")
    text = max(len(generation), len(content)) if isinstance(content, str) else len(generation)
    role = message.get("role")
    rest = {
        k: v
        for k, v in message.items()
        if not (k == "content" and isinstance(content, str))
        and not (k == "role" and isinstance(role, str) and len(role) <= ROLE_CHARS)
    }
    return text + json_size(rest)


def check_submit(
    generation: str, message: dict[str, Any] | None, max_length: int, settings: Settings
) -> None:
    """Refuse a submit whose output is past the job's bound (nothing is stored; the worker may
    submit again within its lease, or fault the job)."""
    bound = output_bound(max_length, settings)
    size = submitted_size(generation, message)
    if size > bound:
        raise HordeError(
            Rc.GenerationTooLong,
            f"The submitted output is {size} characters; a job of {max_length} tokens holds at most "
            f"{bound}. Nothing was stored: submit it cut to that length, or fault the job.",
            bound=bound,
        )
