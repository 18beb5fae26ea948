"""ACP protocol version 1 (schema v1.21) as frozen msgspec Structs.

Theory of operation
-------------------
Two directions, two attitudes (see ``reference/acp-and-stack.md`` §4.2):

* **What we send** (client -> agent params, our answers to agent requests) is built from the
  Structs here and encoded as camelCase JSON with defaults omitted.
* **What the agent sends** is decoded *leniently*. The JSON-RPC envelope keeps ``params`` /
  ``result`` as ``msgspec.Raw``; only the fields the daemon routes on are decoded, and the
  original bytes travel on untouched (unknown fields, unknown ``sessionUpdate`` kinds, ``_meta``).
  Where a result has optional complex parts (``modes``, ``models``, ``configOptions``) each part
  is decoded on its own and a malformed part becomes ``None`` instead of failing the call,
  mirroring the schema's ``x-deserialize-default-on-error`` annotations. Enumerations coming
  from the agent (tool kinds, statuses, stop reasons) are plain ``str`` so a newer agent's
  values pass through.

Every Struct is frozen; ``_meta`` is the field ``meta`` (wire name ``_meta``). Unions are tagged
(``type`` for content blocks, ``sessionUpdate`` for updates, ``outcome`` for permission outcomes).
Nothing here does I/O.
"""

from __future__ import annotations

import logging
from typing import Any, Final, Literal

import msgspec
from msgspec import Raw, field

log = logging.getLogger(__name__)

PROTOCOL_VERSION: Final = 1
EMPTY_RAW: Final = Raw(b"")


class Wire(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True, kw_only=True):
    """Base of every ACP wire type: camelCase keys, defaults omitted, keyword-only."""


# --------------------------------------------------------------------------- content blocks


class TextContent(Wire, frozen=True, tag="text", tag_field="type"):
    text: str
    annotations: Any = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class ImageContent(Wire, frozen=True, tag="image", tag_field="type"):
    data: str
    mime_type: str
    uri: str | None = None
    annotations: Any = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class AudioContent(Wire, frozen=True, tag="audio", tag_field="type"):
    data: str
    mime_type: str
    annotations: Any = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class ResourceLink(Wire, frozen=True, tag="resource_link", tag_field="type"):
    uri: str
    name: str
    mime_type: str | None = None
    title: str | None = None
    description: str | None = None
    size: int | None = None
    annotations: Any = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class EmbeddedResource(Wire, frozen=True, tag="resource", tag_field="type"):
    """``resource`` is ``{uri, text, mimeType?}`` or ``{uri, blob, mimeType?}`` (kept as a dict)."""

    resource: dict[str, Any]
    annotations: Any = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


ContentBlock = TextContent | ImageContent | AudioContent | ResourceLink | EmbeddedResource


def text_block(text: str) -> TextContent:
    return TextContent(text=text)


# --------------------------------------------------------------------------- tool calls


class ToolCallLocation(Wire, frozen=True):
    path: str
    line: int | None = None


class ContentToolCallContent(Wire, frozen=True, tag="content", tag_field="type"):
    content: ContentBlock


class DiffToolCallContent(Wire, frozen=True, tag="diff", tag_field="type"):
    path: str
    new_text: str
    old_text: str | None = None


class TerminalToolCallContent(Wire, frozen=True, tag="terminal", tag_field="type"):
    terminal_id: str


ToolCallContent = ContentToolCallContent | DiffToolCallContent | TerminalToolCallContent

TOOL_KINDS: Final = frozenset(
    {
        "read",
        "edit",
        "delete",
        "move",
        "search",
        "execute",
        "think",
        "fetch",
        "switch_mode",
        "other",
    }
)
TOOL_STATUSES: Final = frozenset({"pending", "in_progress", "completed", "failed"})


