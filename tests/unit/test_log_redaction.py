"""Key redaction in the logs (horde_lite/api/logfilter.py) skips its patterns for a line that cannot
match them; every line is masked exactly as the patterns alone would mask it."""

from __future__ import annotations

import logging
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from horde_lite.api.logfilter import _PATTERNS, MASK, logging_config, redact


def _by_the_patterns(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


# Non-ASCII letters that case-fold onto the keys' letters: a long s, fullwidth capitals.
FOLDING = "\u017fharedkeys/", "\uff21\uff30\uff29key"
PIECES = st.sampled_from([
    "/api/v2/sharedkeys/", "/api/v2/%73haredkeys/", "SharedKeys", "apikey: ", "API_KEY=",
    "Authorization: Bearer ", "'apikey': '", "(b'apikey', b'", *FOLDING, "%", "?", "/", " ", "abc-123",
    "0f3a9c", "\"",
])  # fmt: skip
LINES = st.lists(st.one_of(PIECES, st.text(max_size=12)), max_size=8).map("".join)


@given(LINES)
def test_a_line_is_masked_as_the_patterns_mask_it(line: str) -> None:
    assert redact(line) == _by_the_patterns(line)


def test_keys_are_masked_and_plain_lines_kept() -> None:
    assert MASK in redact('127.0.0.1:5 - "GET /api/v2/sharedkeys/abcdef HTTP/1.1" 200')
    assert redact("apikey: 0123456789abcdef") == f"apikey: {MASK}"
    plain = '127.0.0.1:5 - "POST /api/v2/generate/text/pop HTTP/1.1" 200'
    assert redact(plain) == plain


def test_a_replaced_configuration_ends_its_thread_and_the_new_one_writes(
    capfd: pytest.CaptureFixture[str],
) -> None:
    config = logging_config()
    config.configure()
    threads = threading.active_count()
    for _ in range(5):  # as each app built in one process configures logging again
        config.configure()
    assert threading.active_count() == threads  # one listener thread, not one per configuration
    logging.getLogger("litestar").warning("still written apikey=0123456789")
    config.configure()  # closing the handler writes what it had queued first
    assert "still written apikey=***" in capfd.readouterr().err
