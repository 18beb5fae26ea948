"""Wire types of the public HTTP API, as frozen msgspec Structs (qwen-serve-spec §4, §5).

These Structs are the *documented* shapes of request and response bodies: the OpenAPI
document (:mod:`serve.http.openapi.document`) is generated from them with
``msgspec.json.schema_components``, and clients (the SDK) may decode with them. Where a
route module already owns a wire Struct (the workspace file results, the env/preflight
cells, the permission outcomes, the security front's error body) that Struct is used
directly by :mod:`serve.http.openapi.catalog` instead of a copy here, so the document cannot
drift from the encoder.

Conventions: field names are camelCase on the wire (``rename="camel"``); optional fields
default to ``UNSET`` so they are neither required nor sent as ``null``; no Struct forbids
unknown fields, because every body the reference documents is an open object (clients
must ignore fields they do not know, and request bodies forward extra fields to the
agent). Nothing here does I/O.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from serve.permissions.voting import Outcome

__all__ = [
    "APPROVAL_MODES",
    "ApprovalModeRequest",
    "ApprovalModeResponse",
    "CapabilitiesEnvelope",
    "ContentBlock",
    "CreateSessionRequest",
    "DaemonEvent",
    "DeviceFlowStartRequest",
    "DeviceFlowView",
    "ErrorEnvelope",
    "FeatureDetail",
    "FileEditRequest",
    "FileErrorBody",
    "FileWriteRequest",
    "HealthResponse",
    "HeartbeatResponse",
    "InitRequest",
    "InitResponse",
    "McpRestartResponse",
    "MetadataRequest",
    "MetadataResponse",
    "PendingPrompt",
    "PendingPrompts",
    "PermissionVoteRequest",
    "PromptAccepted",
    "PromptRequest",
    "PromptResult",
    "ReadyResponse",
    "RestoreRequest",
    "RestoreResponse",
    "RpcResultReply",
    "SessionContext",
    "SessionList",
    "SessionResponse",
    "SessionSummary",
    "SetModelRequest",
    "SseEvent",
    "StatusSnapshot",
    "SupportedCommands",
    "ToolToggleRequest",
    "ToolToggleResponse",
    "VoteAccepted",
    "WorkspaceAuthStatus",
]

#: ``approvalMode`` values (mirrors ``serve.sessions.actor.APPROVAL_MODES``; a test pins them).
APPROVAL_MODES = ("plan", "default", "auto-edit", "auto", "yolo")

ApprovalMode = Literal["plan", "default", "auto-edit", "auto", "yolo"]
NonEmpty = Annotated[str, Meta(min_length=1)]
AbsolutePath = Annotated[str, Meta(pattern="^/", description="an absolute path")]


class _Wire(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Base of the API Structs: camelCase, keyword-only, open (unknown fields allowed)."""


# ---- errors ----------------------------------------------------------------------------------


class ErrorEnvelope(_Wire, frozen=True):
    """The daemon-wide error body: ``{error, code?, ...}``.

    ``code`` is a string for daemon errors (``session_not_found``, ``invalid_client_id``,
    ...) and a number for JSON-RPC errors the agent returned. Routes add context fields
    (``sessionId``, ``limit``, ``retryable``, ...); clients switch on ``code``.
    """

    error: str
    code: str | int | UnsetType = UNSET


class FileErrorBody(_Wire, frozen=True):
    """The workspace file routes' error body: ``{errorKind, error, hint?, status}``."""

    error_kind: str
    error: str
    status: int
    hint: str | UnsetType = UNSET


class RpcResultReply(msgspec.Struct, frozen=True):
    """A JSON-RPC success reply: ``{"jsonrpc":"2.0","id","result"}`` (``/acp`` initialize)."""

    jsonrpc: Literal["2.0"]
    id: str | int
    result: Any


# ---- health and capabilities -----------------------------------------------------------------


class HealthResponse(_Wire, frozen=True):
    """``GET /health``: ``{"status":"ok"}``; ``?deep=1`` adds counters (open object)."""

    status: Literal["ok", "degraded"]


class FeatureDetail(_Wire, frozen=True):
    since: str
    modes: list[str] | UnsetType = UNSET


