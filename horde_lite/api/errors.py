"""Error mapping: `{"message","rc"}` on the horde API, `{"error":{...}}` on /v1, never a bare 500.

Each face's Router carries its own exception handlers (`HORDE_HANDLERS`, `OPENAI_HANDLERS`), so a
route's answer takes its face's shape from where the route is mounted. `UNROUTED_HANDLERS` are the
app's: they answer what no router's route matched (an unknown path, a wrong method, a bad Host) and
the app's own routes (operator pages, docs, metrics)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import (
    HTTPException,
    MethodNotAllowedException,
    NotFoundException,
    TooManyRequestsException,
    ValidationException,
)
from litestar.types import ExceptionHandlersMap
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from horde_lite.api.db_errors import DRIVER_ERRORS, database_unavailable
from horde_lite.core.errors import HordeError
from horde_lite.db.bounds import BOUNDED_MARK
from horde_lite.rc import Rc
from horde_lite.settings import KUDOS_LIMIT

log = logging.getLogger("horde_lite.errors")

# horde rc -> (OpenAI error type, code) for the chat front.
OPENAI_CODES: dict[Rc, tuple[str, str]] = {
    Rc.BadRequest: ("invalid_request_error", "invalid_request_error"),
    Rc.MissingPrompt: ("invalid_request_error", "invalid_request_error"),
    Rc.TokenOverflow: ("invalid_request_error", "context_length_exceeded"),
    Rc.ContextLengthExceeded: ("invalid_request_error", "context_length_exceeded"),
    Rc.InvalidAPIKey: ("authentication_error", "invalid_api_key"),
    Rc.KudosUpfront: ("insufficient_quota", "kudos_upfront"),
    Rc.SharedKeyInsufficientKudos: ("insufficient_quota", "kudos_upfront"),
    Rc.SharedKeyEmpty: ("insufficient_quota", "kudos_upfront"),
    Rc.SharedKeyExpired: ("authentication_error", "invalid_api_key"),
    Rc.ModelNotFound: ("invalid_request_error", "model_not_found"),
    Rc.TooManyPrompts: ("rate_limit_error", "rate_limit_exceeded"),
    Rc.RateLimited: ("rate_limit_error", "rate_limit_exceeded"),
    Rc.DailyTokenLimit: ("rate_limit_error", "rate_limit_exceeded"),
    Rc.ModelNotAllowed: ("permission_error", "model_not_allowed"),
    Rc.TimeoutIP: ("permission_error", "ip_timeout"),
    Rc.CorruptPrompt: ("invalid_request_error", "content_policy_violation"),
    Rc.DatabaseUnavailable: ("service_unavailable", "database_unavailable"),
    Rc.NoEligibleWorker: ("service_unavailable", "no_eligible_worker"),
    Rc.QueueTimeout: ("service_unavailable", "queue_timeout"),
    Rc.MaintenanceMode: ("service_unavailable", "maintenance_mode"),
    Rc.WorkerFailed: ("server_error", "worker_failed"),
    Rc.RequestCancelled: ("invalid_request_error", "request_cancelled"),
    Rc.ClientDisconnected: ("invalid_request_error", "client_disconnected"),
    Rc.NotFound: ("invalid_request_error", "not_found"),
    Rc.MethodNotAllowed: ("invalid_request_error", "method_not_allowed"),
    Rc.InternalServerError: ("server_error", "internal_error"),
}


# Codes the OpenAI face answers with another status than the horde's: upstream answers a request in
# maintenance 400, while an OpenAI client reads a 503 as "the service is down for now".
OPENAI_STATUSES: dict[Rc, int] = {Rc.MaintenanceMode: 503}


# 429/503 answers a client should retry after `Retry-After` (`x-should-retry: true` lets the openai
# package do so); the others tell it not to resend at once.
RETRYABLE_RCS = frozenset({Rc.RateLimited, Rc.ProgressTooFast, Rc.DatabaseUnavailable})
# Seconds a client is told to wait before retrying after a lost database connection.
DATABASE_RETRY_AFTER = 5


class HordeErrorBody(msgspec.Struct, omit_defaults=True):
    """Every error of the horde API (/api/v2): a message and upstream's `rc` code."""

    message: str
    rc: str
    errors: dict[str, str] | None = None


class OpenAIErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str


class OpenAIErrorBody(msgspec.Struct):
    """Every error of the OpenAI front (/v1), as the OpenAI API shapes it."""

    error: OpenAIErrorDetail


def openai_body(status: int, rc: Rc, message: str, param: str | None = None) -> dict[str, Any]:
    kind, code = OPENAI_CODES.get(rc, ("invalid_request_error" if status < 500 else "server_error", rc))
    if status == 413:
        code = "request_too_large"
    return msgspec.to_builtins(OpenAIErrorBody(OpenAIErrorDetail(message, kind, param, code)))


# A face's error body from the request, the status, the code, the message and the refusal's extras.
Shape = Callable[[Request[Any, Any, Any], int, Rc, str, Mapping[str, Any]], Any]


def horde_shape(
    request: Request[Any, Any, Any], status: int, rc: Rc, message: str, extra: Mapping[str, Any]
) -> Any:
    errors = extra.get("errors")
    body = HordeErrorBody(message, rc, {str(k): str(v) for k, v in errors.items()} if errors else None)
    return msgspec.to_builtins(body)


def openai_shape(
    request: Request[Any, Any, Any], status: int, rc: Rc, message: str, extra: Mapping[str, Any]
) -> Any:
    return openai_body(status, rc, message, extra.get("param"))


