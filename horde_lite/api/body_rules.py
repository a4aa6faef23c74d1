"""Raw-input hygiene for every route of both faces, in one place, before Litestar decodes `data`.

What a typed struct cannot say is refused here with a 400 in the face's shape (the error handlers
format the `HordeError`):

- a path or query string holding NUL or bytes that are not UTF-8 (PostgreSQL text cannot hold NUL;
  SQLite can: both databases refuse it the same way);
- a header value holding NUL (the client agent is stored);
- a body that is not UTF-8, holds a `\\u0000` escape anywhere (keys included), nests arrays and
  objects deeper than MAX_DEPTH (the JSON decoder recurses), or holds an integer outside the signed
  64-bit range (free-form JSON such as `gen_metadata` is stored and later encoded again).

The body is scanned as bytes with regular expressions and C-level iteration, never recursively, and
read through `Request.body()`, which keeps it for the handler's own decoding.
"""

from __future__ import annotations

import re
from itertools import accumulate
from urllib.parse import unquote_to_bytes

from litestar import Request
from litestar.enums import ScopeType
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Receive, Scope, Send

from horde_lite.core.errors import HordeError
from horde_lite.rc import Rc

MAX_DEPTH = 64
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# A JSON string literal (unrolled: no backtracking blow-up on long strings).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# A `\u0000` escape that is not itself an escaped backslash followed by "u0000".
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
# An integer literal (no fraction, no exponent) of 19 digits or more: possibly beyond 64 bits.
_LONG_INT = re.compile(rb"(?<![\w.+-])-?\d{19,}(?![\w.])")
_DEPTH_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _DEPTH_STEP)


def _bad(message: str, param: str) -> HordeError:
    return HordeError(Rc.BadRequest, message, param=param, errors={param: message})


def check_target(scope: Scope) -> None:
    """The path (parameters included) and the query string: UTF-8 and no NUL."""
    raw_path = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape")
    targets = (("path", unquote_to_bytes(raw_path)), ("query", unquote_to_bytes(scope["query_string"])))
    for what, raw in targets:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(f"The request {what} is not valid UTF-8.", what) from None
        if "\x00" in text:
            raise _bad(f"The request {what} may not contain NUL characters.", what)
    if "\x00" in scope["path"]:
        raise _bad("The request path may not contain NUL characters.", "path")
    for name, value in scope["headers"]:
        if b"\x00" in value:
            raise _bad(f"The header {name.decode('latin-1')!r} may not contain NUL characters.", "headers")


def check_body(raw: bytes) -> None:
    """The JSON body's bytes: UTF-8, no NUL escape, nesting at most MAX_DEPTH, integers in 64 bits."""
    if not raw:
        return
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad("The request body is not valid UTF-8.", "body") from None
    if b"\x00" in raw or (b"\\u0000" in raw and _NUL_ESCAPE.search(raw)):
        raise _bad("Strings in the request body may not contain NUL characters.", "body")
    outside = _STRING.sub(b'""', raw)
    brackets = outside.translate(None, _NOT_BRACKETS)
    if len(brackets) > MAX_DEPTH and max(accumulate(map(_DEPTH_STEP.__getitem__, brackets))) > MAX_DEPTH:
        raise _bad(f"The request body nests arrays and objects deeper than {MAX_DEPTH} levels.", "body")
    for match in _LONG_INT.finditer(outside):
        # Beyond 19 significant digits is beyond 64 bits, told without int(): it refuses a string of
        # more than 4300 digits (a JSON number's, or a form field's, which the pattern also finds).
        literal = match.group()
        digits = literal.lstrip(b"-").lstrip(b"0") or b"0"
        value = int(digits) if len(digits) <= 19 else 2**64  # beyond either bound, whatever its sign
        if not INT64_MIN <= (-value if literal.startswith(b"-") else value) <= INT64_MAX:
            raise _bad("The request body holds an integer outside the 64-bit range.", "body")


class BodyRules(ASGIMiddleware):
    """Runs `check_target` and `check_body` for every HTTP route before its handler decodes."""

    scopes = (ScopeType.HTTP,)

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        check_target(scope)
        if scope["method"] not in ("GET", "HEAD", "OPTIONS"):
            # Read once; Litestar keeps the body in the connection state for the handler's decoding.
            check_body(await Request(scope, receive).body())
        await next_app(scope, receive, send)
