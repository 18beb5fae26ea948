"""Approval modes: the agent's own mode ids, and qwen's five names mapped onto them.

Theory of operation
-------------------
An ACP agent advertises its modes in one of two ways: the ``modes`` field of
``session/new|load|resume`` (``{currentModeId, availableModes: [{id, name}]}``, switched
with ``session/set_mode``), or a session config option of ``category: "mode"`` (a
``select``, switched with ``session/set_config_option``; codex-acp, opencode). When an
agent offers both, the config option wins (ACP: config options supersede ``modes``).
:func:`advertised_modes` reads either into one :class:`AgentModes`.

``POST /session/:id/approval-mode {mode}`` accepts, in this order (:func:`resolve_mode`):

1. one of the agent's own advertised ids, as is (claude ``acceptEdits``, opencode
   ``build``, ...);
2. one of qwen serve's five names (``plan``, ``default``, ``auto-edit``, ``auto``,
   ``yolo``) when :data:`QWEN_EQUIVALENTS` lists a clear equivalent the agent advertises
   (the first listed id the agent has wins);
3. otherwise nothing: the route answers ``400 invalid_approval_mode`` with ``allowed``
   (the agent's ids, then the qwen names that map onto them). A qwen name the agent does
   not have is never forwarded.

An agent that advertises no modes at all gets qwen's five names forwarded with
``session/set_mode`` (it may still know them); anything else is refused with ``allowed``
listing the five names.

The table (what each qwen name becomes for the published agents we run; "-" = no clear
equivalent, 400):

=========  ======  ==========  ===========  ===========  ========
qwen name  qwen    claude      gemini       codex        opencode
=========  ======  ==========  ===========  ===========  ========
plan       plan    plan        plan         \\-           plan
default    default default     default      read-only    build
auto-edit  auto-   acceptEdits autoEdit     auto         \\-
           edit
auto       auto    \\-          \\-           auto         \\-
yolo       yolo    bypass-     yolo         full-access  \\-
                   Permissions
=========  ======  ==========  ===========  ===========  ========

Claude's ``dontAsk`` (refuse whatever is not pre-approved) has no qwen equivalent; it is
reachable by its own id only. The reverse direction (:func:`qwen_equivalent`, used by the
Host's effect gate to pick its approval policy) maps each listed agent id back to its qwen
name; an id with no qwen name counts as ``default``.

``approval_mode_changed`` and the route's answer carry what the agent reports: the
``currentValue`` of the mode option in the ``session/set_config_option`` result, or a
``current_mode_update`` the agent sent while switching, else the id that was set.
Everything here is pure except :func:`apply_mode` (one ACP request).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec

if TYPE_CHECKING:
    from acp.client import AgentConnection
    from acp.schema import SessionConfigOption, SessionSetup

__all__ = [
    "APPROVAL_MODES",
    "MAX_MODE_ID_CHARS",
    "QWEN_EQUIVALENTS",
    "AgentModes",
    "ModeEntry",
    "UnknownApprovalMode",
    "advertised_modes",
    "allowed_modes",
    "apply_mode",
    "mode_option",
    "qwen_equivalent",
    "resolve_mode",
]

#: qwen serve's approval mode names (``DAEMON_APPROVAL_MODES`` of the reference).
APPROVAL_MODES: Final = ("plan", "default", "auto-edit", "auto", "yolo")
#: Longest mode id the route accepts.
MAX_MODE_ID_CHARS: Final = 128

#: qwen name → the agent ids that are a clear equivalent, in order of preference.
QWEN_EQUIVALENTS: Final[dict[str, tuple[str, ...]]] = {
    "plan": ("plan",),
    "default": ("default", "build", "read-only"),
    "auto-edit": ("auto-edit", "autoEdit", "acceptEdits", "auto"),
    "auto": ("auto",),
    "yolo": ("yolo", "bypassPermissions", "full-access"),
}
_REVERSE: Final[dict[str, str]] = {
    "build": "default",
    "read-only": "default",
    "autoEdit": "auto-edit",
    "acceptEdits": "auto-edit",
    "bypassPermissions": "yolo",
    "full-access": "yolo",
}


class ModeEntry(msgspec.Struct, frozen=True, omit_defaults=True):
    id: str
    name: str
    description: str | None = None


class AgentModes(msgspec.Struct, frozen=True):
    """The modes one agent session advertises, and how to switch them."""

    source: Literal["modes", "config", "none"]
    entries: tuple[ModeEntry, ...] = ()
    current: str | None = None
    config_id: str | None = None  # the mode option's id (source "config")

    @property
    def ids(self) -> list[str]:
        return [e.id for e in self.entries]


class UnknownApprovalMode(ValueError):
    """The requested mode is neither the agent's nor a qwen name that maps onto its modes."""

    def __init__(self, requested: str, allowed: Sequence[str]) -> None:
        super().__init__(f"The agent does not offer approval mode {requested!r}")
        self.requested = requested
        self.allowed = list(allowed)