class AgentFork(_Wire, frozen=True):
    """Whether an agent can fork: ``via`` ``session/fork`` (ACP, native), qwen's vendor
    ``qwen/control/session/branch`` (REST only), or null; ``supported`` null: not known yet."""

    supported: bool | None
    via: str | None


class AgentReport(_Wire, frozen=True):
    """An agent as its ``initialize`` answer described it (null before one came up)."""

    agent_info: dict[str, Any] | None
    fork: AgentFork


class WorkspaceAgent(AgentReport, frozen=True):
    """``/capabilities`` ``agents[]``: a workspace's agent (its pool's last started child)."""

    workspace_cwd: str


class CapabilitiesEnvelope(_Wire, frozen=True):
    """``GET /capabilities`` (spec §8.2): the advertised feature tags and limits."""

    v: Literal[1]
    protocol_versions: dict[str, Any]
    mode: str
    features: list[str]
    feature_details: dict[str, FeatureDetail]
    session_live_state_poll_interval_ms: int
    model_services: list[Any]
    workspace_cwd: str
    transports: list[str]
    policy: dict[str, Any]
    limits: dict[str, int | None]
    workspaces: list[dict[str, Any]]
    agents: list[WorkspaceAgent]


class SandboxDenial(_Wire, frozen=True):
    """A workspace whose agent died at start-up because the file sandbox refused it
    ``path``; ``grantFlag``: the ``--agent-allow-write DIR`` that allows it (null: a
    protected place); ``error``: the create's message."""

    workspace_cwd: str
    path: str
    grant_flag: str | None
    error: str


class ReadyResponse(_Wire, frozen=True):
    """``GET /readyz``: ``ready`` (200) or ``not_ready`` with a ``reason`` (503;
    ``agent_sandbox_denied`` when the primary workspace's agent was refused a path by the
    file sandbox; ``auth_tokens_file_unusable`` while the tokens file accepts no token);
    ``agentsFailing``: the workspaces whose agent command keeps failing
    (only the primary's makes the daemon unready); ``sandboxDenied``: those the sandbox
    refused, with the path and the flag that grants it."""

    status: Literal["ready", "not_ready"]
    reason: str | UnsetType = UNSET
    agents_failing: list[str] | UnsetType = UNSET
    sandbox_denied: list[SandboxDenial] | UnsetType = UNSET


# ---- sessions --------------------------------------------------------------------------------


class CreateSessionRequest(_Wire, frozen=True):
    """``POST /session`` body (every field optional)."""

    cwd: AbsolutePath | UnsetType | None = UNSET  # null: the primary workspace
    session_scope: Literal["single", "thread"] | UnsetType = UNSET
    approval_mode: ApprovalMode | UnsetType | None = UNSET  # null: as if absent
    model_service_id: str | UnsetType | None = UNSET


class SessionResponse(_Wire, frozen=True):
    """``POST /session``: the session, and the client id the daemon issued to the caller."""

    session_id: str
    workspace_cwd: str
    attached: bool
    client_id: str
    created_at: str
    has_active_prompt: bool | UnsetType = UNSET
    model_applied: bool | UnsetType = UNSET


class RestoreRequest(_Wire, frozen=True):
    """``POST /session/{id}/load`` and ``/resume`` body."""

    cwd: AbsolutePath | UnsetType | None = UNSET


class RestoreResponse(SessionResponse, frozen=True, kw_only=True):
    """Load/resume: the session plus agent state and the SSE cursor to subscribe from."""

    state: dict[str, Any]
    last_event_id: int
    event_epoch: str


class SessionSummary(_Wire, frozen=True):
    session_id: str
    workspace_cwd: str
    created_at: str
    display_name: str
    client_count: int
    has_active_prompt: bool
    active_work_state: str
    is_waiting_for_permission: bool
    pending_interaction_count: int


class SessionList(_Wire, frozen=True):
    """``GET /workspace/{workspace}/sessions``."""

    sessions: list[SessionSummary]


class ContentBlock(_Wire, frozen=True):
    """An ACP content block (``{"type":"text","text":...}``; other types pass through to the
    agent as they are, so their fields, ``text`` included, are the agent's to check)."""

    type: str
    text: Annotated[Any, Meta(description="a string on a `text` block (else 400)")] | UnsetType = (
        UNSET
    )


