"""``session/update``: the update kinds (tagged by ``sessionUpdate``) and their decoding.

What the reader decodes of every update is :class:`SessionUpdateHead` (the routing fields);
:func:`decode_session_update` decodes one update fully, and an unknown or malformed kind comes
back as :class:`UnknownSessionUpdate` with its raw bytes (a newer agent's kinds pass through).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from msgspec import Raw, field

from acp.schema.content import ContentBlock, ToolCallContent, ToolCallLocation
from acp.schema.options import SessionConfigOption
from acp.schema.wire import Wire


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
    raw_input: object = None
    raw_output: object = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class ToolCallUpdate(Wire, frozen=True, tag="tool_call_update", tag_field="sessionUpdate"):
    """Only the fields that changed are present; list fields replace earlier ones."""

    tool_call_id: str
    title: str | None = None
    kind: str | None = None
    status: str | None = None
    content: list[ToolCallContent] | None = None
    locations: list[ToolCallLocation] | None = None
    raw_input: object = None
    raw_output: object = None
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
