"""Fork a session: the use case both fronts call (``POST /session/:id/branch`` and ACP
``session/fork`` at ``/acp``).

Theory of operation
-------------------
A fork is a new session of the daemon made from a live parent's context with ACP
``session/fork`` (unstable in the schema; an agent advertises it as
``agentCapabilities.sessionCapabilities.fork``). The registry starts it like any session
(:class:`~serve.sessions.registry.ForkSession`): its own actor, journal, agent binding (a slot
of the workspace's pool, so possibly another process than the parent's: the agent finds the
parent in its own store), client table, prompt queue and budget. Its event log starts with
``session_forked {sessionId, parentSessionId}``.

What it inherits, and how:

* **MCP servers**: the fork is handed the workspace's servers exactly as its parent was (the
  same ``mcp_servers`` step of the agent link), in the ``session/fork`` request itself.
* **model and mode**: agents differ (the scripted agent and opencode carry them over,
  claude-agent-acp 0.23.1 starts a fork in its default mode), so after the fork the daemon
  compares the fork's current model and mode with the parent's (snapshots of both, by
  ``Describe``) and sets what differs (``SetModel``, ``SetApprovalMode``, not persisted), as a
  client would. A fork that cannot take them is closed again and the call fails
  (:class:`AgentRefusedError` ``fork_inheritance_failed``, 400): a fork in another mode
  than its parent (say, out of ``plan``) is not what was asked for.

An agent that does not advertise ``fork`` is refused at once (:class:`NotSupportedByAgent`,
``not_supported_by_agent``; REST 501, ``/acp`` -32601 with ``data.httpStatus`` 501), without
starting anything. While the parent has no agent bound (released while idle), the check is
made on the fork's own agent at its handshake, with the same error.

:func:`fork_path` is the pure decision the fronts and the read models share: which call forks a
session of a given agent (``session/fork``, the qwen vendor method, or none).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec
import trio

from serve.sessions.errors import (
    AgentRefusedError,
    NotSupportedByAgent,
    SessionError,
    SessionRequestError,
)
from serve.sessions.messages import (
    CloseSession,
    Describe,
    SessionGone,
    SessionView,
    SetApprovalMode,
    SetModel,
)
from serve.sessions.registry import OWNER, ForkSession, Ticket

if TYPE_CHECKING:
    from serve.sessions.actor import SessionActor

__all__ = [
    "NATIVE",
    "Forked",
    "current_state",
    "fork_path",
    "fork_session",
]

log = logging.getLogger(__name__)

#: The ACP method of a native fork.
NATIVE: Final = "session/fork"
#: Bound of each exchange with the registry or a session (seconds).
ASK_TIMEOUT_S: Final = 30.0
#: Bound of one inherited switch (the agent answers it; seconds).
SWITCH_TIMEOUT_S: Final = 60.0
#: Bound of closing a fork that failed to inherit (seconds).
CLOSE_TIMEOUT_S: Final = 10.0


class Forked(msgspec.Struct, frozen=True):
    """A fork made: its session, its parent's id, and what it was given to match."""

    session: SessionActor
    parent_id: str
    #: ``{"model": id, "mode": id}`` of the parent, where it had one (what the fork now has).
    inherited: dict[str, str]
    #: The settings the daemon had to set on the fork (the agent did not carry them over).
    applied: tuple[str, ...]


def fork_path(supports_fork: bool | None, vendor_branch: bool | None) -> str | None:
    """How a session of this agent forks: ``session/fork`` when it advertises it (unless it
    is known to answer qwen's vendor branch method, which keeps its own path), the vendor
    method's name ``"vendor"`` when only that is known, else None (it cannot, or nothing is
    known yet: ``supports_fork`` None)."""
    if vendor_branch is True:
        return "vendor"
    if supports_fork:
        return NATIVE
    return None


def current_state(state: dict[str, Any], view: SessionView) -> dict[str, Any]:
    """The agent's set-up ``state`` (``modes``, ``models``, ``configOptions``) with the
    session's current model and mode in it: a fork's set-up result names the agent's
    defaults, which :func:`fork_session` may have switched since."""
    out = dict(state)
    current = {"model": view.current_model, "mode": view.current_mode}
    for key, field, value in (
        ("models", "currentModelId", view.current_model),
        ("modes", "currentModeId", view.current_mode),
    ):
        if isinstance(out.get(key), dict) and value is not None:
            out[key] = {**out[key], field: value}
    options = out.get("configOptions")
    if isinstance(options, list):
        out["configOptions"] = [_with_current(o, current) for o in options]
    return out


