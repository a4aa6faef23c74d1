"""Keys never reach the logs: a `logging.Filter` that masks API keys and shared keys in every record
passing through the app's log handlers (Litestar's and uvicorn's access and error logs).

Keys travel in paths (`/api/v2/sharedkeys/{key}`), in the `apikey` and `Authorization` headers and,
from careless clients, in query strings. Request, worker and generation ids are UUIDs too and stay
in the logs (they are how an operator follows a request), so UUIDs are masked only where a key goes.
"""

from __future__ import annotations

import atexit
import logging
import re
from logging.handlers import QueueHandler, QueueListener
from queue import SimpleQueue
from typing import Any

from litestar.logging import LoggingConfig
from litestar.logging.config import default_handlers

MASK = "***"


def _any_spelling(word: str) -> str:
    """`word` with any of its letters percent-encoded (`%73haredkeys`): the router decodes the path
    before matching it, while uvicorn's access log shows the path as it was sent."""
    return "".join(f"(?:{re.escape(c)}|%{ord(c):02x})" for c in word)


_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Everything after "sharedkeys" in a path, up to the query or the end of the path: the router
    # reaches the key's routes through doubled slashes, a trailing slash, an encoded slash or
    # encoded letters, so the key is not always the segment right after "/sharedkeys/".
    (
        re.compile(rf"({_any_spelling('sharedkeys')})(?=[/\\%])[^\s?#\"']+", re.IGNORECASE),
        rf"\g<1>/{MASK}",
    ),
    # Header or query values: `apikey: K`, `'apikey': 'K'`, `(b'apikey', b'K')`, `apikey=K`,
    # `Authorization: Bearer K`.
    (
        re.compile(
            r"(\b(?:apikey|api_key|authorization)\b[\"']?\s*(?:[:=,]\s*)b?[\"']?(?:bearer\s+)?)[^\s\"'&,;)]+",
            re.IGNORECASE,
        ),
        rf"\g<1>{MASK}",
    ),
)


# What a text must contain for a pattern to match it, when it is ASCII without a percent sign (so
# neither a percent-encoded letter nor a non-ASCII character that case-folds to one): most lines.
_NEEDLES = ("sharedkeys", "apikey", "api_key", "authorization")


def redact(text: str) -> str:
    if text.isascii() and "%" not in text:
        folded = text.lower()
        if not any(needle in folded for needle in _NEEDLES):
            return text
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def _redact_arg(value: Any) -> Any:
    if value is None or isinstance(value, int | float):
        return value  # numbers keep their type for %d and %f
    return redact(value if isinstance(value, str) else str(value))


class RedactKeys(logging.Filter):
    """Masks keys in the message, its arguments, the traceback and the stack of a record. The
    arguments keep their types and positions (uvicorn's access formatter unpacks them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_redact_arg(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _redact_arg(v) for k, v in record.args.items()}
        if isinstance(record.msg, str) and redact(record.msg) != record.msg:
            # The key's context is in the template (`apikey: %s`) and the key in an argument:
            # mask the whole message, which then carries no arguments.
            record.msg, record.args = redact(record.getMessage()), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


class SimpleQueueListenerHandler(QueueHandler):
    """Litestar's `queue_listener` handler (records formatted on the event loop, written to stderr
    by a thread of their own) on a `queue.SimpleQueue`: its `put` is one C call, where the
    `queue.Queue` Litestar's handler uses takes a Python lock and notifies a condition for every
    record, an access-log line per request. Its thread ends when the handler is closed: by
    `logging.config.dictConfig` when a later configuration replaces it (each app built in a process
    configures logging), or at exit, the records queued before written."""

    def __init__(self) -> None:
        super().__init__(SimpleQueue())  # type: ignore[arg-type]
        self.listener = QueueListener(self.queue, logging.StreamHandler())  # type: ignore[arg-type]
        self.listener.start()
        self._listening = True
        atexit.register(self._stop)

    def _stop(self) -> None:
        if self._listening:  # QueueListener.stop may run once only
            self._listening = False
            self.listener.stop()

    def close(self) -> None:
        atexit.unregister(self._stop)
        self._stop()
        super().close()


def logging_config(**options: Any) -> LoggingConfig:
    """Litestar's logging config with `RedactKeys` on every handler, and uvicorn's access and error
    loggers sent through those handlers too (uvicorn would otherwise print paths with keys itself)."""
    handlers = {name: {**handler, "filters": ["redact_keys"]} for name, handler in default_handlers.items()}
    handlers["queue_listener"] = {"()": SimpleQueueListenerHandler, "level": "DEBUG"}
    handlers["queue_listener"].update(formatter="standard", filters=["redact_keys"])
    through_app = {"level": "INFO", "handlers": ["queue_listener"], "propagate": False}
    return LoggingConfig(
        filters={"redact_keys": {"()": RedactKeys}},
        handlers=handlers,
        loggers={
            "litestar": {"level": "INFO", "handlers": ["queue_listener"], "propagate": False},
            "uvicorn.access": through_app,
            "uvicorn.error": through_app,
        },
        **options,
    )
