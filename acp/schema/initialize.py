"""``initialize`` and ``authenticate``: both sides' capabilities and the handshake result.

:func:`decode_initialize_result` reads an agent's answer leniently: malformed capabilities
become the defaults, malformed auth methods are skipped, only ``protocolVersion`` is strict.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Raw, field

from acp.schema.wire import EMPTY_RAW, Wire, lenient, lenient_list


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
    auth_methods: list[AuthMethod] = field(default_factory=list)
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
