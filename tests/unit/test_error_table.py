"""The one table from domain exceptions to the wire (serve/errors, rendered for REST by
serve/http/errors.py), walked.

Each session-domain exception, as the session actor and registry raise it, must reach the
client with the status, headers and body bytes the daemon always sent (the bodies used to
be built in the domain code with ``ApiError``; they are pinned here byte for byte).
"""

from __future__ import annotations

import inspect

import msgspec
import pytest

from acp.errors import ChannelClosed, RemoteError, RequestTimeout
from serve.errors import (
    FS_STATUS,
    RETRYABLE_TURN_CODES,
    TURN_RETRY_AFTER,
    WireError,
    fs_error,
    rest,
    workspace_fs_error,
)
from serve.http.errors import DOMAIN_ERRORS, ApiError, to_api_error
from serve.sessions import errors as session_errors
from serve.sessions.errors import (
    AgentRefusedError,
    AgentSandboxDenied,
    AgentStartFailed,
    AgentStartFailing,
    AgentUnavailable,
    ApprovalModeRefused,
    BudgetExhausted,
    ControlTimeout,
    InvalidRequest,
    MemoryBudgetExceeded,
    ModelSwitchFailed,
    NotSupportedByAgent,
    PromptQueueRefused,
    SessionBusy,
    SessionConflictError,
    SessionError,
    SessionLimitError,
    SessionNotFound,
    SessionOwnedElsewhere,
    SessionRequestError,
    SessionsUnavailable,
    TurnFailed,
    UnknownClient,
)
from serve.workspaces.files.errors import ERROR_KINDS, make_error
from serve.workspaces.state.settings_file import SettingsFileError

RETRY = {"Retry-After": "5"}

