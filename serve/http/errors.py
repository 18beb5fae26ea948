"""The error envelope, in one place.

Every failure a client can see is an :class:`ApiError` carrying the HTTP status, the JSON
body and extra headers; only the HTTP layer builds one. Domain layers raise their own
exception types (an agent that crashed, a session that is gone, a limit that was hit, a
file the workspace refused): :mod:`serve.errors` is the one table from those types to a
neutral wire error, and :func:`to_api_error` renders it (:func:`rest_error`). The app's
error handlers turn any ``ApiError`` into a response; anything unexpected becomes
``500 {"error":"Internal server error"}`` and is logged.
"""

from __future__ import annotations

from typing import Any

from serve.errors import SESSION_ERRORS, WireError, rest, wire_error

#: Re-exported: the session family of the one table (:mod:`serve.errors.table`).
DOMAIN_ERRORS = SESSION_ERRORS


class ApiError(Exception):
    """An HTTP error response: ``status``, JSON ``body``, extra ``headers``."""

    def __init__(
        self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(body.get("error", "error"))
        self.status = status
        self.body = body
        self.headers = headers or {}


def bad_request(message: str, code: str | None = None, **extra: object) -> ApiError:
    body: dict[str, Any] = {"error": message}
    if code is not None:
        body["code"] = code
    body.update(extra)
    return ApiError(400, body)


def session_not_found(session_id: str) -> ApiError:
    return ApiError(
        404,
        {
            "error": f'No session with id "{session_id}"',
            "code": "session_not_found",
            "sessionId": session_id,
        },
    )


def invalid_json() -> ApiError:
    return ApiError(400, {"error": "Invalid JSON in request body"})


def service_unavailable(
    message: str, code: str, retry_after_s: int = 5, **extra: object
) -> ApiError:
    return ApiError(
        503, {"error": message, "code": code, **extra}, {"Retry-After": str(retry_after_s)}
    )


def rest_error(wire: WireError) -> ApiError:
    """The REST rendering of a neutral wire error."""
    status, body, headers = rest(wire)
    return ApiError(status, body, headers)


def to_api_error(exc: BaseException) -> ApiError | None:
    """Map a domain exception to the wire (:func:`serve.errors.wire_error`), or None when
    it is unexpected (a 500)."""
    if isinstance(exc, ApiError):
        return exc
    wire = wire_error(exc)
    return None if wire is None else rest_error(wire)
