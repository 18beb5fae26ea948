"""Domain error → :class:`WireError` (status, code, body, headers); see the package doc.

The first matching entry of each family wins (a subclass is listed before its base). A
body is a new ``dict`` per call and headers a new ``dict`` per call, so a renderer may
extend them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from acp.errors import ChannelClosed, RemoteError, RequestTimeout
from serve.access.errors import (
    AccessError,
    Forbidden,
    PrincipalBudgetExhausted,
    QuotaExceeded,
    WorkspaceDenied,
)
from serve.sessions.errors import (
    RETRYABLE_TURN_CODES,
    AgentRefusedError,
    AgentSandboxDenied,
    AgentStartFailing,
    BudgetExhausted,
    MemoryBudgetExceeded,
    NotSupportedByAgent,
    SessionBusy,
    SessionConflictError,
    SessionError,
    SessionLimitError,
    SessionNotFound,
    SessionRequestError,
    SessionsUnavailable,
    TurnAgentUnavailable,
    TurnBudgetExhausted,
    TurnFailed,
    TurnMemoryBudget,
    TurnRetryable,
    TurnSessionLost,
)
from serve.workspaces.files.errors import ErrorKind, WorkspaceFsError
from serve.workspaces.state.settings_file import SETTINGS_PATH, SettingsFileError

__all__ = [
    "FS_STATUS",
    "RETRYABLE_TURN_CODES",
    "SESSION_ERRORS",
    "SETTINGS_FILE_STATUS",
    "TURN_RETRY_AFTER",
    "WireError",
    "fs_error",
    "rest",
    "settings_file_error",
    "wire_error",
    "workspace_fs_error",
]


@dataclass(frozen=True)
class WireError:
    """A failure as a client sees it, before any transport: ``status`` (HTTP's numbers,
    also ``data.httpStatus`` on ``/acp``), the stable ``code`` (``None``: the body has
    none), the JSON ``body`` and extra ``headers``."""

    status: int
    code: str | None
    body: dict[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)


def rest(wire: WireError) -> tuple[int, dict[str, Any], dict[str, str]]:
    """The REST rendering: ``(status, JSON body, headers)``, fresh containers."""
    return wire.status, dict(wire.body), dict(wire.headers)


_RETRY: Final = {"Retry-After": "5"}

# ---- sessions -----------------------------------------------------------------------------

#: Retry-After (seconds) of a released session's prompt that could not bind an agent.
TURN_RETRY_AFTER: Final[Mapping[str, str]] = {
    "agent_unavailable": "1",
    "memory_budget_exceeded": "10",
}

#: Session exception → (status, extra headers). The body is the exception's own
#: ``{"error", "code", ...}``.
SESSION_ERRORS: Final[tuple[tuple[type[SessionError], int, dict[str, str]], ...]] = (
    (SessionRequestError, 400, {}),
    (AgentRefusedError, 400, {}),
    (NotSupportedByAgent, 501, {}),
    (SessionBusy, 409, {}),
    (BudgetExhausted, 402, {}),
    (SessionConflictError, 409, _RETRY),
    (MemoryBudgetExceeded, 503, {"Retry-After": "10"}),
    # Deterministic until the operator grants the path: no Retry-After, retryable false.
    (AgentSandboxDenied, 503, {}),
    (AgentStartFailing, 503, {}),  # the same command kept failing: no Retry-After
    (SessionLimitError, 503, _RETRY),
    (SessionsUnavailable, 503, _RETRY),
    (SessionNotFound, 404, {}),
    # A failed turn (RETRYABLE_TURN_CODES, serve/sessions/errors.py, say which may retry):
    (TurnBudgetExhausted, 402, {}),  # spent: 402 until PATCH /session/:id/budget raises it
    (TurnSessionLost, 404, {}),  # the agent lost the session: it is gone
    (TurnAgentUnavailable, 503, {"Retry-After": TURN_RETRY_AFTER["agent_unavailable"]}),
    (TurnMemoryBudget, 503, {"Retry-After": TURN_RETRY_AFTER["memory_budget_exceeded"]}),
    (TurnRetryable, 503, {}),
    (TurnFailed, 500, {}),
)


def _session_error(exc: SessionError) -> WireError | None:
    for kind, status, headers in SESSION_ERRORS:
        if isinstance(exc, kind):
            return WireError(status, exc.code or None, exc.body(), dict(headers))
    return None  # a SessionError subclass missing from the table: a bug, 500


# ---- workspace file system ----------------------------------------------------------------

#: errorKind → HTTP status, verbatim from spec §4.5.
FS_STATUS: Final[Mapping[ErrorKind, int]] = {
    "path_outside_workspace": 400,
    "symlink_escape": 400,
    "parse_error": 400,
    "path_not_found": 404,
    "hash_mismatch": 409,
    "file_already_exists": 409,
    "file_too_large": 413,
    "binary_file": 422,
    "text_not_found": 422,
    "ambiguous_text_match": 422,
    "untrusted_workspace": 403,
    "permission_denied": 403,
    "io_error": 503,
    "internal_error": 500,
}


def fs_error(err: WorkspaceFsError) -> WireError:
    """The file routes' envelope (spec §4.5): ``{"errorKind","error","hint"?,"status"}``;
    also ``data`` of an ``/acp`` ``_qwen/file/*`` error."""
    status = FS_STATUS[err.kind]
    body: dict[str, Any] = {"errorKind": err.kind, "error": err.message}
    if err.hint is not None:
        body["hint"] = err.hint
    body["status"] = status
    return WireError(status, None, body)


def workspace_fs_error(err: WorkspaceFsError) -> WireError:
    """The workspace routes' envelope for the same errors (memory, settings, tools,
    status): ``{"error","code","errorKind"}``, the kind as both code and errorKind."""
    body = {"error": err.message, "code": err.kind, "errorKind": err.kind}
    return WireError(FS_STATUS[err.kind], err.kind, body)


# ---- the settings file --------------------------------------------------------------------

#: Every settings-file failure (unreadable, not strict JSON, kept changing) is a conflict
#: with the file's state: the client fixes or re-reads the file.
SETTINGS_FILE_STATUS: Final = 409


def settings_file_error(err: SettingsFileError) -> WireError:
    body = {"error": err.message, "code": err.code, "path": SETTINGS_PATH}
    return WireError(SETTINGS_FILE_STATUS, err.code, body)


# ---- the ACP client -----------------------------------------------------------------------


def _remote_error(exc: RemoteError) -> WireError:
    body: dict[str, Any] = {"error": exc.message, "code": exc.code}
    if exc.data is not None:
        body["data"] = exc.data
    return WireError(500, None, body)


def _request_timeout(exc: RequestTimeout) -> WireError:
    timeout_ms = int(exc.timeout_s * 1000)
    message = f"agent did not answer {exc.method} within {timeout_ms} ms"
    if exc.method in ("initialize", "session/new"):
        # The reference's safe-retry shape: nothing was created.
        body: dict[str, Any] = {
            "error": message,
            "code": "init_timeout",
            "errorKind": "init_timeout",
            "retryable": True,
            "sideEffectPossible": False,
            "phase": "channel.initialize" if exc.method == "initialize" else "session.new",
            "timeoutMs": timeout_ms,
        }
    elif exc.method in ("session/load", "session/resume", "session/unstable_resumeSession"):
        body = {
            "error": message,
            "code": "session_restore_timeout",
            "errorKind": "restore_timeout",
            "retryable": True,
            "timeoutMs": timeout_ms,
        }
    else:
        body = {
            "error": message,
            "code": "agent_timeout",
            "retryable": True,
            "timeoutMs": timeout_ms,
        }
    return WireError(504, body["code"], body, dict(_RETRY))


def _channel_closed(exc: ChannelClosed) -> WireError:
    body = {
        "error": f"agent channel closed: {exc}",
        "code": "acp_channel_unavailable",
        "retryable": True,
    }
    return WireError(503, "acp_channel_unavailable", body, dict(_RETRY))


# ---- the table ----------------------------------------------------------------------------


def wire_error(exc: BaseException) -> WireError | None:
    """The wire form of a domain exception, or ``None`` when it is unexpected (a 500)."""
    if isinstance(exc, SessionError):
        return _session_error(exc)
    if isinstance(exc, WorkspaceFsError):
        return fs_error(exc)
    if isinstance(exc, SettingsFileError):
        return settings_file_error(exc)
    if isinstance(exc, RemoteError):
        return _remote_error(exc)
    if isinstance(exc, RequestTimeout):
        return _request_timeout(exc)
    if isinstance(exc, ChannelClosed):
        return _channel_closed(exc)
    if isinstance(exc, AccessError):
        return _access_error(exc)
    return None


def _access_error(exc: AccessError) -> WireError | None:
    """A role missing: 403 ``forbidden`` with ``need``; a quota spent: 429 with
    ``Retry-After``."""
    if isinstance(exc, Forbidden):
        return WireError(403, exc.code, exc.body())
    if isinstance(exc, PrincipalBudgetExhausted):
        return WireError(402, exc.code, exc.body())
    if isinstance(exc, WorkspaceDenied):
        return WireError(404, exc.code, exc.body())
    if isinstance(exc, QuotaExceeded):
        return WireError(429, exc.code, exc.body(), {"Retry-After": str(exc.retry_after_s)})
    return None