class ToolCallFields(Wire, frozen=True):
    """The fields of a tool call as carried by ``session/request_permission`` (all but the id
    optional). Content and locations stay loosely typed: we route on them, never rewrite them."""

    tool_call_id: str
    title: str | None = None
    kind: str | None = None
    status: str | None = None
    content: list[Any] | None = None
    locations: list[Any] | None = None
    raw_input: Any = None
    raw_output: Any = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


# --------------------------------------------------------------------------- session updates


class UserMessageChunk(Wire, frozen=True, tag="user_message_chunk", tag_field="sessionUpdate"):
    content: ContentBlock
    message_id: str | None = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class AgentMessageChunk(Wire, frozen=True, tag="agent_message_chunk", tag_field="sessionUpdate"):
    content: ContentBlock
    message_id: str | None = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class AgentThoughtChunk(Wire, frozen=True, tag="agent_thought_chunk", tag_field="sessionUpdate"):
    content: ContentBlock
    message_id: str | None = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class ToolCall(Wire, frozen=True, tag="tool_call", tag_field="sessionUpdate"):
    tool_call_id: str
    title: str
    kind: str | None = None  # absent means "other"
    status: str | None = None  # absent means "pending"
    content: list[ToolCallContent] | None = None
    locations: list[ToolCallLocation] | None = None
    raw_input: Any = None
    raw_output: Any = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class ToolCallUpdate(Wire, frozen=True, tag="tool_call_update", tag_field="sessionUpdate"):
    """Only the fields that changed are present; list fields replace earlier ones."""

    tool_call_id: str
    title: str | None = None
    kind: str | None = None
    status: str | None = None
    content: list[ToolCallContent] | None = None
    locations: list[ToolCallLocation] | None = None
    raw_input: Any = None
    raw_output: Any = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class PlanEntry(Wire, frozen=True):
    content: str
    priority: str
    status: str
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class Plan(Wire, frozen=True, tag="plan", tag_field="sessionUpdate"):
    entries: list[PlanEntry]
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class AvailableCommandInput(Wire, frozen=True):
    hint: str


class AvailableCommand(Wire, frozen=True):
    name: str
    description: str
    input: AvailableCommandInput | None = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class AvailableCommandsUpdate(
    Wire, frozen=True, tag="available_commands_update", tag_field="sessionUpdate"
):
    available_commands: list[AvailableCommand]
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class CurrentModeUpdate(Wire, frozen=True, tag="current_mode_update", tag_field="sessionUpdate"):
    current_mode_id: str
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class SelectOption(Wire, frozen=True):
    value: str
    name: str
    description: str | None = None


class SessionConfigOption(Wire, frozen=True):
    """One entry of ``configOptions``. ``options`` is a list of ``{value, name}`` or of groups
    ``{group, name, options: [...]}``; :meth:`select_values` flattens both."""

    id: str
    name: str
    type: str
    current_value: Any = None
    category: str | None = None
    description: str | None = None
    options: list[Any] | None = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")

    def select_values(self) -> list[str]:
        values: list[str] = []
        for opt in self.options or ():
            if isinstance(opt, dict):
                if isinstance(opt.get("value"), str):
                    values.append(opt["value"])
                for sub in opt.get("options") or ():
                    if isinstance(sub, dict) and isinstance(sub.get("value"), str):
                        values.append(sub["value"])
            elif isinstance(opt, SelectOption):
                values.append(opt.value)
        return values


class ConfigOptionUpdate(Wire, frozen=True, tag="config_option_update", tag_field="sessionUpdate"):
    config_options: list[SessionConfigOption]
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class SessionInfoUpdate(Wire, frozen=True, tag="session_info_update", tag_field="sessionUpdate"):
    title: str | None = None
    updated_at: str | None = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class UsageUpdate(Wire, frozen=True, tag="usage_update", tag_field="sessionUpdate"):
    used: int
    size: int
    cost: dict[str, Any] | None = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


