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

from typing import Any

from acp.schema import InitializeResult
from serve.sessions.fork import fork_path
from serve.workspaces.state import agent_ext


def _kind(info: InitializeResult) -> str | None:
    implementation = info.agent_info
    name = getattr(implementation, "name", None)
    if not isinstance(name, str) or not name:
        return None
    version = getattr(implementation, "version", None)
    return f"{name}@{version}" if isinstance(version, str) and version else name


def fork_report(daemon: object, info: InitializeResult | None) -> dict[str, Any]:
    """``{supported, via}`` for an agent whose ``initialize`` answer is ``info`` (or None)."""
    if info is None:
        return {"supported": None, "via": None}
    vendor = agent_ext.support_for(daemon).verdict(_kind(info), agent_ext.BRANCH)
    path = fork_path(bool(info.supports_fork), vendor)
    via = agent_ext.BRANCH if path == "vendor" else path
    return {"supported": via is not None, "via": via}


def agent_entry(daemon: object, info: InitializeResult | None) -> dict[str, Any]:
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


def capabilities_agents(daemon: object) -> list[dict[str, Any]]:
    """``/capabilities`` ``agents``: per served workspace, its agent and whether it forks."""
    out = []
    for runtime in getattr(daemon, "registry", ()):
        pool = getattr(runtime, "agents", None)
        info: InitializeResult | None = getattr(pool, "agent_info", None)
        out.append({"workspaceCwd": runtime.path, **agent_entry(daemon, info)})
    return out


def known_info(daemon: object, session: object) -> InitializeResult | None:
    """The ``initialize`` answer of the session's agent; while it has none bound (released
    while idle), its workspace pool's last known one; None before any agent came up."""
    info: InitializeResult | None = getattr(getattr(session, "conn", None), "info", None)
    if info is None:
        runtimes = getattr(getattr(daemon, "registry", None), "runtimes", {})
        pool = getattr(runtimes.get(getattr(session, "workspace", None)), "agents", None)
        info = getattr(pool, "agent_info", None)
    return info


def session_agent(daemon: object, session: object) -> dict[str, Any]:
    """``/session/:id/context`` ``agent``: the session's agent (:func:`known_info`)."""
    return agent_entry(daemon, known_info(daemon, session))