#: (exception as raised today, status, headers, exact body bytes).
CASES: list[tuple[SessionError, int, dict[str, str], bytes]] = [
    (
        SessionRequestError(
            "The agent does not offer approval mode 'x'",
            "invalid_approval_mode",
            allowed=["plan", "default"],
        ),
        400,
        {},
        b'{"error":"The agent does not offer approval mode \'x\'",'
        b'"code":"invalid_approval_mode","allowed":["plan","default"]}',
    ),
    (
        AgentRefusedError("Model switch failed: nope", "model_switch_failed", requestedModelId="m"),
        400,
        {},
        b'{"error":"Model switch failed: nope","code":"model_switch_failed",'
        b'"requestedModelId":"m"}',
    ),
    (
        AgentRefusedError("Approval mode change failed: no", "approval_mode_failed"),
        400,
        {},
        b'{"error":"Approval mode change failed: no","code":"approval_mode_failed"}',
    ),
    (
        NotSupportedByAgent("The agent does not support session/load", "not_supported_by_agent"),
        501,
        {},
        b'{"error":"The agent does not support session/load","code":"not_supported_by_agent"}',
    ),
    (
        SessionConflictError(
            "A session/load of this session is in progress",
            "restore_in_progress",
            reason="conflicting_restore",
            retryable=True,
            sessionId="s1",
            activeAction="load",
            requestedAction="resume",
        ),
        409,
        RETRY,
        b'{"error":"A session/load of this session is in progress","code":"restore_in_progress",'
        b'"reason":"conflicting_restore","retryable":true,"sessionId":"s1",'
        b'"activeAction":"load","requestedAction":"resume"}',
    ),
    (
        SessionLimitError(
            "Session limit reached (2)", "session_limit_exceeded", limit=2, scope="workspace"
        ),
        503,
        RETRY,
        b'{"error":"Session limit reached (2)","code":"session_limit_exceeded","limit":2,'
        b'"scope":"workspace"}',
    ),
    (
        MemoryBudgetExceeded(
            "Agent memory budget exceeded (900 of 800 MiB in use) and no idle session can be "
            "released",
            "memory_budget_exceeded",
            budgetMb=800,
            usedMb=900,
        ),
        503,
        {"Retry-After": "10"},
        b'{"error":"Agent memory budget exceeded (900 of 800 MiB in use) and no idle session '
        b'can be released","code":"memory_budget_exceeded","budgetMb":800,"usedMb":900}',
    ),
    (
        BudgetExhausted("s1", "tokens", 120, 100),
        402,
        {},
        b'{"error":"The session\'s tokens budget is exhausted (120 of 100); raise it with '
        b'PATCH /session/:id/budget","code":"budget_exhausted","sessionId":"s1",'
        b'"dimension":"tokens","spent":120,"limit":100}',
    ),
    (
        ApprovalModeRefused("Unknown approval mode: fast", allowed=["default", "plan"]),
        400,
        {},
        b'{"error":"Unknown approval mode: fast","code":"invalid_approval_mode",'
        b'"allowed":["default","plan"]}',
    ),
    (
        ApprovalModeRefused("Approval mode change failed: no"),
        400,
        {},
        b'{"error":"Approval mode change failed: no","code":"approval_mode_failed"}',
    ),
    (
        ModelSwitchFailed("m2", "unknown model"),
        400,
        {},
        b'{"error":"Model switch failed: unknown model","code":"model_switch_failed",'
        b'"requestedModelId":"m2"}',
    ),
    (
        SessionBusy("s1", "rewind"),
        409,
        {},
        b'{"error":"Cannot rewind while a prompt is running or queued","code":"session_busy",'
        b'"sessionId":"s1"}',
    ),
    (
        AgentUnavailable("s1"),
        503,
        RETRY,
        b'{"error":"The session\'s agent is not connected","code":"acp_channel_unavailable",'
        b'"retryable":true}',
    ),
    (
        ControlTimeout("set_model", 30),
        503,
        RETRY,
        b'{"error":"set_model was not sent: the agent is still busy after 30 s",'
        b'"code":"agent_busy","retryable":true}',
    ),
    (
        SessionOwnedElsewhere("s1", "its lease is held by d2 at http://10.0.0.8:4170"),
        503,
        RETRY,
        b'{"error":"Session \\"s1\\" is owned by another daemon (its lease is held by d2 at '
        b'http://10.0.0.8:4170)","code":"session_owned_elsewhere","sessionId":"s1",'
        b'"retryable":true}',
    ),
    (
        SessionsUnavailable("Daemon is draining", "daemon_draining"),
        503,
        RETRY,
        b'{"error":"Daemon is draining","code":"daemon_draining"}',
    ),
    # The session service's refusals (serve/api), as routes/sessions.py built them.
    (
        InvalidRequest("`prompt` must be a non-empty array of content blocks"),
        400,
        {},
        b'{"error":"`prompt` must be a non-empty array of content blocks"}',
    ),
    (
        InvalidRequest("`deadlineMs` must be a positive integer", "invalid_deadline_ms"),
        400,
        {},
        b'{"error":"`deadlineMs` must be a positive integer","code":"invalid_deadline_ms"}',
    ),
    (
        UnknownClient("s1", "c1"),
        400,
        {},
        b'{"error":"Client id \\"c1\\" is not registered on this session",'
        b'"code":"invalid_client_id","sessionId":"s1","clientId":"c1"}',
    ),
    (
        SessionNotFound("s1"),
        404,
        {},
        b'{"error":"No session with id \\"s1\\"","code":"session_not_found","sessionId":"s1"}',
    ),
    (
        PromptQueueRefused("s1", 4, 4),
        503,
        RETRY,
        b'{"error":"Prompt queue is full (4)","code":"prompt_queue_full","sessionId":"s1",'
        b'"limit":4,"pendingCount":4}',
    ),
    (
        AgentStartFailed(RuntimeError("spawn failed")),
        503,
        RETRY,
        b'{"error":"Agent failed to start: spawn failed","code":"acp_channel_unavailable",'
        b'"retryable":true}',
    ),
    (  # deterministic: no Retry-After, retryable false (serve/isolation/denials.py)
        AgentSandboxDenied("denied /x/a.log", "/x/a.log", "--agent-allow-write /x"),
        503,
        {},
        b'{"error":"denied /x/a.log","code":"agent_sandbox_denied","path":"/x/a.log",'
        b'"grantFlag":"--agent-allow-write /x","retryable":false}',
    ),
    (  # the same command kept exiting at start: no Retry-After, retryable false
        AgentStartFailing(OSError("exit 3"), 4),
        503,
        {},
        b'{"error":"Agent failed to start 4 times in a row (fix the agent command; '
        b'/daemon/status has the last error): exit 3","code":"acp_channel_unavailable",'
        b'"retryable":false,"consecutiveFailures":4}',
    ),
    # A failed turn (its terminal's data), as the blocking prompt answers it.
    (
        TurnFailed.of("p1", {"sessionId": "s1", "message": "boom", "code": -32603}),
        500,
        {},
        b'{"error":"boom","code":-32603,"promptId":"p1"}',
    ),
    (
        TurnFailed.of("p1", {"sessionId": "s1", "message": "spent", "code": "budget_exhausted"}),
        402,
        {},
        b'{"error":"spent","code":"budget_exhausted","promptId":"p1"}',
    ),
    (
        TurnFailed.of("p1", {"message": "gone", "code": "agent_session_not_found"}),
        404,
        {},
        b'{"error":"gone","code":"agent_session_not_found","promptId":"p1"}',
    ),
    (
        TurnFailed.of("p1", {"message": "no agent", "code": "agent_unavailable", "data": {}}),
        503,
        {"Retry-After": "1"},
        b'{"error":"no agent","code":"agent_unavailable","data":{},"promptId":"p1"}',
    ),
    (
        TurnFailed.of(
            "p1",
            {
                "message": "over",
                "code": "memory_budget_exceeded",
                "errorKind": "memory_budget_exceeded",
            },
        ),
        503,
        {"Retry-After": "10"},
        b'{"error":"over","code":"memory_budget_exceeded","errorKind":"memory_budget_exceeded",'
        b'"promptId":"p1"}',
    ),
    (
        TurnFailed.of("p1", {"code": "channel_closed"}),
        503,
        {},
        b'{"error":"prompt failed","code":"channel_closed","promptId":"p1"}',
    ),
]