class PromptRequest(_Wire, frozen=True):
    """``POST /session/{id}/prompt``; fields not listed are forwarded to ACP ``session/prompt``."""

    prompt: Annotated[list[ContentBlock], Meta(min_length=1)]
    prompt_id: NonEmpty | UnsetType | None = UNSET  # null: the daemon assigns one
    meta: dict[str, Any] | UnsetType | None = msgspec.field(default=UNSET, name="_meta")
    #: Steer the running turn instead of queueing (docs/reference/steering.md).
    steer: bool | UnsetType | None = UNSET  # null: false


class SteerInfo(_Wire, frozen=True):
    """Where a steer went: ``native`` (the agent's ``_session/steering`` took it into the
    running turn, whose ``promptId`` this is), ``cancel`` (the running turn, ``cancelledPromptId``,
    was cancelled and the steer runs next), ``prompt`` (no turn took it; it runs next)."""

    via: Literal["native", "cancel", "prompt"]
    outcome: str | UnsetType = UNSET
    reason: str | UnsetType = UNSET
    cancelled_prompt_id: str | UnsetType = UNSET


class PromptAccepted(_Wire, frozen=True):
    """``202`` (with ``Prefer: respond-async``): admitted; output arrives on the SSE stream."""

    prompt_id: str
    last_event_id: int
    event_epoch: str
    steer: SteerInfo | UnsetType = UNSET


class PromptResult(_Wire, frozen=True):
    """``200`` (blocking prompt): the turn's stop reason."""

    stop_reason: str
    prompt_id: str
    branch_point: dict[str, Any] | UnsetType = UNSET
    steer: SteerInfo | UnsetType = UNSET


class PendingPrompt(_Wire, frozen=True):
    prompt_id: str
    text: str
    queued_at: str
    state: Literal["running", "queued"]
    originator_client_id: str | UnsetType = UNSET


class PendingPromptEdit(_Wire, frozen=True, forbid_unknown_fields=True):
    """``PUT /session/{id}/pending-prompts/{promptId}``: the queued prompt's new content."""

    prompt: Annotated[list[ContentBlock], Meta(min_length=1)]
    meta: dict[str, Any] | UnsetType | None = msgspec.field(default=UNSET, name="_meta")


class PendingPromptUpdated(_Wire, frozen=True):
    session_id: str
    prompt_id: str
    text: str
    queued_at: str
    state: Literal["queued"]


class PendingPrompts(_Wire, frozen=True):
    """``GET /session/{id}/pending-prompts``: the running prompt, then the queue in order."""

    session_id: str
    pending: list[PendingPrompt]


class MetadataRequest(_Wire, frozen=True):
    display_name: Annotated[str, Meta(min_length=1, max_length=256)]


class MetadataResponse(_Wire, frozen=True):
    session_id: str
    display_name: str


class HeartbeatResponse(_Wire, frozen=True):
    session_id: str
    last_seen_at: int
    client_id: str | UnsetType = UNSET


class SetModelRequest(_Wire, frozen=True):
    model_id: NonEmpty


#: An approval mode: one of the agent's advertised mode ids, or a qwen name mapped onto one.
AgentModeId = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=128,
        description="one of the agent's advertised mode ids (ACP `modes` or a `mode` config "
        "option), or one of plan, default, auto-edit, auto, yolo when the agent has a clear "
        "equivalent (else 400 `invalid_approval_mode` with `allowed`)",
    ),
]


class ApprovalModeRequest(_Wire, frozen=True):
    mode: AgentModeId
    persist: bool | UnsetType = UNSET


class ApprovalModeResponse(_Wire, frozen=True):
    session_id: str
    mode: str  # the mode the agent reports
    previous: str | None
    persisted: bool
    requested: str | UnsetType = UNSET  # the name asked for, when it was mapped


class SessionContext(_Wire, frozen=True):
    """``GET /session/{id}/context``."""

    v: Literal[1]
    session_id: str
    workspace_cwd: str
    state: dict[str, Any]
    agent: AgentReport


