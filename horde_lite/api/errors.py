"""Error mapping: `{"message","rc"}` on the horde API, `{"error":{...}}` on /v1, never a bare 500."""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, NotFoundException, ValidationException

from horde_lite.lifecycle.errors import HordeError

log = logging.getLogger("horde_lite.errors")

# Every rc the lifecycle raises -> its HTTP status (upstream's statuses for upstream's codes).
RC_STATUS: dict[str, int] = {
    "BadRequest": 400,
    "MissingPrompt": 400,
    "TokenOverflow": 400,
    "ContextLengthExceeded": 400,
    "DuplicateGen": 400,
    "AbortedGen": 400,
    "NotStreamingJob": 400,
    "ClientDisconnected": 400,
    "InvalidAPIKey": 401,
    "KudosUpfront": 403,
    "SharedKeyInsufficientKudos": 403,
    "SharedKeyEmpty": 403,
    "SharedKeyExpired": 403,
    "WrongCredentials": 403,
    "AnonForbidden": 403,
    "AnonForbiddenWorker": 403,
    "WorkerMaintenance": 403,
    "NotModerator": 403,
    "Forbidden": 403,
    "RequestNotFound": 404,
    "InvalidJobID": 404,
    "UserNotFound": 404,
    "WorkerNotFound": 404,
    "SharedKeyNotFound": 404,
    "ModelNotFound": 404,
    "NotFound": 404,
    "MethodNotAllowed": 405,
    "ProgressOutOfOrder": 409,
    "RequestCancelled": 410,
    "PayloadTooLarge": 413,
    "TooManyPrompts": 429,
    "RateLimited": 429,
    "InternalServerError": 500,
    "WorkerFailed": 502,
    "NoEligibleWorker": 503,
    "QueueTimeout": 503,
    "DatabaseUnavailable": 503,
}


def status_of(rc: str) -> int:
    """The HTTP status of an rc; an rc missing from the table is a server bug, shown as 500."""
    return RC_STATUS.get(rc, 500)


# horde rc -> (OpenAI error type, code) for the chat front.
OPENAI_CODES: dict[str, tuple[str, str]] = {
    "BadRequest": ("invalid_request_error", "invalid_request_error"),
    "MissingPrompt": ("invalid_request_error", "invalid_request_error"),
    "TokenOverflow": ("invalid_request_error", "context_length_exceeded"),
    "ContextLengthExceeded": ("invalid_request_error", "context_length_exceeded"),
    "InvalidAPIKey": ("authentication_error", "invalid_api_key"),
    "KudosUpfront": ("insufficient_quota", "kudos_upfront"),
    "SharedKeyInsufficientKudos": ("insufficient_quota", "kudos_upfront"),
    "SharedKeyEmpty": ("insufficient_quota", "kudos_upfront"),
    "SharedKeyExpired": ("authentication_error", "invalid_api_key"),
    "ModelNotFound": ("invalid_request_error", "model_not_found"),
    "TooManyPrompts": ("rate_limit_error", "rate_limit_exceeded"),
    "NoEligibleWorker": ("service_unavailable", "no_eligible_worker"),
    "QueueTimeout": ("service_unavailable", "queue_timeout"),
    "WorkerFailed": ("server_error", "worker_failed"),
    "RequestCancelled": ("invalid_request_error", "request_cancelled"),
    "ClientDisconnected": ("invalid_request_error", "client_disconnected"),
    "NotFound": ("invalid_request_error", "not_found"),
    "MethodNotAllowed": ("invalid_request_error", "method_not_allowed"),
    "InternalServerError": ("server_error", "internal_error"),
}


def is_v1(request: Request[Any, Any, Any]) -> bool:
    return request.url.path.startswith("/v1")


def openai_body(status: int, rc: str, message: str, param: str | None = None) -> dict[str, Any]:
    kind, code = OPENAI_CODES.get(rc, ("invalid_request_error" if status < 500 else "server_error", rc))
    if status == 413:
        code = "request_too_large"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _respond(
    request: Request[Any, Any, Any], status: int, rc: str, message: str, **extra: Any
) -> Response[Any]:
    headers: dict[str, str] = {}
    if status in (429, 503):
        headers = {"Retry-After": str(extra.get("retry_after", 30)), "x-should-retry": "false"}
    if is_v1(request):
        return Response(
            openai_body(status, rc, message, extra.get("param")), status_code=status, headers=headers
        )
    body: dict[str, Any] = {"message": message, "rc": rc}
    if extra.get("errors"):
        body["errors"] = extra["errors"]
    return Response(body, status_code=status, headers=headers)


def horde_error_handler(request: Request[Any, Any, Any], exc: HordeError) -> Response[Any]:
    return _respond(request, status_of(exc.rc), exc.rc, exc.message, **exc.extra)


def http_error_handler(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    status = exc.status_code
    if isinstance(exc, ValidationException):
        return _respond(request, 400, "BadRequest", f"Input payload validation failed: {exc.detail}",
                        errors={"request": str(exc.extra or exc.detail)})  # fmt: skip
    if isinstance(exc, NotFoundException):
        return _respond(request, 404, "NotFound", f"No route {request.method} {request.url.path}.")
    rc = {405: "MethodNotAllowed", 401: "InvalidAPIKey", 403: "Forbidden", 413: "PayloadTooLarge"}.get(
        status, "HTTPError"
    )
    return _respond(request, status, rc, str(exc.detail))


def internal_error_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return _respond(
        request, 500, "InternalServerError", "The server hit an internal error; nothing was changed."
    )


EXCEPTION_HANDLERS: dict[Any, Any] = {
    HordeError: horde_error_handler,
    HTTPException: http_error_handler,
    Exception: internal_error_handler,
}