def _with_current(option: object, current: dict[str, str | None]) -> object:
    if not isinstance(option, dict):
        return option
    category = option.get("category")
    value = current.get(category) if isinstance(category, str) else None
    return option if value is None else {**option, "currentValue": value}


class Registries(Protocol):
    """What a fork needs of the session registries (``WorkspaceRuntimes`` is one): the
    parent's workspace registry makes the fork."""

    async def ask(self, msg: ForkSession, *, timeout_s: float = 30.0) -> Ticket: ...


async def fork_session(
    runtimes: Registries, parent: SessionActor, owner: str = OWNER, quota: int = 0
) -> Forked:
    """Fork ``parent`` (see the module docstring); raises the domain errors of the registry
    (limits, draining), :class:`NotSupportedByAgent`, :class:`AgentRefusedError`
    (``fork_inheritance_failed``) and :class:`SessionRequestError`
    (``fork_across_principals``: ``owner`` is not the parent's owner)."""
    view: SessionView = await parent.call(Describe(), timeout_s=ASK_TIMEOUT_S)
    if parent.access.owner != owner:
        # A fork runs in its owner's agent (their HOME and store: serve/isolation/tenants.py),
        # which never holds another principal's conversation to fork from.
        raise SessionRequestError(
            f"Session {view.session_id} belongs to another principal: a fork runs in its "
            "owner's agent, whose store does not hold this session (fork your own sessions)",
            "fork_across_principals",
            sessionId=view.session_id,
        )
    if view.forks is False:
        raise NotSupportedByAgent(
            f"The agent of session {view.session_id} does not support session/fork "
            "(it does not advertise sessionCapabilities.fork)",
            "not_supported_by_agent",
            sessionId=view.session_id,
            method=NATIVE,
        )
    ticket = await runtimes.ask(
        ForkSession(view.session_id, view.workspace, owner, quota), timeout_s=ASK_TIMEOUT_S
    )
    fork: SessionActor = await ticket.pending.wait()
    try:
        inherited, applied = await _inherit(fork, view)
    except BaseException:
        await _close_quietly(fork)
        raise
    log.info(
        "session %s forked from %s: %s%s",
        fork.session_id,
        view.session_id,
        ", ".join(f"{k} {v}" for k, v in inherited.items()) or "no model or mode",
        f" (set by the daemon: {', '.join(applied)})" if applied else "",
    )
    return Forked(fork, view.session_id, inherited, applied)


async def _inherit(
    fork: SessionActor, parent: SessionView
) -> tuple[dict[str, str], tuple[str, ...]]:
    mine: SessionView = await fork.call(Describe(), timeout_s=ASK_TIMEOUT_S)
    inherited: dict[str, str] = {}
    applied: list[str] = []
    if parent.current_model:
        inherited["model"] = parent.current_model
        if mine.current_model != parent.current_model:
            await _switch(fork, "model", parent.current_model, SetModel(parent.current_model, None))
            applied.append("model")
    if parent.current_mode:
        inherited["mode"] = parent.current_mode
        if mine.current_mode != parent.current_mode:
            await _switch(
                fork,
                "mode",
                parent.current_mode,
                SetApprovalMode(parent.current_mode, False, None),
            )
            applied.append("mode")
    return inherited, tuple(applied)


async def _switch(
    fork: SessionActor, what: str, value: str, msg: SetModel | SetApprovalMode
) -> None:
    try:
        await fork.call(msg, timeout_s=SWITCH_TIMEOUT_S)
    except SessionError as exc:
        raise AgentRefusedError(
            f"The fork could not take its parent's {what} {value!r}: {exc}",
            "fork_inheritance_failed",
            setting=what,
            value=value,
        ) from None


async def _close_quietly(fork: SessionActor) -> None:
    """Close a fork that is not handed out (also while the caller is being cancelled)."""
    with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT_S):
        try:
            await fork.call(CloseSession(reason="fork_failed"), timeout_s=CLOSE_TIMEOUT_S)
        except (SessionGone, Exception):  # gone already, or closing failed: nothing to undo
            pass
