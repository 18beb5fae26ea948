"""Content blocks and tool-call content (ACP schema 1.21).

Tagged by ``type``: the five content blocks of a prompt or a message chunk, the three kinds of
tool-call content, and :class:`ToolCallFields` (a tool call as carried by
``session/request_permission``). ``annotations`` and ``rawInput``/``rawOutput`` are opaque:
we route on them, never look inside or rewrite them.
"""

from __future__ import annotations

from typing import Any, Final

from msgspec import field

from acp.schema.wire import Wire

# --------------------------------------------------------------------------- content blocks


class TextContent(Wire, frozen=True, tag="text", tag_field="type"):
    text: str
    annotations: object = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class ImageContent(Wire, frozen=True, tag="image", tag_field="type"):
    data: str
    mime_type: str
    uri: str | None = None
    annotations: object = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class AudioContent(Wire, frozen=True, tag="audio", tag_field="type"):
    data: str
    mime_type: str
    annotations: object = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class ResourceLink(Wire, frozen=True, tag="resource_link", tag_field="type"):
    uri: str
    name: str
    mime_type: str | None = None
    title: str | None = None
    description: str | None = None
    size: int | None = None
    annotations: object = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")


class EmbeddedResource(Wire, frozen=True, tag="resource", tag_field="type"):
    """``resource`` is ``{uri, text, mimeType?}`` or ``{uri, blob, mimeType?}`` (kept as a dict)."""

    resource: dict[str, Any]
    annotations: object = None
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
    content: list[object] | None = None
    locations: list[object] | None = None
    raw_input: object = None
    raw_output: object = None
    meta: dict[str, Any] | None = field(default=None, name="_meta")
