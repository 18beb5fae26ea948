"""Wire types of the client: frozen msgspec Structs decoded straight from response bodies.

Every Struct is ``rename="camel"`` (``session_id`` is ``sessionId`` on the wire) and
tolerates unknown fields, so a newer daemon that adds fields does not break an older
client (the protocol evolves additively, spec §8.1). Fields the daemon may omit have
defaults. Open-ended sub-objects (a tool call, a plan update, daemon limits) stay
``dict[str, Any]``: the client does not pretend to know more than the protocol fixes.

Events
------
:class:`Event` is the SSE envelope ``{id?, v, type, data, promptId?, originatorClientId?,
_meta}`` (spec §5.1). ``event.data`` is the raw payload object; ``event.payload`` decodes
it into the typed Struct of :data:`PAYLOAD_TYPES` for the types a client acts on
(``session_update``, ``permission_request``, ``turn_complete``, ``state_resync_required``
...) and returns the dict unchanged for the others.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from serve.client.errors import MissingCapabilityError, ProtocolError

__all__ = [
    "PAYLOAD_TYPES",
    "SYNTHETIC_EVENT_TYPES",
    "TERMINAL_EVENT_TYPES",
    "ApprovalModeResult",
    "Capabilities",
    "ClientEvicted",
    "DaemonStatus",
    "DirEntry",
    "DirListing",
    "Event",
    "FeatureDetail",
    "FileContent",
    "FileEditResult",
    "FileStat",
    "FileWriteResult",
    "GlobResult",
    "Health",
    "HeartbeatResult",
    "ModelResult",
    "PermissionOption",
    "PermissionRequest",
    "PermissionResolved",
    "PromptAccepted",
    "PromptCancelled",
    "PromptResult",
    "ReplayComplete",
    "RestoredSession",
    "Session",
    "SessionClosed",
    "SessionDied",
    "SessionList",
    "SessionSummary",
    "SessionUpdate",
    "SlowClientWarning",
    "StateResyncRequired",
    "StatusIssue",
    "StreamError",
    "TurnComplete",
    "TurnError",
    "WorkspaceInfo",
]


class _Wire(msgspec.Struct, frozen=True, rename="camel"):
    """Base: frozen, camelCase on the wire, unknown fields ignored."""


# ---- health, capabilities, status ---------------------------------------------------------


class Health(_Wire, frozen=True):
    """``GET /health`` (the counters only with ``deep``)."""

    status: str
    workspace_count: int | None = None
    sessions: int | None = None
    pending_permissions: int | None = None
    active_prompts: int | None = None
    connected_clients: int | None = None


class FeatureDetail(_Wire, frozen=True):
    since: str = "v1"
    modes: tuple[str, ...] | None = None


class WorkspaceInfo(_Wire, frozen=True):
    id: str
    cwd: str
    primary: bool = False
    trusted: bool = True
    display_name: str | None = None


class Capabilities(_Wire, frozen=True):
    """``GET /capabilities`` (spec §8.2), with feature-detection helpers.

    Pre-flight tags instead of probing routes: ``caps.supports("session_load")``, or
    ``caps.require("non_blocking_prompt", "session_permission_vote")`` which raises
    :class:`~serve.client.errors.MissingCapabilityError` naming every missing tag.
    """

    v: int
    features: tuple[str, ...]
    protocol_versions: dict[str, Any] = msgspec.field(default_factory=dict)
    mode: str = "http-bridge"
    feature_details: dict[str, FeatureDetail] = msgspec.field(default_factory=dict)
    workspace_cwd: str = ""
    transports: tuple[str, ...] = ()
    policy: dict[str, Any] = msgspec.field(default_factory=dict)
    limits: dict[str, Any] = msgspec.field(default_factory=dict)
    workspaces: tuple[WorkspaceInfo, ...] = ()

    def supports(self, *tags: str) -> bool:
        """True when every one of ``tags`` is advertised."""
        return all(tag in self.features for tag in tags)

    def missing(self, *tags: str) -> tuple[str, ...]:
        return tuple(tag for tag in tags if tag not in self.features)

    def require(self, *tags: str) -> None:
        """Raise :class:`MissingCapabilityError` unless every tag is advertised."""
        missing = self.missing(*tags)
        if missing:
            raise MissingCapabilityError(missing)

    def modes(self, tag: str) -> tuple[str, ...]:
        """The advertised modes of ``tag`` (``()`` when it has none or is absent)."""
        detail = self.feature_details.get(tag)
        return detail.modes or () if detail is not None else ()

    @property
    def permission_policy(self) -> str | None:
        policy = self.policy.get("permission")
        return policy if isinstance(policy, str) else None

    @property
    def protocol_version(self) -> str | None:
        current = self.protocol_versions.get("current")
        return current if isinstance(current, str) else None


class StatusIssue(_Wire, frozen=True):
    code: str
    severity: str
    message: str = ""
    section: str | None = None


class DaemonStatus(_Wire, frozen=True):
    """``GET /daemon/status`` (spec §8.4); sections stay open dicts."""

    v: int
    status: str
    detail: str = "summary"
    generated_at: str = ""
    issues: tuple[StatusIssue, ...] = ()
    daemon: dict[str, Any] = msgspec.field(default_factory=dict)
    security: dict[str, Any] = msgspec.field(default_factory=dict)
    limits: dict[str, Any] = msgspec.field(default_factory=dict)
    runtime: dict[str, Any] = msgspec.field(default_factory=dict)
    capabilities: dict[str, Any] = msgspec.field(default_factory=dict)
    supervisor: dict[str, Any] = msgspec.field(default_factory=dict)


# ---- sessions -------------------------------------------------------------------------------


class Session(_Wire, frozen=True):
    """``POST /session`` (create or attach)."""

    session_id: str
    workspace_cwd: str
    attached: bool
    client_id: str
    created_at: str = ""
    has_active_prompt: bool | None = None
    model_applied: bool | None = None


class RestoredSession(Session, frozen=True):
    """``POST /session/:id/load`` and ``/resume``; ``last_event_id``/``event_epoch`` are the
    SSE cursor to subscribe from without losing anything."""

    state: dict[str, Any] = msgspec.field(default_factory=dict)
    last_event_id: int | None = None
    event_epoch: str | None = None


class SessionSummary(_Wire, frozen=True):
    """One entry of ``GET /workspace/:id/sessions``."""

    session_id: str
    workspace_cwd: str = ""
    created_at: str = ""
    display_name: str = ""
    client_count: int = 0
    has_active_prompt: bool = False
    active_work_state: str = "idle"
    is_waiting_for_permission: bool = False
    pending_interaction_count: int = 0
    pending_prompt_count: int = 0
    has_turn_error: bool = False


class SessionList(_Wire, frozen=True):
    sessions: tuple[SessionSummary, ...]
    next_cursor: str | None = None


class PromptResult(_Wire, frozen=True):
    """A blocking ``POST /session/:id/prompt`` that ended (``stop_reason`` as ACP says)."""

    stop_reason: str
    prompt_id: str | None = None


class PromptAccepted(_Wire, frozen=True):
    """``202`` of a non-blocking prompt: subscribe from ``last_event_id`` to see the turn."""

    prompt_id: str
    last_event_id: int
    event_epoch: str


class HeartbeatResult(_Wire, frozen=True):
    session_id: str
    last_seen_at: int
    client_id: str | None = None


class ModelResult(_Wire, frozen=True):
    model_id: str | None = None


class ApprovalModeResult(_Wire, frozen=True):
    session_id: str
    mode: str
    previous: str | None = None
    persisted: bool = False


# ---- files ----------------------------------------------------------------------------------


class FileContent(_Wire, frozen=True):
    """``GET /file``: text content and the ``sha256:<hex>`` hash of the whole file."""

    path: str
    content: str
    hash: str
    size_bytes: int
    returned_bytes: int = 0
    truncated: bool = False
    encoding: str = "utf-8"
    bom: bool = False
    line_ending: str = "lf"
    matched_ignore: str | None = None
    original_line_count: int | None = None
    has_more: bool = False


class FileWriteResult(_Wire, frozen=True):
    """``POST /file/write``; ``hash`` is what to pass as the next ``expected_hash``."""

    path: str
    mode: str
    created: bool
    size_bytes: int
    hash: str
    encoding: str = "utf-8"
    bom: bool = False
    line_ending: str = "lf"
    matched_ignore: str | None = None


class FileEditResult(_Wire, frozen=True):
    """``POST /file/edit``."""

    path: str
    replacements: int
    size_bytes: int
    hash: str
    encoding: str = "utf-8"
    bom: bool = False
    line_ending: str = "lf"
    matched_ignore: str | None = None


class FileStat(_Wire, frozen=True):
    path: str
    type: str
    size_bytes: int
    modified_ms: int


class DirEntry(_Wire, frozen=True):
    name: str
    kind: str
    ignored: bool = False


class DirListing(_Wire, frozen=True):
    path: str
    entries: tuple[DirEntry, ...]
    truncated: bool = False


class GlobResult(_Wire, frozen=True):
    pattern: str
    cwd: str
    matches: tuple[str, ...]
    count: int
    truncated: bool = False


# ---- events ---------------------------------------------------------------------------------

#: A stream ends after one of these (the session's log is closed).
TERMINAL_EVENT_TYPES: Final = frozenset({"session_closed", "session_died"})
#: Stream lifecycle frames; they carry no id.
SYNTHETIC_EVENT_TYPES: Final = frozenset(
    {
        "replay_complete",
        "state_resync_required",
        "slow_client_warning",
        "client_evicted",
        "stream_error",
        "session_snapshot",
    }
)


class SessionUpdate(_Wire, frozen=True):
    """``session_update``: the agent's raw ACP ``session/update`` params."""

    session_id: str
    update: dict[str, Any]

    @property
    def kind(self) -> str:
        """``agent_message_chunk``, ``agent_thought_chunk``, ``tool_call``, ``plan`` ..."""
        kind = self.update.get("sessionUpdate")
        return kind if isinstance(kind, str) else ""

    @property
    def text(self) -> str | None:
        """The text of a message/thought chunk with text content, else None."""
        content = self.update.get("content")
        if isinstance(content, dict) and content.get("type") == "text":
            text = content.get("text")
            return text if isinstance(text, str) else None
        return None


