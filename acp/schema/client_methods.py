"""Methods the agent calls on the client: permission requests, ``fs/*`` and ``terminal/*``.

Their params are decoded strictly (a malformed request is answered Invalid params); the
results are what we send back.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import field

from acp.schema.content import ToolCallFields
from acp.schema.sessions import EnvVariable
from acp.schema.wire import Wire


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
    args: list[str] = field(default_factory=list)
    env: list[EnvVariable] = field(default_factory=list)
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
