"""What can go wrong with a session, by who failed; the HTTP layer maps it to the wire.

Each exception carries the client-facing ``message``, a stable ``code`` and extra body
``fields`` (in order); :mod:`serve.errors` holds the one table from these classes to
a wire status and headers. Nothing here knows HTTP.

    SessionError                         base
    ├── SessionRequestError   the client  a request the session cannot take (bad value)
    │   ├── ApprovalModeRefused           the mode is not the agent's (or it refused it)
    │   ├── InvalidRequest                a request body refused before any session is asked
    │   └── UnknownClient                 a client id not registered on the session
    ├── SessionNotFound       the client  no live session has that id (or it is closing)
    ├── AgentRefusedError     the agent   the agent answered an operation with an error
    │   └── ModelSwitchFailed             the agent refused the model switch
    ├── NotSupportedByAgent   the agent   the agent lacks the capability (e.g. session/load)
    ├── SessionConflictError  a racer     another operation on this session is in progress
    │   └── SessionBusy                   rewind/branch while a prompt runs or waits
    ├── SessionLimitError     a limit     --max-sessions / --max-total-sessions reached
    │   ├── MemoryBudgetExceeded          --agent-memory-budget-mb: no child fits, none idle
    │   └── PromptQueueRefused            the session's prompt queue is full
    ├── SessionsUnavailable   gone        the daemon is draining or the registry restarted
    │   ├── AgentUnavailable              the session's agent is not connected now
    │   ├── AgentStartFailed              the agent of a new or restored session never came up
    │   ├── AgentSandboxDenied            ... because the file sandbox refused it a path
    │   └── ControlTimeout                a control call never got its turn (not sent)
    └── TurnFailed            the turn    a prompt's turn ended with ``turn_error`` (500)
        ├── TurnBudgetExhausted           the budget ran out (402 until it is raised)
        ├── TurnSessionLost               the agent lost the session: it is gone (404)
        └── TurnRetryable                 the agent is restored, the daemon is coming back
            ├── TurnAgentUnavailable      a released session found no agent now
            └── TurnMemoryBudget          ... because of the memory budget

Which codes of a failed turn are retryable is the domain's knowledge
(:data:`RETRYABLE_TURN_CODES`); :meth:`TurnFailed.of` picks the class from the terminal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "RETRYABLE_TURN_CODES",
    "AgentRefusedError",
    "AgentSandboxDenied",
    "AgentStartFailed",
    "AgentUnavailable",
    "ApprovalModeRefused",
    "ControlTimeout",
    "InvalidRequest",
    "MemoryBudgetExceeded",
    "ModelSwitchFailed",
    "NotSupportedByAgent",
    "PromptQueueRefused",
    "SessionBusy",
    "SessionConflictError",
    "SessionError",
    "SessionLimitError",
    "SessionNotFound",
    "SessionRequestError",
    "SessionsUnavailable",
    "TurnAgentUnavailable",
    "TurnBudgetExhausted",
    "TurnFailed",
    "TurnMemoryBudget",
    "TurnRetryable",
    "TurnSessionLost",
    "UnknownClient",
]


class SessionError(Exception):
    """Base of the session domain's errors: ``message``, ``code``, extra ``fields``."""

    def __init__(self, message: str, code: str, **fields: object) -> None:
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


