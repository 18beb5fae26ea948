"""Which agents can fork, as ``/capabilities`` (per workspace) and ``/session/:id/context``
(per session) report it.

``fork: {supported, via}``: ``via`` is ``"session/fork"`` (ACP, native: ``POST
/session/:id/branch`` and ``session/fork`` at ``/acp``), the qwen vendor method (REST branch
only), or null; ``supported`` is null while nothing is known. The daemon knows an agent's
capabilities from its ``initialize`` answer: a session's own agent for ``/context``, and for
``/capabilities`` the last child its workspace's pool initialized (the warm spare, when
``--warm-agents`` > 0, so it is known before any session exists).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from acp.schema import InitializeResult
from serve.sessions.fork import fork_path
from serve.workspaces.state import agent_ext

if TYPE_CHECKING:
    from serve.host import Host
    from serve.sessions.actor import SessionActor


def _kind(info: InitializeResult) -> str | None:
    implementation = info.agent_info
    if implementation is None or not implementation.name:
        return None
    name, version = implementation.name, implementation.version
    return f"{name}@{version}" if version else name


def fork_report(daemon: Host, info: InitializeResult | None) -> dict[str, Any]:
    """``{supported, via}`` for an agent whose ``initialize`` answer is ``info`` (or None)."""
    if info is None:
        return {"supported": None, "via": None}
    vendor = agent_ext.support_for(daemon).verdict(_kind(info), agent_ext.BRANCH)
    path = fork_path(bool(info.supports_fork), vendor)
    via = agent_ext.BRANCH if path == "vendor" else path
    return {"supported": via is not None, "via": via}


def agent_entry(daemon: Host, info: InitializeResult | None) -> dict[str, Any]:
    """``agentInfo`` (name, version) and ``fork`` of an agent (null/unknown before one ran)."""
    implementation = info.agent_info if info is not None else None
    return {
        "agentInfo": (
            {"name": implementation.name, "version": implementation.version}
            if implementation is not None
            else None
        ),
        "fork": fork_report(daemon, info),
    }


def capabilities_agents(daemon: Host) -> list[dict[str, Any]]:
    """``/capabilities`` ``agents``: per served workspace, its agent and whether it forks."""
    return [
        {"workspaceCwd": runtime.path, **agent_entry(daemon, runtime.agents.agent_info)}
        for runtime in daemon.registry
    ]


def known_info(daemon: Host, session: SessionActor) -> InitializeResult | None:
    """The ``initialize`` answer of the session's agent; while it has none bound (released
    while idle), its workspace pool's last known one; None before any agent came up."""
    conn = session.conn
    if conn is not None and conn.info is not None:
        return conn.info
    runtime = daemon.registry.runtimes.get(session.workspace)
    return runtime.agents.agent_info if runtime is not None else None


def session_agent(daemon: Host, session: SessionActor) -> dict[str, Any]:
    """``/session/:id/context`` ``agent``: the session's agent (:func:`known_info`)."""
    return agent_entry(daemon, known_info(daemon, session))
