"""The error envelope, in one place.

Every failure a client can see is an :class:`ApiError` carrying the HTTP status, the JSON
body and extra headers; only the HTTP layer builds one. Domain layers raise their own
exception types (an agent that crashed, a session that is gone, a limit that was hit):
:data:`DOMAIN_ERRORS` is the one table from those types to status and headers (the body is
the exception's own ``{"error", "code", ...}``), and :func:`to_api_error` applies it and the
ACP mapping below. The app's error handlers turn any ``ApiError`` into a response; anything
unexpected becomes ``500 {"error":"Internal server error"}`` and is logged.
"""

from __future__ import annotations

from typing import Any

from acp.errors import ChannelClosed, RemoteError, RequestTimeout
from serve.sessions.errors import (
    AgentRefusedError,
    BudgetExhausted,
    MemoryBudgetExceeded,
    NotSupportedByAgent,
    SessionBusy,
    SessionConflictError,
    SessionError,
    SessionLimitError,
    SessionRequestError,
    SessionsUnavailable,
)

_RETRY = {"Retry-After": "5"}

#: Domain exception → (HTTP status, extra headers). The first entry that matches wins, so
#: list a subclass before its base.
DOMAIN_ERRORS: tuple[tuple[type[SessionError], int, dict[str, str]], ...] = (
    (SessionRequestError, 400, {}),
    (AgentRefusedError, 400, {}),
    (NotSupportedByAgent, 501, {}),
    (SessionBusy, 409, {}),
    (BudgetExhausted, 402, {}),
    (SessionConflictError, 409, _RETRY),
    (MemoryBudgetExceeded, 503, {"Retry-After": "10"}),
    (SessionLimitError, 503, _RETRY),
    (SessionsUnavailable, 503, _RETRY),
)


class ApiError(Exception):
    """An HTTP error response: ``status``, JSON ``body``, extra ``headers``."""

    def __init__(
        self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(body.get("error", "error"))
        self.status = status
        self.body = body
        self.headers = headers or {}


def bad_request(message: str, code: str | None = None, **extra: Any) -> ApiError:
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


def service_unavailable(message: str, code: str, retry_after_s: int = 5, **extra: Any) -> ApiError:
    return ApiError(
        503, {"error": message, "code": code, **extra}, {"Retry-After": str(retry_after_s)}
    )


def to_api_error(exc: BaseException) -> ApiError | None:
    """Map a domain exception to the wire, or None when it is unexpected (a 500)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, SessionError):
        for kind, status, headers in DOMAIN_ERRORS:
            if isinstance(exc, kind):
                return ApiError(status, exc.body(), dict(headers))
        return None  # a SessionError subclass missing from the table: a bug, 500
    if isinstance(exc, RemoteError):
        remote: dict[str, Any] = {"error": exc.message, "code": exc.code}
        if exc.data is not None:
            remote["data"] = exc.data
        return ApiError(500, remote)
    if isinstance(exc, RequestTimeout):
        timeout_ms = int(exc.timeout_s * 1000)
        if exc.method in ("initialize", "session/new"):
            # The reference's safe-retry shape: nothing was created.
            body: dict[str, Any] = {
                "error": f"agent did not answer {exc.method} within {timeout_ms} ms",
                "code": "init_timeout",
                "errorKind": "init_timeout",
                "retryable": True,
                "sideEffectPossible": False,
                "phase": "channel.initialize" if exc.method == "initialize" else "session.new",
                "timeoutMs": timeout_ms,
            }
        elif exc.method in ("session/load", "session/resume", "session/unstable_resumeSession"):
            body = {
                "error": f"agent did not answer {exc.method} within {timeout_ms} ms",
                "code": "session_restore_timeout",
                "errorKind": "restore_timeout",
                "retryable": True,
                "timeoutMs": timeout_ms,
            }
        else:
            body = {
                "error": f"agent did not answer {exc.method} within {timeout_ms} ms",
                "code": "agent_timeout",
                "retryable": True,
                "timeoutMs": timeout_ms,
            }
        return ApiError(504, body, {"Retry-After": "5"})
    if isinstance(exc, ChannelClosed):
        return ApiError(
            503,
            {
                "error": f"agent channel closed: {exc}",
                "code": "acp_channel_unavailable",
                "retryable": True,
            },
            {"Retry-After": "5"},
        )
    return None
