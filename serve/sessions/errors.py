"""What can go wrong with a session, by who failed; the HTTP layer maps it to the wire.

Each exception carries the client-facing ``message``, a stable ``code`` and extra body
``fields`` (in order); :mod:`serve.http.errors` holds the one table from these classes to
HTTP status and headers. Nothing here knows HTTP.

    SessionError                         base
    ├── SessionRequestError   the client  a request the session cannot take (bad value)
    │   └── ApprovalModeRefused           the mode is not the agent's (or it refused it)
    ├── AgentRefusedError     the agent   the agent answered an operation with an error
    │   └── ModelSwitchFailed             the agent refused the model switch
    ├── NotSupportedByAgent   the agent   the agent lacks the capability (e.g. session/load)
    ├── SessionConflictError  a racer     another operation on this session is in progress
    │   └── SessionBusy                   rewind/branch while a prompt runs or waits
    ├── SessionLimitError     a limit     --max-sessions / --max-total-sessions reached
    │   └── MemoryBudgetExceeded          --agent-memory-budget-mb: no child fits, none idle
    └── SessionsUnavailable   gone        the daemon is draining or the registry restarted
        ├── AgentUnavailable              the session's agent is not connected now
        └── ControlTimeout                a control call never got its turn (not sent)
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AgentRefusedError",
    "AgentUnavailable",
    "ApprovalModeRefused",
    "ControlTimeout",
    "MemoryBudgetExceeded",
    "ModelSwitchFailed",
    "NotSupportedByAgent",
    "SessionBusy",
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


class MemoryBudgetExceeded(SessionLimitError):
    """A new agent child would pass the memory budget and no idle session can be released."""


class SessionsUnavailable(SessionError):
    """No session can be created or restored now (draining, or the registry restarted)."""


class SessionBusy(SessionConflictError):
    """A history mutation (rewind, branch) while a prompt runs or waits (409, no retry hint:
    it depends on the prompts, not on time)."""

    def __init__(self, session_id: str, what: str) -> None:
        super().__init__(
            f"Cannot {what} while a prompt is running or queued",
            "session_busy",
            sessionId=session_id,
        )
        self.session_id = session_id
        self.what = what


class BudgetExhausted(SessionError):
    """A prompt to a session whose token or cost budget is spent (402 until it is raised
    with ``PATCH /session/:id/budget``)."""

    def __init__(self, session_id: str, dimension: str, spent: float, limit: float) -> None:
        super().__init__(
            f"The session's {dimension} budget is exhausted ({spent:g} of {limit:g}); "
            "raise it with PATCH /session/:id/budget",
            "budget_exhausted",
            sessionId=session_id,
            dimension=dimension,
            spent=spent,
            limit=limit,
        )


class AgentUnavailable(SessionsUnavailable):
    """The session's agent is not connected (restarting, or released and not yet rebound)."""

    def __init__(self, session_id: str = "") -> None:
        super().__init__(
            "The session's agent is not connected", "acp_channel_unavailable", retryable=True
        )
        self.session_id = session_id


class ControlTimeout(SessionsUnavailable):
    """A control request waited its whole bound behind earlier ones and was not sent to
    the agent (it did not happen): ``agent_busy``."""

    def __init__(self, what: str, timeout_s: float) -> None:
        super().__init__(
            f"{what} was not sent: the agent is still busy after {timeout_s:g} s",
            "agent_busy",
            retryable=True,
        )
        self.what = what
        self.timeout_s = timeout_s


class ModelSwitchFailed(AgentRefusedError):
    """The agent refused ``session/set_model`` (or the model config option)."""

    def __init__(self, model_id: str, error: str) -> None:
        super().__init__(
            f"Model switch failed: {error}", "model_switch_failed", requestedModelId=model_id
        )
        self.model_id = model_id
        self.error = error


class ApprovalModeRefused(SessionRequestError):
    """``allowed`` set: the agent does not offer the mode (``invalid_approval_mode``, the
    agent's ids listed); else the agent refused the switch (``approval_mode_failed``)."""

    def __init__(self, message: str, allowed: list[str] | None = None) -> None:
        if allowed is not None:
            super().__init__(message, "invalid_approval_mode", allowed=allowed)
        else:
            super().__init__(message, "approval_mode_failed")
        self.allowed = allowed