SessionUpdate = (
    UserMessageChunk
    | AgentMessageChunk
    | AgentThoughtChunk
    | ToolCall
    | ToolCallUpdate
    | Plan
    | AvailableCommandsUpdate
    | CurrentModeUpdate
    | ConfigOptionUpdate
    | SessionInfoUpdate
    | UsageUpdate
)

SESSION_UPDATE_KINDS: Final = frozenset(
    {
        "user_message_chunk",
        "agent_message_chunk",
        "agent_thought_chunk",
        "tool_call",
        "tool_call_update",
        "plan",
        "available_commands_update",
        "current_mode_update",
        "config_option_update",
        "session_info_update",
        "usage_update",
    }
)


class UnknownSessionUpdate(Wire, frozen=True):
    """An update whose kind we do not know (or that does not match its schema); kept raw."""

    kind: str
    raw: Raw


class SessionNotification(Wire, frozen=True):
    """``session/update`` params, as we *send* them (the scripted agent, tests)."""

    session_id: str
    update: SessionUpdate
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class SessionUpdateHead(Wire, frozen=True):
    """What the reader decodes of every ``session/update``: the routing fields only."""

    session_id: str
    update: Raw


class UpdateKind(msgspec.Struct, frozen=True):
    sessionUpdate: str


_session_update_decoder: Final = msgspec.json.Decoder(SessionUpdate)


def decode_session_update(update: Raw | bytes) -> SessionUpdate | UnknownSessionUpdate:
    """Decode one ``update`` object fully; unknown or malformed kinds come back raw."""
    try:
        return _session_update_decoder.decode(update)
    except msgspec.ValidationError:
        try:
            kind = msgspec.json.decode(update, type=UpdateKind).sessionUpdate
        except msgspec.DecodeError:
            kind = ""
        return UnknownSessionUpdate(kind=kind, raw=Raw(bytes(update)))


# --------------------------------------------------------------------------- initialize


class FileSystemCapability(Wire, frozen=True):
    read_text_file: bool = False
    write_text_file: bool = False


class ClientCapabilities(Wire, frozen=True):
    fs: FileSystemCapability = FileSystemCapability()
    terminal: bool = False
    #: ``{configOptions: {boolean: {}}}``: boolean config options are understood (1.21).
    session: dict[str, Any] | None = None
    #: ``{"form": {}, "url": {}}``: the elicitation modes offered (ACP 1.21; None: none).
    elicitation: dict[str, Any] | None = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class Implementation(Wire, frozen=True):
    name: str
    version: str
    title: str | None = None


class InitializeParams(Wire, frozen=True):
    protocol_version: int
    client_capabilities: ClientCapabilities = ClientCapabilities()
    client_info: Implementation | None = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class PromptCapabilities(Wire, frozen=True):
    image: bool = False
    audio: bool = False
    embedded_context: bool = False


class McpCapabilities(Wire, frozen=True):
    http: bool = False
    sse: bool = False


class SessionCapabilities(Wire, frozen=True):
    """Each lifecycle capability is an object when supported, absent/null when not."""

    list_: dict[str, Any] | None = field(default=None, name="list")
    resume: dict[str, Any] | None = None
    close: dict[str, Any] | None = None
    delete: dict[str, Any] | None = None
    fork: dict[str, Any] | None = None
    additional_directories: dict[str, Any] | None = None


class AgentCapabilities(Wire, frozen=True):
    load_session: bool = False
    prompt_capabilities: PromptCapabilities = PromptCapabilities()
    mcp_capabilities: McpCapabilities = McpCapabilities()
    session_capabilities: SessionCapabilities = SessionCapabilities()
    auth: dict[str, Any] | None = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class AuthMethod(Wire, frozen=True):
    """No ``type``: handled through ``authenticate``. ``type: "terminal"``: interactive login."""

    id: str
    name: str
    description: str | None = None
    type: str | None = None