class SupportedCommands(_Wire, frozen=True):
    """``GET /session/{id}/supported-commands``."""

    v: Literal[1]
    session_id: str
    available_commands: list[Any]
    available_skills: list[str]


# ---- permission votes ------------------------------------------------------------------------


class PermissionVoteRequest(_Wire, frozen=True):
    """A vote: ``{"outcome": {"outcome":"selected","optionId":...} | {"outcome":"cancelled"}}``."""

    outcome: Outcome
    meta: dict[str, Any] | UnsetType | None = msgspec.field(default=UNSET, name="_meta")


class VoteAccepted(_Wire, frozen=True):
    """``200 {}``: the vote resolved the request or was recorded."""


class ElicitationAnswer(_Wire, frozen=True):
    """ACP's ``CreateElicitationResponse``: ``{"action": "accept", "content"?: {...}}``,
    ``{"action": "decline"}`` or ``{"action": "cancel"}`` (``content`` only for a form's
    accept, checked against its ``requestedSchema``)."""

    action: Literal["accept", "decline", "cancel"]
    content: dict[str, Any] | UnsetType | None = UNSET
    meta: dict[str, Any] | UnsetType | None = msgspec.field(default=UNSET, name="_meta")


# ---- events ----------------------------------------------------------------------------------


class DaemonEvent(_Wire, frozen=True):
    """One SSE event envelope (spec §5.1): the JSON in each frame's ``data:`` line.

    Frames: ``id: N`` (absent on synthetic frames), ``event: <type>``, ``data: <envelope>``;
    the stream opens with ``retry: 3000`` and sends ``: heartbeat`` comments every 15 s.
    """

    v: Literal[1]
    type: str
    data: Any
    id: Annotated[int, Meta(ge=1)] | UnsetType = UNSET
    prompt_id: str | UnsetType = UNSET
    originator_client_id: str | UnsetType = UNSET
    meta: dict[str, Any] | UnsetType = msgspec.field(default=UNSET, name="_meta")


class AgentReleasedEvent(_Wire, frozen=True):
    """``agent_released`` data: the idle session let its agent child go (or its slot on a
    shared child). The session stays listed, streams stay open; the next prompt, model or
    mode change binds a child again (``agent_rebound``). Reasons: ``idle``
    (``--agent-idle-release-ms``), ``memory_budget`` (``--agent-memory-budget-mb``)."""

    session_id: str
    reason: Literal["idle", "memory_budget"]
    idle_ms: Annotated[int, Meta(ge=0)]


class AgentReboundEvent(_Wire, frozen=True):
    """``agent_rebound`` data: a released session has an agent again, restored with
    ``session/resume`` (or ``session/load``, its replay dropped: the log already holds it);
    event ids continue. ``trigger``: what needed the agent (``extension``: a vendor
    extension route)."""

    session_id: str
    via: Literal["resume", "load"]
    trigger: Literal["prompt", "model", "mode", "extension"]


class AgentOomEvent(_Wire, frozen=True):
    """``agent_oom`` data: the session's agent child was killed for memory (``serve/isolation``,
    ``--agent-memory-max-mb``). Every session on that child gets it; the running prompt ends
    with ``turn_error {code: "agent_oom"}`` and the session is restored in place like after
    any crash (``session_restarted {reason: "agent_oom"}``), or, past the restart intensity,
    ends with ``session_died {reason: "agent_oom"}``. ``scope``: ``agent`` (its own cap),
    ``ceiling`` (all agents together reached the agents' ceiling), ``system`` (a kernel OOM
    outside both). ``backend``: ``cgroup-v2``, ``cgroup-v1`` or ``watchdog``. ``peakBytes``:
    the kernel's recorded peak (cgroups) or the last measured tree RSS (the watchdog)."""

    session_id: str
    backend: Literal["cgroup-v2", "cgroup-v1", "watchdog"]
    scope: Literal["agent", "ceiling", "system"]
    limit_bytes: int | None
    limit_mb: int | None
    peak_bytes: int | None


