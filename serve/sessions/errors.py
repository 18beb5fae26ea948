"""What can go wrong with a session, by who failed; the HTTP layer maps it to the wire.

Each exception carries the client-facing ``message``, a stable ``code`` and extra body
``fields`` (in order); :mod:`serve.http.errors` holds the one table from these classes to
HTTP status and headers. Nothing here knows HTTP.

    SessionError                         base
    ├── SessionRequestError   the client  a request the session cannot take (bad value)
    ├── AgentRefusedError     the agent   the agent answered an operation with an error
    ├── NotSupportedByAgent   the agent   the agent lacks the capability (e.g. session/load)
    ├── SessionConflictError  a racer     another operation on this session is in progress
    ├── SessionLimitError     a limit     --max-sessions / --max-total-sessions reached
    └── SessionsUnavailable   gone        the daemon is draining or the registry restarted
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AgentRefusedError",
    "NotSupportedByAgent",
    "SessionConflictError",
    "SessionError",
    "SessionLimitError",
    "SessionRequestError",
    "SessionsUnavailable",
]


class SessionError(Exception):
    """Base of the session domain's errors: ``message``, ``code``, extra ``fields``."""

    def __init__(self, message: str, code: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.fields = fields

    def body(self) -> dict[str, Any]:
        """The wire body: ``{"error", "code", **fields}`` in that order."""
        return {"error": self.message, "code": self.code, **self.fields}


class SessionRequestError(SessionError):
    """The client asked for something the session cannot do (an invalid value)."""


class AgentRefusedError(SessionError):
    """The agent answered the client's operation with an error."""


class NotSupportedByAgent(SessionError):
    """The agent does not implement what was asked."""


class SessionConflictError(SessionError):
    """Another operation on this session is in progress; retry later."""


class SessionLimitError(SessionError):
    """A session limit is reached."""


class SessionsUnavailable(SessionError):
    """No session can be created or restored now (draining, or the registry restarted)."""