class SessionOwnedElsewhere(SessionsUnavailable):
    """A shared journal's session whose lease another live daemon holds: restoring it here
    would make two owners (503, retryable: the request is forwarded, or the next try is)."""

    def __init__(self, session_id: str, detail: str) -> None:
        super().__init__(
            f'Session "{session_id}" is owned by another daemon ({detail})',
            "session_owned_elsewhere",
            sessionId=session_id,
            retryable=True,
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


class InvalidRequest(SessionRequestError):
    """A request body a session use case refuses before any session is asked (a prompt's
    content, ``promptId``, ``deadlineMs``, ``_meta``, ``steer``; a ``cwd``). ``code`` None:
    the wire body is ``{"error"}`` alone (the reference's shape for those refusals)."""

    def __init__(self, message: str, code: str | None = None, **fields: object) -> None:
        super().__init__(message, code or "", **fields)

    def body(self) -> dict[str, Any]:
        if not self.code:
            return {"error": self.message, **self.fields}
        return super().body()


class UnknownClient(SessionRequestError):
    """A client id (``X-Qwen-Client-Id``) that is not registered on the session."""

    def __init__(self, session_id: str, client_id: str) -> None:
        super().__init__(
            f'Client id "{client_id}" is not registered on this session',
            "invalid_client_id",
            sessionId=session_id,
            clientId=client_id,
        )


class SessionNotFound(SessionError):
    """No live session has this id (never made, closed, or closing)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f'No session with id "{session_id}"', "session_not_found", sessionId=session_id
        )
        self.session_id = session_id


class PromptQueueRefused(SessionLimitError):
    """A prompt the session's queue had no room for (``--max-pending-prompts``)."""

    def __init__(self, session_id: str, limit: int, pending: int) -> None:
        super().__init__(
            f"Prompt queue is full ({limit})",
            "prompt_queue_full",
            sessionId=session_id,
            limit=limit,
            pendingCount=pending,
        )
        self.limit = limit
        self.pending = pending


class AgentStartFailed(SessionsUnavailable):
    """The agent of a session being created or restored did not come up (spawn,
    ``initialize``, ``session/new``): an unexpected failure, retryable."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(
            f"Agent failed to start: {cause}", "acp_channel_unavailable", retryable=True
        )
        self.cause = cause


class AgentStartFailing(SessionsUnavailable):
    """The agent command failed to start ``failures`` times in a row, each time by exiting
    (or by failing to spawn at all): deterministic until someone fixes the command or its
    environment, so not retryable (no ``Retry-After``). The code stays the one a client
    knows for a start failure (``acp_channel_unavailable``). Timeouts never become this:
    a slow start on a loaded machine is transient."""

    def __init__(self, cause: BaseException, failures: int) -> None:
        super().__init__(
            f"Agent failed to start {failures} times in a row (fix the agent command; "
            f"/daemon/status has the last error): {cause}",
            "acp_channel_unavailable",
            retryable=False,
            consecutiveFailures=failures,
        )
        self.cause = cause
        self.failures = failures


class AgentSandboxDenied(SessionsUnavailable):
    """The agent died at start-up because the daemon's file sandbox refused it ``path``:
    deterministic (every retry fails the same way until the operator grants the path with
    ``flag``, None for a protected place no flag grants), so never retryable."""

    def __init__(self, message: str, path: str, flag: str | None) -> None:
        super().__init__(
            message,
            "agent_sandbox_denied",
            path=path,
            grantFlag=flag,
            retryable=False,
        )
        self.path = path
        self.flag = flag


#: Codes of a failed turn (``turn_error``) that a client may retry: the agent is restored
#: in place, the daemon is coming back, or a released session found no agent now.
RETRYABLE_TURN_CODES: Final = frozenset(
    {
        "channel_closed",
        "daemon_shutdown",
        "owner_lost",  # the daemon running it stopped; the session was restored elsewhere
        "agent_restarted",
        "cancel_timeout",
        "agent_oom",  # the agent is restored in place: the next prompt may run
        "agent_unavailable",
        "memory_budget_exceeded",
    }
)


class TurnFailed(SessionError):
    """A prompt's turn ended with ``turn_error``: the terminal's ``message`` (as given),
    its ``code``, ``data`` and ``errorKind`` when present, and the ``promptId``. Built by
    :meth:`of`, whose class says whether and how a retry may succeed."""

    def __init__(self, prompt_id: str, terminal: Mapping[str, Any]) -> None:
        code = terminal.get("code")
        super().__init__(
            str(terminal.get("message", "prompt failed")), code if isinstance(code, str) else ""
        )
        self.prompt_id = prompt_id
        self.error: object = terminal.get("message", "prompt failed")
        #: The terminal's ``code``, ``data`` and ``errorKind``, those it has, in that order.
        self.detail: dict[str, Any] = {
            k: terminal[k] for k in ("code", "data", "errorKind") if k in terminal
        }

    def body(self) -> dict[str, Any]:
        return {"error": self.error, **self.detail, "promptId": self.prompt_id}

    @staticmethod
    def of(prompt_id: str, terminal: Mapping[str, Any]) -> TurnFailed:
        code = terminal.get("code")
        kind = _TURN_FAILURES.get(code, TurnFailed) if isinstance(code, str) else TurnFailed
        if kind is TurnFailed and code in RETRYABLE_TURN_CODES:
            kind = TurnRetryable
        return kind(prompt_id, terminal)


class TurnBudgetExhausted(TurnFailed):
    """The session's budget is spent: no retry until ``PATCH /session/:id/budget``."""


class TurnSessionLost(TurnFailed):
    """The agent no longer knows the session (``agent_session_not_found``): it is gone."""


class TurnRetryable(TurnFailed):
    """A failure the daemon recovers from (the agent restored in place, the daemon coming
    back): the same prompt may succeed if sent again."""


class TurnAgentUnavailable(TurnRetryable):
    """A released session found no agent for its prompt; it stays, released."""


class TurnMemoryBudget(TurnRetryable):
    """A released session found no agent within the memory budget; it stays, released."""


_TURN_FAILURES: Final[Mapping[str, type[TurnFailed]]] = {
    "budget_exhausted": TurnBudgetExhausted,
    "agent_session_not_found": TurnSessionLost,
    "agent_unavailable": TurnAgentUnavailable,
    "memory_budget_exceeded": TurnMemoryBudget,
}
