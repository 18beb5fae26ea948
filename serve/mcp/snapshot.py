"""The ``GET /workspace/mcp`` body: per-server cells and the budget cell (pure rendering).

Read from the pool's state of the workspace (:class:`~serve.mcp.state.WorkspaceMcp`) and
the configuration; never env values, headers or stderr. A server is ``managedBy`` the
``pool`` (a pooled stdio server, with its entry's status) or the ``agent`` (HTTP/SSE, or
every server with the pool off).
"""

from __future__ import annotations

from typing import Any

from serve.mcp.budget import BUDGET_HINT, BudgetPolicy, budget_cell
from serve.mcp.config import McpConfig, McpServerConfig
from serve.mcp.server import EntryState
from serve.mcp.state import WorkspaceMcp, admission_sets, counts


def render(
    path: str, ws: WorkspaceMcp | None, config: McpConfig, *, policy: BudgetPolicy, pooling: bool
) -> dict[str, Any]:
    """The ``GET /workspace/mcp`` body of ``path`` (``ws``: None before the pool knew it)."""
    scope = "workspace" if pooling else "session"
    _, admitted, refused = admission_sets(config, policy)
    live, reserved = counts(ws, policy, pooling) if ws is not None else (0, 0)
    if ws is None or not (ws.activated or ws.in_progress):
        discovery = "not_started"
    else:
        discovery = "in_progress" if ws.in_progress else "completed"
    body: dict[str, Any] = {
        "v": 1,
        "workspaceCwd": path,
        "initialized": ws is not None and ws.activated,
        "discoveryState": discovery,
        "clientCount": live,
    }
    if policy.budget is not None:
        body["clientBudget"] = policy.budget
    body["budgetMode"] = policy.mode
    cell = budget_cell(policy, scope=scope, live=live, reserved=reserved, refused=len(refused))
    body["budgets"] = [cell] if cell is not None else []
    body["pool"] = {
        "enabled": pooling,
        "entryCount": len(ws.entries) if ws is not None else 0,
    }
    body["servers"] = [
        server_cell(ws, server, admitted, refused, pooling=pooling) for server in config.servers
    ]
    if config.error is not None:
        body["errors"] = [{"errorKind": "invalid_config", "error": config.error}]
    return body


def server_cell(
    ws: WorkspaceMcp | None,
    server: McpServerConfig,
    admitted: set[str],
    refused: set[str],
    *,
    pooling: bool,
) -> dict[str, Any]:
    """One server's cell: its configuration, budget and (pooled) process state."""
    cell: dict[str, Any] = {
        "kind": "mcp_server",
        "status": "ok",
        "name": server.name,
        "mcpStatus": "disconnected",
        "transport": server.transport,
        "disabled": server.disabled,
    }
    if server.description is not None:
        cell["description"] = server.description
    if server.invalid is not None:
        cell.update(status="error", errorKind="invalid_config", hint=server.invalid)
        return cell
    if server.disabled:
        cell["disabledReason"] = "config"
        return cell
    if server.name in refused:
        cell.update(
            status="error",
            disabledReason="budget",
            errorKind="budget_exhausted",
            hint=BUDGET_HINT,
        )
        return cell
    if not pooling or server.transport != "stdio":
        cell["managedBy"] = "agent"
        return cell
    cell["managedBy"] = "pool"
    entry = ws.entries.get(server.name) if ws is not None else None
    if entry is None:
        cell["pool"] = {"entryCount": 0, "entries": []}
        return cell
    if entry.state is EntryState.CONNECTED:
        cell.update(mcpStatus="connected", toolCount=entry.tool_count)
    elif entry.state in (EntryState.STARTING, EntryState.RESTARTING):
        cell.update(status="warning", mcpStatus="connecting")
    else:
        cell.update(status="error", errorKind=entry.error_kind or "mcp_server_spawn_failed")
        if entry.error:
            cell["hint"] = entry.error
    cell["pool"] = {"entryCount": 1, "entries": [entry.status()]}
    return cell
