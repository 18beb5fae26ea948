"""The read-only ``_qwen/workspace/*`` views at ``/acp``: the bodies of their REST twins.

``_qwen/workspace/env``, ``preflight``, ``mcp``, ``skills`` and ``providers`` answer what
``GET /workspace/env|preflight|mcp|skills|providers`` answer, for the connection's workspace
(the one its ``/acp`` or ``/workspaces/:workspace/acp`` route named), built from the same
``serve.status`` functions (file reads in a worker thread under the file routes' limiter).
"The agent" is the newest live session of that workspace whose agent finished set-up, as on
REST; without one the bodies say ``initialized: false`` (``acpChannelLive: false``).
``providers`` lists the agent's auth methods without the terminal ones (see :mod:`.v121`).

Out of scope, answered -32601 (see docs/reference/acp.md): the
mutations (``init``, ``setup``, ``set_tool_enabled``, MCP server add/remove/reload/restart,
permissions/trust changes, memory writes, agents and session groups, the device flow) each
need the strict gate and a rate tier of their own, and several have no REST twin in this
daemon; ``permissions``, ``trust``, ``tools``, ``memory``, ``agents``, ``session_groups``,
``auth/status`` and the ``mcp/tools|resources`` reads have no REST twin here either.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Any, Final

import msgspec

from serve import threads
from serve.acpfront import v121
from serve.acpfront.connections import Connection, Connections
from serve.sessions.actor import SessionActor
from serve.status.agent import acp_cells, providers_snapshot
from serve.status.env import env_cells
from serve.status.mcp import mcp_snapshot
from serve.status.preflight import PreflightCell, daemon_cells
from serve.status.skills import project_skills
from serve.threads import file_routes_limiter
from serve.workspaces.files import Workspace, WorkspaceFsError
from serve.workspaces.state.settings_file import SettingsFileError, read_settings

METHODS: Final = (
    "_qwen/workspace/env",
    "_qwen/workspace/preflight",
    "_qwen/workspace/mcp",
    "_qwen/workspace/skills",
    "_qwen/workspace/providers",
)


def _agent_session(front: Connections, workspace: str) -> SessionActor | None:
    best: SessionActor | None = None
    for session in front.host.registry.live(workspace):
        conn = getattr(session, "conn", None)
        if conn is None or getattr(conn, "closed", True) or getattr(session, "setup", None) is None:
            continue
        if best is None or session.created_monotonic > best.created_monotonic:
            best = session
    return best


def _workspace(front: Connections, conn: Connection) -> Workspace:
    untrusted = front.host.settings.untrusted_workspaces
    return front.host.workspaces.get(conn.workspace, trusted=conn.workspace not in untrusted)


def _envelope(conn: Connection, initialized: bool, **fields: object) -> dict[str, Any]:
    return {"v": 1, "workspaceCwd": conn.workspace, "initialized": initialized, **fields}


async def env(front: Connections, conn: Connection, params: dict[str, Any]) -> dict[str, Any]:
    cells = env_cells(
        os.environ,
        python_version=platform.python_version(),
        system=sys.platform,
        machine=platform.machine(),
    )
    live = _agent_session(front, conn.workspace) is not None
    return _envelope(conn, True, acpChannelLive=live, cells=cells)


async def preflight(front: Connections, conn: Connection, params: dict[str, Any]) -> dict[str, Any]:
    session = _agent_session(front, conn.workspace)
    cells: list[PreflightCell] = await daemon_cells(conn.workspace)
    skill_count: int | None = None
    if session is not None:
        try:
            ws = _workspace(front, conn)
            skill_count = len(await threads.run_sync(file_routes_limiter(), project_skills, ws))
        except WorkspaceFsError:
            skill_count = None
    cells.extend(acp_cells(session, skill_count))
    return _envelope(conn, True, acpChannelLive=session is not None, cells=cells)


async def mcp(front: Connections, conn: Connection, params: dict[str, Any]) -> dict[str, Any]:
    host = front.host
    session = _agent_session(front, conn.workspace)
    settings: dict[str, Any] | None = None
    error: str | None = None
    if session is not None:
        try:
            settings, _ = await threads.run_sync(
                file_routes_limiter(), read_settings, _workspace(front, conn)
            )
        except (SettingsFileError, WorkspaceFsError) as err:
            error = str(err)
    body = mcp_snapshot(
        settings,
        workspace_cwd=conn.workspace,
        initialized=session is not None,
        budget=host.settings.mcp_client_budget,
        mode=host.settings.mcp_budget_mode,
        error=error,
    )
    pool = host.mcp_pool
    if pool.pooling and session is not None and error is None:
        body = {**body, **await pool.snapshot(conn.workspace)}
        body["initialized"] = True
    return body


async def skills(front: Connections, conn: Connection, params: dict[str, Any]) -> dict[str, Any]:
    if _agent_session(front, conn.workspace) is None:
        return _envelope(conn, False, skills=[])
    try:
        found = await threads.run_sync(
            file_routes_limiter(), project_skills, _workspace(front, conn)
        )
    except WorkspaceFsError as err:
        error = {"kind": "skills", "status": "error", "error": err.message}
        return _envelope(conn, True, skills=[], errors=[{**error, "errorKind": "missing_file"}])
    return _envelope(conn, True, skills=found)


async def providers(front: Connections, conn: Connection, params: dict[str, Any]) -> dict[str, Any]:
    session = _agent_session(front, conn.workspace)
    if session is None:
        return _envelope(conn, False, current=None, providers=[])
    snapshot = providers_snapshot(session)
    info = getattr(getattr(session, "conn", None), "info", None)
    agent = getattr(info, "agent_info", None)
    capabilities_raw = getattr(info, "agent_capabilities", None)
    capabilities: dict[str, Any] = {}
    if capabilities_raw is not None:
        capabilities = msgspec.to_builtins(capabilities_raw)
        capabilities.pop("_meta", None)
        capabilities.pop("meta", None)
    return _envelope(
        conn,
        True,
        current=snapshot["current"],
        providers=snapshot["providers"],
        agent=msgspec.to_builtins(agent) if agent is not None else None,
        authMethods=[
            {k: m[k] for k in ("id", "name", "description") if k in m}
            for m in v121.auth_methods(front, conn.workspace)
        ],
        agentCapabilities=capabilities,
    )


#: The method table entries (``(front, conn, params) -> result``) of :mod:`.dispatch`.
HANDLERS: Final = {
    "_qwen/workspace/env": env,
    "_qwen/workspace/preflight": preflight,
    "_qwen/workspace/mcp": mcp,
    "_qwen/workspace/skills": skills,
    "_qwen/workspace/providers": providers,
}