class PermissionOption(_Wire, frozen=True):
    option_id: str
    name: str | None = None
    kind: str | None = None


class PermissionRequest(_Wire, frozen=True):
    """``permission_request``: answer with ``vote(session_id, request_id, option_id)``."""

    request_id: str
    session_id: str
    options: tuple[PermissionOption, ...]
    tool_call: dict[str, Any] = msgspec.field(default_factory=dict)


class PermissionResolved(_Wire, frozen=True):
    request_id: str
    outcome: dict[str, Any]
    voter_client_id: str | None = None

    @property
    def option_id(self) -> str | None:
        """The selected option, or None when the request was cancelled."""
        if self.outcome.get("outcome") == "selected":
            option = self.outcome.get("optionId")
            return option if isinstance(option, str) else None
        return None


class TurnComplete(_Wire, frozen=True):
    session_id: str
    stop_reason: str
    prompt_id: str | None = None


class TurnError(_Wire, frozen=True):
    session_id: str
    message: str
    code: str | int | None = None
    error_kind: str | None = None
    prompt_id: str | None = None


class PromptCancelled(_Wire, frozen=True):
    session_id: str
    reason: str | None = None


class StateResyncRequired(_Wire, frozen=True):
    """The client missed events (``ring_evicted``, ``epoch_reset`` ...): reload state."""

    reason: str
    last_delivered_id: int | None = None
    earliest_available_id: int | None = None
    detail: str | None = None