def unrouted_shape(
    request: Request[Any, Any, Any], status: int, rc: Rc, message: str, extra: Mapping[str, Any]
) -> Any:
    """Litestar answers a path no route matches (404), a method its route lacks (405) and a bad
    Host before any router is chosen, with the app's handlers only; an unknown path under /v1 is
    still the OpenAI front's, so this one fallback picks the face by the path's prefix."""
    shape = openai_shape if request.url.path.startswith("/v1") else horde_shape
    return shape(request, status, rc, message, extra)


def field_errors(exc: ValidationException) -> dict[str, str]:
    """Litestar's validation failures (of `data`, a path or a query parameter) by field path."""
    errors: dict[str, str] = {}
    for item in exc.extra if isinstance(exc.extra, list) else []:
        if isinstance(item, dict) and item.get("key"):
            key, reason = str(item["key"]), str(item.get("message") or "invalid")
            if key == "data":  # Litestar's name for the whole body: it is missing or not an object
                key, reason = "body", "a JSON object is required" if reason == "'data'" else reason
            errors[key] = reason
    return errors


class ErrorFace:
    """One face's exception handlers: every error answered in the face's body `shape`, with the
    code's status unless the face's `statuses` name another."""

    def __init__(self, shape: Shape, statuses: Mapping[Rc, int] | None = None) -> None:
        self.shape = shape
        self.statuses = dict(statuses or {})

    def respond(
        self,
        request: Request[Any, Any, Any],
        rc: Rc,
        message: str,
        *,
        status: int | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> Response[Any]:
        status = status or self.statuses.get(rc, rc.status)
        headers = dict(headers or {})
        if status in (429, 503):
            headers["Retry-After"] = str(extra.get("retry_after", 30))
            headers["x-should-retry"] = "true" if rc in RETRYABLE_RCS else "false"
        body = self.shape(request, status, rc, message, extra)
        return Response(body, status_code=status, headers=headers)

    def horde_error(self, request: Request[Any, Any, Any], exc: HordeError) -> Response[Any]:
        return self.respond(request, exc.rc, exc.message, **exc.extra)

    def http_error(self, request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
        if isinstance(exc, ValidationException):
            errors = field_errors(exc)
            if not errors:  # not about a field (a body that is not JSON): no `errors`, as upstream
                return self.respond(request, Rc.BadRequest, str(exc.detail))
            listed = "; ".join(f"{key}: {reason}" for key, reason in errors.items())
            return self.respond(request, Rc.BadRequest, f"Input payload validation failed: {listed}",
                                errors=errors, param=next(iter(errors)))  # fmt: skip
        if isinstance(exc, NotFoundException):
            return self.respond(request, Rc.NotFound, f"No route {request.method} {request.url.path}.")
        if isinstance(exc, MethodNotAllowedException):
            # Litestar's router names the route's methods in `allow`; RFC 9110 requires it on a 405.
            allow = (exc.headers or {}).get("allow", "")
            return self.respond(request, Rc.MethodNotAllowed,
                                f"{request.method} is not allowed on {request.url.path}; allowed: {allow}.",
                                headers={"Allow": allow})  # fmt: skip
        if isinstance(exc, TooManyRequestsException):
            # Raised by the rate-limit middleware (horde_lite.api.ratelimit): per key and address.
            limit_headers = dict(exc.headers or {})
            wait = max(1, int(limit_headers.get("RateLimit-Reset", "60")))
            return self.respond(request, Rc.RateLimited,
                                f"Too many requests from this key and address; retry after {wait} seconds.",
                                headers=limit_headers, retry_after=wait)  # fmt: skip
        rc = HTTP_CODES.get(exc.status_code, Rc.HTTPError)
        return self.respond(request, rc, str(exc.detail), status=exc.status_code)

    def internal_error(self, request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
        log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return self.respond(
            request, Rc.InternalServerError, "The server hit an internal error; nothing was changed."
        )

    def database_error(self, request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
        """A lost or unreachable database is a 503 the client may retry; an amount of kudos the
        database's bounds refuse (`db/bounds.py`) is the caller's 400; any other database error is a bug."""
        if isinstance(exc, IntegrityError) and BOUNDED_MARK in str(exc):
            log.warning("kudos bound refused on %s %s: %s", request.method, request.url.path, exc.orig)
            limit = f"+-{KUDOS_LIMIT:g}"
            message = f"That would take an amount or balance of kudos beyond {limit}; nothing was changed."
            return self.respond(request, Rc.KudosLimit, message)
        if not database_unavailable(exc):
            return self.internal_error(request, exc)
        log.warning("database unavailable on %s %s: %s", request.method, request.url.path, exc)
        message = "The database is unavailable; retry in a few seconds."
        return self.respond(request, Rc.DatabaseUnavailable, message, retry_after=DATABASE_RETRY_AFTER)

    def handlers(self) -> ExceptionHandlersMap:
        return {
            HordeError: self.horde_error,
            HTTPException: self.http_error,
            SQLAlchemyError: self.database_error,
            # A connection that cannot be opened surfaces unwrapped from the driver (refused, timed out, ...).
            **dict.fromkeys(DRIVER_ERRORS, self.database_error),
            Exception: self.internal_error,
        }


# Litestar's other HTTP errors by status; any other keeps its status with `HTTPError`.
HTTP_CODES: dict[int, Rc] = {
    405: Rc.MethodNotAllowed,
    401: Rc.InvalidAPIKey,
    403: Rc.Forbidden,
    413: Rc.PayloadTooLarge,
}

HORDE_HANDLERS = ErrorFace(horde_shape).handlers()
OPENAI_HANDLERS = ErrorFace(openai_shape, OPENAI_STATUSES).handlers()
UNROUTED_HANDLERS = ErrorFace(unrouted_shape).handlers()
