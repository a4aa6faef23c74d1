"""What a filter's pattern may be, what its type makes it do, and how it is compiled.

Patterns are the `regex` package's syntax (upstream's library), matched case-insensitively as
upstream compiles them, in the package's version 0 (the `re` module's behaviour). Every pattern is
matched against every request, so one is checked before it is stored (`check`):

- at most `MAX_PATTERN` characters (the input struct's bound, and here for the dashboard's form);
- no counted repeat above `MAX_REPEAT` (`a{5000}`): the library writes a counted repeat out in
  full when it compiles, so `a{4294967294}` alone would take every byte of the server's memory;
- it compiles, in a child process bounded in memory and CPU time: nested counted repeats multiply
  (`((a{100}){100}){100}`), and some shapes crash the compiler outright, which must cost a child,
  not the server;
- in that child, it matches each probe text (a few kilobytes: runs of the characters it names,
  words, spaces) within `PROBE_SECONDS`: a pattern that backtracks catastrophically on such text
  (`(a+)+$`) is refused when it is written rather than cut off at every request;
- it does not match empty text: it would match every prompt.

The child needs no site-packages: it runs `python -I -S` with the `regex` package's directory on
its path, so checking a pattern costs tens of milliseconds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
from enum import StrEnum
from typing import Any

import regex

from horde_lite.core.errors import HordeError
from horde_lite.rc import Rc

log = logging.getLogger("horde_lite.filters")

FLAGS = regex.IGNORECASE | regex.V0
FIRST_TYPE, LAST_TYPE = 10, 29  # upstream's range of filter types
MAX_PATTERN = 2000
MAX_DESCRIPTION = 1000
MAX_REPLACEMENT = 255  # upstream's column
MAX_REPEAT = 1000

CHILD_MEMORY = 64 * 1024 * 1024  # bytes the child may take beyond what it holds once started
CHILD_CPU_SECONDS = 5
CHILD_WALL_SECONDS = 15.0
PROBE_CHARS = 4096
PROBE_LETTERS = 16  # distinct characters of the pattern given a run of their own
# A probe's bound. Past it on a few kilobytes a pattern backtracks catastrophically; a fixed bound
# (not `[filters] match_seconds`) so a pattern's fate does not hang on a setting or a busy host.
PROBE_SECONDS = 0.1


class Action(StrEnum):
    """What a match does: refuse the request, or replace the matched text."""

    BLOCK = "block"
    REPLACE = "replace"


def action_of(filter_type: int) -> Action:
    """Types 10 to 19 refuse (upstream's first group, the prompts it blocks), 20 to 29 replace."""
    return Action.BLOCK if filter_type < 20 else Action.REPLACE


def compile_pattern(pattern: str) -> regex.Pattern[str]:
    """The pattern as screening matches it (checked by `check` before it was stored)."""
    return regex.compile(pattern, FLAGS)


# A counted repeat's braces: `{5}`, `{2,5}`, `{,5}`, `{5,}`. Braces elsewhere (`\p{L}`, `\x{41}`)
# are read as one too; their numbers are small or the pattern is refused, which errs safe.
_COUNTED = re.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")


def static_problem(pattern: str) -> str | None:
    """What is wrong with the pattern before anything compiles it (None: nothing)."""
    if not pattern:
        return "is empty"
    if len(pattern) > MAX_PATTERN:
        return f"is longer than {MAX_PATTERN} characters"
    for found in _COUNTED.finditer(pattern):
        for digits in found.groups():
            if digits and int(digits[:12]) > MAX_REPEAT:
                return f"counts a repeat above {MAX_REPEAT} ({found.group()})"
    return None


def probes(pattern: str) -> list[tuple[str, str]]:
    """(what it is, text) the child matches the pattern against: runs of the pattern's own letters
    and digits, then words and spaces, each ended by a character none of them matches."""
    letters = list(dict.fromkeys(c.lower() for c in pattern if c.isalnum()))[:PROBE_LETTERS]
    end = "\u0001"
    found = [(f"a run of {c!r}", c * PROBE_CHARS + end) for c in letters]
    words = ("lorem ipsum dolor sit amet " * (PROBE_CHARS // 27 + 1))[:PROBE_CHARS]
    found.append(("words", words + end))
    found.append(("spaces", " " * PROBE_CHARS + end))
    found.append(("'ab' repeated", "ab" * (PROBE_CHARS // 2) + end))
    return found


# The child: bounded, it compiles the pattern, matches the probes and says what happened in one
# line of JSON. A crash or a kill is an answer too (the parent reads the exit status).
_CHILD = r"""
import json, resource, sys
sys.path.insert(0, sys.argv[1])
import regex
job = json.loads(sys.stdin.read())

def answer(**said):
    sys.stdout.write(json.dumps(said))
    sys.stdout.flush()
    raise SystemExit(0)

def limit(kind, value):
    try:
        resource.setrlimit(kind, (value, value))
    except (ValueError, OSError):
        pass

try:
    with open("/proc/self/status") as status:
        size = next(int(l.split()[1]) * 1024 for l in status if l.startswith("VmSize:"))
    limit(resource.RLIMIT_AS, size + job["memory"])
except (OSError, StopIteration):
    pass
limit(resource.RLIMIT_CPU, job["cpu_seconds"])
try:
    pattern = regex.compile(job["pattern"], job["flags"])
except regex.error as e:
    answer(error="is not a valid pattern: " + str(e))
except MemoryError:
    answer(error="takes too much memory to compile")
except (RecursionError, OverflowError, ValueError) as e:
    answer(error="is not a valid pattern: " + str(e))
try:
    if pattern.search("", timeout=job["timeout"]) is not None:
        answer(error="matches empty text, so it would match every prompt")
    for name, text in job["probes"]:
        pattern.search(text, timeout=job["timeout"])
except TimeoutError:
    answer(error="backtracks past its time bound on " + name + " (a catastrophic pattern)")
except MemoryError:
    answer(error="takes too much memory to match " + name)
answer(ok=True)
"""


def _library_path() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(regex.__file__)))


async def _child_problem(pattern: str) -> str | None:
    job = {
        "pattern": pattern, "flags": int(FLAGS), "timeout": PROBE_SECONDS, "probes": probes(pattern),
        "memory": CHILD_MEMORY, "cpu_seconds": CHILD_CPU_SECONDS,
    }  # fmt: skip
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-S", "-c", _CHILD, _library_path(),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(child.communicate(json.dumps(job).encode()), CHILD_WALL_SECONDS)
    except TimeoutError:
        child.kill()
        await child.wait()
        return "takes too long to compile and match"
    said: dict[str, Any] = {}
    if child.returncode == 0:
        try:
            said = json.loads(out)
        except ValueError:
            said = {}
    if said.get("ok"):
        return None
    if "error" in said:
        return str(said["error"])
    # Killed (out of CPU time), crashed, or out of memory outside the guarded calls.
    log.warning("a filter pattern's check ended with status %s: %s", child.returncode, err[-500:])
    return "takes too much memory or time to compile and match"


async def check(pattern: str) -> None:
    """Refuse (BadRequest, naming `regex`) a pattern screening could not afford."""
    problem = static_problem(pattern) or await _child_problem(pattern)
    if problem is not None:
        raise HordeError(Rc.BadRequest, f"The filter's regex {problem}.", errors={"regex": problem})
