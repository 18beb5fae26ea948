"""Workspace status snapshots and workspace mutations (spec §4.6, seed "只读运行时状态路由").

Read-only (never start an agent; with no live session the agent-derived parts answer
``initialized: false`` or ``not_started``):

* ``GET /workspace/env``        runtime, platform, sandbox, proxies (``host:port``), secret
                                env vars as presence only (:mod:`serve.status.env`);
* ``GET /workspace/preflight``  daemon-local cells (probed, cached) + agent-local cells;
* ``GET /workspace/mcp``        configured ``mcpServers`` and budget cells
                                (:mod:`serve.status.mcp`);
* ``GET /workspace/skills``     project skills (:mod:`serve.status.skills`);
* ``GET /workspace/providers``  the live agent's models grouped by auth type, its auth
                                methods and capabilities (:mod:`serve.status.agent`).

Mutations (strict routes: the security middleware gates ``POST /workspace/init`` and
``POST /workspace/tools/<name>/enable``; both check a present ``X-Qwen-Client-Id``
against the live sessions' clients and publish a workspace-wide event stamped with it):

* ``POST /workspace/init``               ``{force?}`` → ``{path, action}``; event
                                         ``workspace_initialized {path, action}``
                                         (:mod:`serve.status.init`);
* ``POST /workspace/tools/<name>/enable`` ``{enabled}`` → ``{toolName, enabled}``; persists
                                         ``tools.disabled`` in ``.qwen/settings.json``;
                                         event ``tool_toggled {toolName, enabled}``.

File work runs in worker threads through the shared workspace boundary. Status routes
answer with ``Cache-Control: no-store``.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
from typing import Any, Final

import msgspec
from quart import Blueprint, Response

from serve import threads
from serve.errors import settings_file_error, workspace_fs_error
from serve.http import plural
from serve.http.addressing import (
    addressed_path,
    agent_session,
    check_workspace_client,
    primary_workspace,
    publish_workspace_event,
)
from serve.http.capabilities import Feature
from serve.http.context import daemon
from serve.http.errors import ApiError, bad_request, rest_error
from serve.http.routes.sessions import header_client_id
from serve.http.wire import json_body, json_response
from serve.status.agent import acp_cells, providers_snapshot
from serve.status.env import env_cells
from serve.status.init import (
    InitConflict,
    InitError,
    InitResult,
    init_memory_file,
    memory_file_name,
)
from serve.status.mcp import mcp_snapshot
from serve.status.preflight import daemon_cells
from serve.status.skills import project_skills
from serve.threads import file_routes_limiter
from serve.workspaces.files import Workspace, WorkspaceFsError
from serve.workspaces.state.settings_file import SettingsFileError, read_settings, set_tool_enabled

blueprint = Blueprint("workspace_status", __name__)
PLURAL_ROUTES = plural.PluralRoutes(blueprint)

#: Longest tool name accepted by the toggle route (characters).
MAX_TOOL_NAME_CHARS: Final = 256
NO_STORE: Final = {"Cache-Control": "no-store"}

FEATURES: tuple[Feature, ...] = (
    Feature("workspace_env", (("GET", "/workspace/env"),)),
    Feature("workspace_preflight", (("GET", "/workspace/preflight"),)),
    Feature("workspace_mcp", (("GET", "/workspace/mcp"),)),
    Feature("workspace_skills", (("GET", "/workspace/skills"),)),
    Feature("workspace_providers", (("GET", "/workspace/providers"),)),
    Feature("workspace_init", (("POST", "/workspace/init"),)),
    Feature("workspace_tool_toggle", (("POST", "/workspace/tools/<name>/enable"),)),
)


def _envelope(initialized: bool, **fields: object) -> dict[str, Any]:
    return {
        "v": 1,
        "workspaceCwd": addressed_path(daemon()),
        "initialized": initialized,
        **fields,
    }


def _status_error(kind: str, err: WorkspaceFsError) -> dict[str, Any]:
    return {"kind": kind, "status": "error", "error": err.message, "errorKind": "missing_file"}


def _fs_failure(err: WorkspaceFsError) -> ApiError:
    return rest_error(workspace_fs_error(err))


# ---- read-only snapshots ------------------------------------------------------------------


@PLURAL_ROUTES.route("GET", "/workspace/env")
async def workspace_env(workspace: str | None = None) -> Response:
    cells = env_cells(
        os.environ,
        python_version=platform.python_version(),
        system=sys.platform,
        machine=platform.machine(),
    )
    body = _envelope(True, acpChannelLive=agent_session(daemon()) is not None, cells=cells)
    return json_response(body, headers=NO_STORE)


@PLURAL_ROUTES.route("GET", "/workspace/preflight")
async def workspace_preflight(workspace: str | None = None) -> Response:
    d = daemon()
    session = agent_session(d)
    cells = await daemon_cells(addressed_path(d))
    skill_count: int | None = None
    if session is not None:
        try:
            ws = primary_workspace(d)
            skill_count = len(await threads.run_sync(file_routes_limiter(), project_skills, ws))
        except WorkspaceFsError:
            skill_count = None
    cells.extend(acp_cells(session, skill_count))
    body = _envelope(True, acpChannelLive=session is not None, cells=cells)
    return json_response(body, headers=NO_STORE)


@PLURAL_ROUTES.route("GET", "/workspace/mcp")
async def workspace_mcp(workspace: str | None = None) -> Response:
    d = daemon()
    session = agent_session(d)
    settings: dict[str, Any] | None = None
    error: str | None = None
    if session is not None:
        try:
            settings, _ = await threads.run_sync(
                file_routes_limiter(), read_settings, primary_workspace(d)
            )
        except (SettingsFileError, WorkspaceFsError) as err:
            error = str(err)
    body = mcp_snapshot(
        settings,
        workspace_cwd=addressed_path(d),
        initialized=session is not None,
        budget=d.settings.mcp_client_budget,
        mode=d.settings.mcp_budget_mode,
        error=error,
    )
    pool = d.mcp_pool
    if pool.pooling and session is not None and error is None:
        # The pool knows the live state: pids, restarts, connections, refusals.
        body = {**body, **await pool.snapshot(addressed_path(d))}
        body["initialized"] = True
    return json_response(body, headers=NO_STORE)


@PLURAL_ROUTES.route("GET", "/workspace/skills")
async def workspace_skills(workspace: str | None = None) -> Response:
    d = daemon()
    if agent_session(d) is None:
        return json_response(_envelope(False, skills=[]), headers=NO_STORE)
    try:
        skills = await threads.run_sync(file_routes_limiter(), project_skills, primary_workspace(d))
    except WorkspaceFsError as err:
        body = _envelope(True, skills=[], errors=[_status_error("skills", err)])
        return json_response(body, headers=NO_STORE)
    return json_response(_envelope(True, skills=skills), headers=NO_STORE)


@PLURAL_ROUTES.route("GET", "/workspace/providers")
async def workspace_providers(workspace: str | None = None) -> Response:
    session = agent_session(daemon())
    if session is None:
        body = _envelope(False, current=None, providers=[])
        return json_response(body, headers=NO_STORE)
    snapshot = providers_snapshot(session)
    conn = session.conn
    info = conn.info if conn is not None else None
    agent = info.agent_info if info is not None else None
    agent_capabilities: dict[str, Any] = {}
    if info is not None:
        agent_capabilities = msgspec.to_builtins(info.agent_capabilities)
        agent_capabilities.pop("_meta", None)
        agent_capabilities.pop("meta", None)
    body = _envelope(
        True,
        current=snapshot["current"],
        providers=snapshot["providers"],
        agent=msgspec.to_builtins(agent) if agent is not None else None,
        authMethods=[
            {"id": m.id, "name": m.name, "description": m.description}
            for m in (info.auth_methods if info is not None else ())
        ],
        agentCapabilities=agent_capabilities,
    )
    return json_response(body, headers=NO_STORE)


# ---- mutations ----------------------------------------------------------------------------


def _init_in_thread(ws: Workspace, flag_value: str, force: bool) -> InitResult:
    try:
        settings, _ = read_settings(ws)
    except SettingsFileError:
        settings = {}
    return init_memory_file(ws, memory_file_name(flag_value, settings), force=force)


@PLURAL_ROUTES.route("POST", "/workspace/init")
async def workspace_init(workspace: str | None = None) -> Response:
    body = await json_body()
    force = body.get("force", False)
    if force is None:
        force = False
    if not isinstance(force, bool):
        raise bad_request("`force` must be a boolean", "invalid_force_flag")
    d = daemon()
    client_id = check_workspace_client(d, header_client_id())
    try:
        ws = primary_workspace(d)
        result = await threads.run_sync(
            file_routes_limiter(), _init_in_thread, ws, d.settings.memory_file_name, force
        )
    except InitConflict as conflict:
        raise ApiError(
            409,
            {
                "error": conflict.message,
                "code": "workspace_init_conflict",
                "path": conflict.path,
                "existingSize": conflict.size,
            },
        ) from None
    except InitError as err:
        raise bad_request(err.message, err.code) from None
    except WorkspaceFsError as err:
        raise _fs_failure(err) from None
    out = {"path": result.path, "action": result.action}
    await publish_workspace_event(d, "workspace_initialized", out, client_id)
    return json_response(out)


@PLURAL_ROUTES.route("POST", "/workspace/tools/<name>/enable")
async def workspace_tool_enable(name: str, workspace: str | None = None) -> Response:
    if not name.strip() or len(name) > MAX_TOOL_NAME_CHARS:
        raise bad_request(
            f"tool name must be 1 to {MAX_TOOL_NAME_CHARS} characters", "invalid_tool_name"
        )
    body = await json_body()
    enabled = body.get("enabled")
    if not isinstance(enabled, bool):
        raise bad_request("`enabled` must be a boolean", "invalid_enabled_flag")
    d = daemon()
    client_id = check_workspace_client(d, header_client_id())
    try:
        ws = primary_workspace(d)
        await threads.run_sync(
            file_routes_limiter(), functools.partial(set_tool_enabled, ws, name, enabled)
        )
    except SettingsFileError as err:
        raise rest_error(settings_file_error(err)) from None
    except WorkspaceFsError as err:
        raise _fs_failure(err) from None
    out = {"toolName": name, "enabled": enabled}
    await publish_workspace_event(d, "tool_toggled", out, client_id)
    return json_response(out)