class InitializeResult(Wire, frozen=True):
    protocol_version: int
    agent_capabilities: AgentCapabilities = AgentCapabilities()
    auth_methods: list[AuthMethod] = []
    agent_info: Implementation | None = None
    meta: Raw = field(default=EMPTY_RAW, name="_meta")
    raw: Raw = field(default=EMPTY_RAW, name="acpServeRaw")

    @property
    def load_session(self) -> bool:
        return self.agent_capabilities.load_session

    @property
    def supports_resume(self) -> bool:
        return self.agent_capabilities.session_capabilities.resume is not None

    @property
    def supports_list(self) -> bool:
        return self.agent_capabilities.session_capabilities.list_ is not None

    @property
    def supports_close(self) -> bool:
        return self.agent_capabilities.session_capabilities.close is not None

    @property
    def supports_fork(self) -> bool:
        return self.agent_capabilities.session_capabilities.fork is not None


class AuthenticateParams(Wire, frozen=True):
    method_id: str


# --------------------------------------------------------------------------- sessions


class EnvVariable(Wire, frozen=True):
    name: str
    value: str


class HttpHeader(Wire, frozen=True):
    name: str
    value: str


class McpServerStdio(Wire, frozen=True):
    """The untagged stdio form every agent must accept."""

    name: str
    command: str
    args: list[str]
    env: list[EnvVariable]


class McpServerHttp(Wire, frozen=True, tag="http", tag_field="type"):
    name: str
    url: str
    headers: list[HttpHeader]


class McpServerSse(Wire, frozen=True, tag="sse", tag_field="type"):
    name: str
    url: str
    headers: list[HttpHeader]


class SessionMode(Wire, frozen=True):
    id: str
    name: str
    description: str | None = None


class SessionModeState(Wire, frozen=True):
    current_mode_id: str
    available_modes: list[SessionMode]


class ModelInfo(Wire, frozen=True):
    model_id: str
    name: str
    description: str | None = None


class SessionModelState(Wire, frozen=True):
    """The older (unstable) ``models`` field, still sent by qwen-code and others."""

    current_model_id: str
    available_models: list[ModelInfo]


class NewSessionParams(Wire, frozen=True):
    cwd: str
    mcp_servers: list[Any]
    additional_directories: list[str] | None = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class LoadSessionParams(Wire, frozen=True):
    session_id: str
    cwd: str
    mcp_servers: list[Any]
    additional_directories: list[str] | None = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


ResumeSessionParams = LoadSessionParams


class SessionSetup(Wire, frozen=True):
    """Result of ``session/new`` (with ``session_id``), ``session/load`` and ``session/resume``.

    ``modes``/``models``/``config_options`` are ``None`` when absent or malformed; ``raw`` is the
    whole result as the agent sent it and ``meta`` its ``_meta``."""

    session_id: str = ""
    modes: SessionModeState | None = None
    models: SessionModelState | None = None
    config_options: list[SessionConfigOption] | None = None
    meta: Raw = field(default=EMPTY_RAW, name="_meta")
    raw: Raw = field(default=EMPTY_RAW, name="acpServeRaw")

    def model_option(self) -> SessionConfigOption | None:
        return find_model_option(self.config_options)


NewSessionResult = SessionSetup
LoadSessionResult = SessionSetup
ResumeSessionResult = SessionSetup


def find_model_option(options: list[SessionConfigOption] | None) -> SessionConfigOption | None:
    """The select option of category ``model`` (or, failing that, id ``model``), if offered."""
    for opt in options or ():
        if opt.category == "model" and opt.type == "select":
            return opt
    for opt in options or ():
        if opt.id == "model" and opt.type == "select":
            return opt
    return None


class ListSessionsParams(Wire, frozen=True):
    cwd: str | None = None
    cursor: str | None = None


class SessionInfo(Wire, frozen=True):
    session_id: str
    cwd: str = ""
    title: str | None = None
    updated_at: str | None = None
    additional_directories: list[str] | None = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class ListSessionsResult(Wire, frozen=True):
    sessions: list[SessionInfo] = []
    next_cursor: str | None = None
    raw: Raw = field(default=EMPTY_RAW, name="acpServeRaw")