def mode_option(options: Iterable[SessionConfigOption] | None) -> SessionConfigOption | None:
    """The ``select`` config option of category ``mode``, if offered."""
    for option in options or ():
        if option.category == "mode" and option.type == "select":
            return option
    return None


def _option_entries(option: SessionConfigOption) -> tuple[ModeEntry, ...]:
    out: list[ModeEntry] = []
    for opt in option.options or ():
        subs = opt.get("options") if isinstance(opt, dict) and "group" in opt else None
        for choice in subs if isinstance(subs, list) else [opt]:
            if isinstance(choice, dict) and isinstance(choice.get("value"), str):
                name = choice.get("name")
                description = choice.get("description")
                out.append(
                    ModeEntry(
                        choice["value"],
                        name if isinstance(name, str) else choice["value"],
                        description if isinstance(description, str) else None,
                    )
                )
    return tuple(out)


def advertised_modes(
    setup: SessionSetup | None, options: Sequence[SessionConfigOption] | None = None
) -> AgentModes:
    """The session's modes: its ``category: mode`` config option (``options``: the live
    list, else the set-up result's), else the set-up result's ``modes``."""
    if options is None and setup is not None:
        options = setup.config_options
    option = mode_option(options)
    if option is not None:
        current = option.current_value if isinstance(option.current_value, str) else None
        return AgentModes("config", _option_entries(option), current, option.id)
    modes = setup.modes if setup is not None else None
    if modes is not None:
        entries = tuple(ModeEntry(m.id, m.name, m.description) for m in modes.available_modes)
        return AgentModes("modes", entries, modes.current_mode_id)
    return AgentModes("none")


def allowed_modes(modes: AgentModes) -> list[str]:
    """What the route accepts for this agent: its ids, then the qwen names mapping onto them."""
    if modes.source == "none":
        return list(APPROVAL_MODES)
    ids = modes.ids
    aliases = [q for q in APPROVAL_MODES if q not in ids and _equivalent(q, ids) is not None]
    return [*ids, *aliases]


def _equivalent(qwen_name: str, ids: Sequence[str]) -> str | None:
    return next((i for i in QWEN_EQUIVALENTS.get(qwen_name, ()) if i in ids), None)


def resolve_mode(requested: str, modes: AgentModes) -> str:
    """The agent id to set for ``requested`` (see the module docstring); raises
    :class:`UnknownApprovalMode` with the allowed values otherwise."""
    if modes.source == "none":
        if requested in APPROVAL_MODES:
            return requested
        raise UnknownApprovalMode(requested, APPROVAL_MODES)
    ids = modes.ids
    if requested in ids:
        return requested
    mapped = _equivalent(requested, ids) if requested in APPROVAL_MODES else None
    if mapped is None:
        raise UnknownApprovalMode(requested, allowed_modes(modes))
    return mapped


def qwen_equivalent(mode_id: str | None) -> str:
    """The qwen approval mode an agent mode id stands for (``default`` when none)."""
    if mode_id in APPROVAL_MODES:
        return mode_id
    return _REVERSE.get(mode_id or "", "default")


async def apply_mode(
    conn: AgentConnection,
    session_id: str,
    modes: AgentModes,
    mode_id: str,
    *,
    timeout_s: float | None = 60,
) -> str | None:
    """Switch the agent to ``mode_id``; the mode the agent reports, or None when its
    answer carries none (``session/set_mode`` answers ``{}``). Raises the connection's
    errors (:class:`acp.errors.RemoteError`, ``RequestTimeout``, ``ChannelClosed``)."""
    if modes.source == "config" and modes.config_id is not None:
        options = await conn.set_config_option(session_id, modes.config_id, mode_id, timeout_s)
        option = mode_option(options)
        current = option.current_value if option is not None else None
        return current if isinstance(current, str) else None
    await conn.set_mode(session_id, mode_id, timeout_s)
    return None


def context_modes(modes: AgentModes) -> dict[str, Any]:
    """``state.modes`` of ``GET /session/:id/context`` in ACP's ``modes`` shape."""
    if modes.source == "none":
        return {}
    return {
        "currentModeId": modes.current,
        "availableModes": [msgspec.to_builtins(e) for e in modes.entries],
    }
