"""Session methods the client calls: new/load/resume/fork, list, close, prompt, modes.

Params are built here and encoded; results are decoded leniently (:func:`decode_session_setup`,
:func:`decode_prompt_result`, :func:`decode_list_sessions_result`), keeping the agent's whole
answer as ``raw``.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec
from msgspec import Raw, field

from acp.schema.content import ContentBlock
from acp.schema.options import (
    SessionConfigOption,
    SessionModelState,
    SessionModeState,
    find_model_option,
)
from acp.schema.wire import EMPTY_RAW, Wire, lenient, lenient_list


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


class NewSessionParams(Wire, frozen=True):
    cwd: str
    mcp_servers: list[dict[str, Any]]  # ACP McpServer objects
    additional_directories: list[str] | None = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class LoadSessionParams(Wire, frozen=True):
    session_id: str
    cwd: str
    mcp_servers: list[dict[str, Any]]  # ACP McpServer objects
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
    sessions: list[SessionInfo] = field(default_factory=list)
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
    prompt: list[ContentBlock] | Raw  # content blocks, or the raw bytes of the array
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
    config_options: list[SessionConfigOption] = field(default_factory=list)


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