class SessionIdParams(Wire, frozen=True):
    """Params of ``session/close``, ``session/delete`` and ``session/cancel``."""

    session_id: str


CloseSessionParams = SessionIdParams
CancelNotification = SessionIdParams


class CancelRequestParams(Wire, frozen=True):
    """``$/cancel_request``: either side asks the other to abort request ``request_id``."""

    request_id: int | str


class PromptParams(Wire, frozen=True):
    session_id: str
    prompt: Any  # a list of content blocks or the raw bytes of one
    meta: dict[str, Any] | None = field(default=None, name="_meta")


STOP_REASONS: Final = frozenset(
    {"end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"}
)


class PromptResult(Wire, frozen=True):
    stop_reason: str
    meta: Raw = field(default=EMPTY_RAW, name="_meta")
    usage: Raw = EMPTY_RAW
    raw: Raw = field(default=EMPTY_RAW, name="acpServeRaw")


class SetModeParams(Wire, frozen=True):
    session_id: str
    mode_id: str


class SetModelParams(Wire, frozen=True):
    session_id: str
    model_id: str


class SetConfigOptionParams(Wire, frozen=True):
    session_id: str
    config_id: str
    value: str | bool
    type: Literal["boolean"] | None = None


class SetConfigOptionResult(Wire, frozen=True):
    config_options: list[SessionConfigOption] = []


# --------------------------------------------------------------------------- agent -> client


class PermissionOption(Wire, frozen=True):
    option_id: str
    name: str
    kind: str  # allow_once | allow_always | reject_once | reject_always


class RequestPermissionParams(Wire, frozen=True):
    session_id: str
    tool_call: ToolCallFields
    options: list[PermissionOption]
    meta: dict[str, Any] | None = field(default=None, name="_meta")

    def option_of_kind(self, kind: str) -> PermissionOption | None:
        return next((o for o in self.options if o.kind == kind), None)


class SelectedPermissionOutcome(Wire, frozen=True, tag="selected", tag_field="outcome"):
    option_id: str


class CancelledPermissionOutcome(Wire, frozen=True, tag="cancelled", tag_field="outcome"):
    pass


PermissionOutcome = SelectedPermissionOutcome | CancelledPermissionOutcome


class RequestPermissionResult(Wire, frozen=True):
    outcome: PermissionOutcome
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class ReadTextFileParams(Wire, frozen=True):
    session_id: str
    path: str
    line: int | None = None  # 1-based
    limit: int | None = None  # lines
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class ReadTextFileResult(Wire, frozen=True):
    content: str


class WriteTextFileParams(Wire, frozen=True):
    session_id: str
    path: str
    content: str
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class CreateTerminalParams(Wire, frozen=True):
    session_id: str
    command: str
    args: list[str] = []
    env: list[EnvVariable] = []
    cwd: str | None = None
    output_byte_limit: int | None = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class CreateTerminalResult(Wire, frozen=True):
    terminal_id: str


class TerminalIdParams(Wire, frozen=True):
    """Params of ``terminal/output``, ``wait_for_exit``, ``kill`` and ``release``."""

    session_id: str
    terminal_id: str
    meta: dict[str, Any] | None = field(default=None, name="_meta")


TerminalOutputParams = TerminalIdParams
WaitForTerminalExitParams = TerminalIdParams
KillTerminalParams = TerminalIdParams
ReleaseTerminalParams = TerminalIdParams


class TerminalExitStatus(msgspec.Struct, frozen=True, rename="camel", kw_only=True):
    """Both keys are always sent (``null`` when not applicable), as the schema examples do."""

    exit_code: int | None = None
    signal: str | None = None


class TerminalOutputResult(Wire, frozen=True):
    output: str
    truncated: bool
    exit_status: TerminalExitStatus | None = None