class PromptSteeredEvent(_Wire, frozen=True):
    """``prompt_steered`` data: where a steer (``POST /session/{id}/prompt {steer: true}``,
    ``_session/steering`` at ``/acp``) went; ``promptId`` is the turn it went into."""

    session_id: str
    prompt_id: str
    via: Literal["native", "cancel", "prompt"]
    text: str
    outcome: str | UnsetType = UNSET
    reason: str | UnsetType = UNSET
    cancelled_prompt_id: str | UnsetType = UNSET


class PendingPromptUpdatedEvent(_Wire, frozen=True):
    """``pending_prompt_updated`` data: a queued prompt got new content (``PUT``)."""

    session_id: str
    prompt_id: str
    text: str
    queued_at: str


class SseEvent(msgspec.Struct, frozen=True, omit_defaults=True):
    """One Server-Sent Event as a reader parses it (the per-event schema of a
    ``text/event-stream`` reply): ``data`` (one JSON document), ``event`` (its type;
    ``message`` when the frame names none), ``id`` (a decimal event id), ``retry`` (ms)."""

    data: Annotated[str, Meta(extra_json_schema={"contentMediaType": "application/json"})]
    event: str | UnsetType = UNSET
    id: Annotated[str, Meta(pattern="^[0-9]+$")] | UnsetType = UNSET
    retry: int | UnsetType = UNSET


# ---- workspace -------------------------------------------------------------------------------


class StatusSnapshot(_Wire, frozen=True):
    """The workspace status envelope (``/workspace/env``, ``/preflight``, ``/skills``,
    ``/providers``, ``/mcp``): ``{v, workspaceCwd, initialized, ...}`` plus route fields."""

    v: Literal[1]
    workspace_cwd: str
    initialized: bool


class InitRequest(_Wire, frozen=True):
    force: bool | UnsetType | None = UNSET  # null: false


class InitResponse(_Wire, frozen=True):
    path: str
    action: Literal["created", "noop", "overwrote"]


class ToolToggleRequest(_Wire, frozen=True):
    enabled: bool


class ToolToggleResponse(_Wire, frozen=True):
    tool_name: str
    enabled: bool


class McpRestartResponse(_Wire, frozen=True):
    """``POST /workspace/mcp/{server}/restart`` (``entries`` with ``?entryIndex``)."""

    restarted: bool | UnsetType = UNSET
    skipped: bool | UnsetType = UNSET
    reason: str | UnsetType = UNSET
    duration_ms: int | UnsetType = UNSET
    server_name: str | UnsetType = UNSET
    entries: list[dict[str, Any]] | UnsetType = UNSET


class FileWriteRequest(_Wire, frozen=True):
    """``POST /file/write``; ``expectedHash`` is required when ``mode`` is ``replace``."""

    path: NonEmpty
    content: str
    mode: Literal["create", "replace"]
    expected_hash: Annotated[str, Meta(pattern="^sha256:[0-9a-f]{64}$")] | UnsetType | None = UNSET
    encoding: str | UnsetType | None = UNSET  # null: as if absent (so are the next two)
    bom: bool | UnsetType | None = UNSET
    line_ending: Literal["lf", "crlf"] | UnsetType | None = UNSET


class FileEditRequest(_Wire, frozen=True):
    """``POST /file/edit``: replace exactly one occurrence of ``oldText``."""

    path: NonEmpty
    old_text: str
    new_text: str
    expected_hash: Annotated[str, Meta(pattern="^sha256:[0-9a-f]{64}$")]


# ---- device flow -----------------------------------------------------------------------------


class DeviceFlowStartRequest(_Wire, frozen=True):
    provider_id: NonEmpty


class DeviceFlowView(_Wire, frozen=True):
    """A device flow; user code and URIs only for the initiating client."""

    device_flow_id: str
    provider_id: str
    status: str
    user_code: str | UnsetType = UNSET
    verification_uri: str | UnsetType = UNSET
    verification_uri_complete: str | UnsetType = UNSET
    expires_at: int | UnsetType = UNSET
    interval_ms: int | UnsetType = UNSET
    attached: bool | UnsetType = UNSET


class WorkspaceAuthStatus(_Wire, frozen=True):
    v: Literal[1]
    workspace_cwd: str
    providers: list[Any]
    pending_device_flows: list[dict[str, Any]]
    supported_device_flow_providers: list[str]