class ReplayComplete(_Wire, frozen=True):
    replayed_count: int = 0
    last_replayed_event_id: int | None = None


class SlowClientWarning(_Wire, frozen=True):
    queue_size: int
    max_queued: int
    last_event_id: int | None = None
    threshold: str | None = None


class ClientEvicted(_Wire, frozen=True):
    reason: str
    dropped_after: int | None = None
    queue_size: int | None = None
    max_queued: int | None = None


class SessionClosed(_Wire, frozen=True):
    session_id: str
    reason: str
    closed_by: str | None = None


class SessionDied(_Wire, frozen=True):
    session_id: str
    reason: str
    exit_code: int | None = None
    signal_code: str | None = None


class StreamError(_Wire, frozen=True):
    error: str
    error_kind: str | None = None


PAYLOAD_TYPES: Final[dict[str, type[msgspec.Struct]]] = {
    "session_update": SessionUpdate,
    "permission_request": PermissionRequest,
    "permission_resolved": PermissionResolved,
    "turn_complete": TurnComplete,
    "turn_error": TurnError,
    "prompt_cancelled": PromptCancelled,
    "state_resync_required": StateResyncRequired,
    "replay_complete": ReplayComplete,
    "slow_client_warning": SlowClientWarning,
    "client_evicted": ClientEvicted,
    "session_closed": SessionClosed,
    "session_died": SessionDied,
    "stream_error": StreamError,
}


class Event(_Wire, frozen=True, kw_only=True, omit_defaults=True):
    """One SSE envelope (spec §5.1). ``id`` is None on synthetic lifecycle frames.

    Encoding an Event with msgspec gives back the wire envelope (absent fields omitted).
    """

    id: int | None = None
    v: int
    type: str
    data: dict[str, Any]
    prompt_id: str | None = None
    originator_client_id: str | None = None
    meta: dict[str, Any] = msgspec.field(default_factory=dict, name="_meta")

    @property
    def is_synthetic(self) -> bool:
        return self.id is None

    @property
    def is_terminal(self) -> bool:
        """``session_closed`` / ``session_died``: nothing follows on this session."""
        return self.type in TERMINAL_EVENT_TYPES

    @property
    def server_timestamp(self) -> int | None:
        ts = self.meta.get("serverTimestamp")
        return ts if isinstance(ts, int) else None

    @property
    def payload(self) -> Any:
        """The typed payload Struct for the types in :data:`PAYLOAD_TYPES`, else ``data``.

        Raises :class:`~serve.client.errors.ProtocolError` when a known type's payload
        does not have its documented shape.
        """
        cls = PAYLOAD_TYPES.get(self.type)
        if cls is None:
            return self.data
        try:
            return msgspec.convert(self.data, cls)
        except msgspec.ValidationError as exc:
            raise ProtocolError(f"malformed {self.type} payload: {exc}") from None