class EmptyResult(Wire, frozen=True):
    meta: dict[str, Any] | None = field(default=None, name="_meta")


# --------------------------------------------------------------------------- lenient decoding


def lenient[T](raw: Raw | bytes, typ: type[T], *, what: str = "") -> T | None:
    """Decode ``raw`` as ``typ``; absent/``null``/malformed gives ``None`` (logged at debug)."""
    if not raw or bytes(raw) == b"null":
        return None
    try:
        return msgspec.json.decode(raw, type=typ)
    except msgspec.DecodeError as exc:
        log.debug("ignoring malformed %s from agent: %s", what or typ.__name__, exc)
        return None


def lenient_list[T](raw: Raw | bytes, typ: type[T], *, what: str = "") -> list[T] | None:
    """Decode a JSON array item by item, skipping invalid items; ``None`` if not an array."""
    items = lenient(raw, list[Raw], what=what)
    if items is None:
        return None
    out: list[T] = []
    for item in items:
        value = lenient(item, typ, what=what)
        if value is not None:
            out.append(value)
    return out


class _SetupWire(msgspec.Struct, frozen=True, rename="camel"):
    session_id: str = ""
    modes: Raw = EMPTY_RAW
    models: Raw = EMPTY_RAW
    config_options: Raw = EMPTY_RAW
    meta: Raw = field(default=EMPTY_RAW, name="_meta")


def decode_session_setup(raw: Raw) -> SessionSetup:
    """Decode a ``session/new|load|resume`` result leniently (only ``sessionId`` is strict)."""
    if bytes(raw) == b"null":
        return SessionSetup(raw=raw)
    wire = msgspec.json.decode(raw, type=_SetupWire)
    return SessionSetup(
        session_id=wire.session_id,
        modes=lenient(wire.modes, SessionModeState, what="modes"),
        models=lenient(wire.models, SessionModelState, what="models"),
        config_options=lenient_list(wire.config_options, SessionConfigOption, what="configOption"),
        meta=wire.meta,
        raw=raw,
    )


class _InitWire(msgspec.Struct, frozen=True, rename="camel"):
    protocol_version: int
    agent_capabilities: Raw = EMPTY_RAW
    auth_methods: Raw = EMPTY_RAW
    agent_info: Raw = EMPTY_RAW
    meta: Raw = field(default=EMPTY_RAW, name="_meta")


def decode_initialize_result(raw: Raw) -> InitializeResult:
    wire = msgspec.json.decode(raw, type=_InitWire)
    return InitializeResult(
        protocol_version=wire.protocol_version,
        agent_capabilities=lenient(wire.agent_capabilities, AgentCapabilities, what="caps")
        or AgentCapabilities(),
        auth_methods=lenient_list(wire.auth_methods, AuthMethod, what="authMethod") or [],
        agent_info=lenient(wire.agent_info, Implementation, what="agentInfo"),
        meta=wire.meta,
        raw=raw,
    )


class _PromptWire(msgspec.Struct, frozen=True, rename="camel"):
    stop_reason: str
    meta: Raw = field(default=EMPTY_RAW, name="_meta")
    usage: Raw = EMPTY_RAW


def decode_prompt_result(raw: Raw) -> PromptResult:
    wire = msgspec.json.decode(raw, type=_PromptWire)
    return PromptResult(stop_reason=wire.stop_reason, meta=wire.meta, usage=wire.usage, raw=raw)


class _ListWire(msgspec.Struct, frozen=True, rename="camel"):
    sessions: Raw = EMPTY_RAW
    next_cursor: str | None = None


def decode_list_sessions_result(raw: Raw) -> ListSessionsResult:
    wire = msgspec.json.decode(raw, type=_ListWire)
    return ListSessionsResult(
        sessions=lenient_list(wire.sessions, SessionInfo, what="sessionInfo") or [],
        next_cursor=wire.next_cursor,
        raw=raw,
    )