@pytest.mark.parametrize(("exc", "status", "headers", "body"), CASES)
def test_each_domain_error_has_its_status_headers_and_body(
    exc: SessionError, status: int, headers: dict[str, str], body: bytes
) -> None:
    mapped = to_api_error(exc)
    assert mapped is not None
    assert (mapped.status, mapped.headers) == (status, headers)
    assert msgspec.json.encode(mapped.body) == body


def test_the_table_covers_every_session_error_class() -> None:
    """A new exception class of the session domain must get a row (else it would be a 500)."""
    classes = {
        obj
        for _, obj in inspect.getmembers(session_errors, inspect.isclass)
        if issubclass(obj, SessionError) and obj is not SessionError
    }
    rows = {kind for kind, _, _ in DOMAIN_ERRORS}
    assert rows <= classes
    # every class is mapped by its own row or its base's (first match wins) ...
    assert all(any(issubclass(cls, kind) for kind in rows) for cls in classes)
    # ... and every class has a byte-exact case above
    assert {type(exc) for exc, *_ in CASES} == classes


def test_headers_are_not_shared_between_responses() -> None:
    first = to_api_error(SessionsUnavailable("Daemon is draining", "daemon_draining"))
    assert first is not None
    first.headers["X-Extra"] = "1"
    second = to_api_error(SessionsUnavailable("Daemon is draining", "daemon_draining"))
    assert second is not None and "X-Extra" not in second.headers


def test_acp_errors_and_the_unexpected() -> None:
    remote = to_api_error(RemoteError(-32002, "not found", None))
    assert remote is not None and (remote.status, remote.body) == (
        500,
        {"error": "not found", "code": -32002},
    )
    timeout = to_api_error(RequestTimeout("session/prompt", 1.5))
    assert timeout is not None and timeout.status == 504 and timeout.headers == RETRY
    assert timeout.body["code"] == "agent_timeout" and timeout.body["timeoutMs"] == 1500
    closed = to_api_error(ChannelClosed("gone"))
    assert closed is not None and closed.status == 503
    assert closed.body["code"] == "acp_channel_unavailable"
    assert to_api_error(ValueError("a bug")) is None
    api = ApiError(418, {"error": "teapot"})
    assert to_api_error(api) is api


# ---- the neutral table (serve/errors): the families beyond sessions -----------------------


def test_workspace_fs_errors_in_both_envelopes_byte_for_byte() -> None:
    """The file routes' (spec §4.5) and the workspace routes' bodies of one error, as the
    routes answered them when the status lived on the exception."""
    err = make_error("hash_mismatch", "expected a, found b", "re-read the file")
    file_route = to_api_error(err)
    assert file_route is not None and file_route.status == 409 and file_route.headers == {}
    assert msgspec.json.encode(file_route.body) == (
        b'{"errorKind":"hash_mismatch","error":"expected a, found b",'
        b'"hint":"re-read the file","status":409}'
    )
    workspace_route = workspace_fs_error(make_error("untrusted_workspace", "not trusted"))
    assert workspace_route.status == 403
    assert msgspec.json.encode(workspace_route.body) == (
        b'{"error":"not trusted","code":"untrusted_workspace","errorKind":"untrusted_workspace"}'
    )


def test_settings_file_errors_are_409_with_the_path() -> None:
    mapped = to_api_error(SettingsFileError("settings_busy", "it kept changing"))
    assert mapped is not None and (mapped.status, mapped.headers) == (409, {})
    assert msgspec.json.encode(mapped.body) == (
        b'{"error":"it kept changing","code":"settings_busy","path":".qwen/settings.json"}'
    )
    assert not hasattr(SettingsFileError("x", "y"), "status")


def test_every_fs_kind_has_a_status() -> None:
    for kind in ERROR_KINDS:
        assert fs_error(make_error(kind, "m")).status == FS_STATUS[kind]


def test_the_retryable_turn_codes_are_one_list_for_both_fronts() -> None:
    """REST answers a retryable turn 503 (the released-session codes with Retry-After),
    /acp its httpStatus 503: both read this one set."""
    assert set(TURN_RETRY_AFTER) <= RETRYABLE_TURN_CODES
    assert {"channel_closed", "agent_oom", "agent_unavailable"} <= RETRYABLE_TURN_CODES
    assert "agent_session_not_found" not in RETRYABLE_TURN_CODES
    assert "budget_exhausted" not in RETRYABLE_TURN_CODES
    assert dict(TURN_RETRY_AFTER) == {"agent_unavailable": "1", "memory_budget_exceeded": "10"}


def test_the_rest_renderer_hands_out_fresh_containers() -> None:
    wire = WireError(503, "x", {"error": "e"}, {"Retry-After": "5"})
    status, body, headers = rest(wire)
    body["more"] = 1
    headers["X"] = "1"
    assert (status, wire.body, dict(wire.headers)) == (503, {"error": "e"}, {"Retry-After": "5"})
