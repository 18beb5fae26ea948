"""``GET /workspace/mcp`` from the configured ``mcpServers`` (pure; no MCP connection).

Theory of operation
-------------------
acp-serve does not (yet) own MCP clients: the agent reads the workspace settings and
connects to its MCP servers itself, inside its own process. So this snapshot is built
from configuration, the same ``<workspace>/.qwen/settings.json`` the agent reads, plus
the budget flags the daemon forwards to every agent (``--mcp-client-budget``,
``--mcp-budget-mode``). The MCP pool, when it lands, replaces the per-server cells with
observed state and may add ``scope: "workspace"`` budget cells; field names are the
reference's already (``clientCount``, ``clientBudget``, ``budgetMode``, ``budgets[]``).

* No live session: ``initialized: false`` and an empty snapshot (the seed's idle answer).
* A live session: one cell per configured server, in declaration order. A server listed
  in ``mcp.excluded`` (or missing from ``mcp.allowed`` when that list exists) is
  ``disabled`` with ``disabledReason: "config"``. In ``enforce`` mode the enabled servers
  past the budget are what the agent refuses, deterministically in declaration order:
  ``status: "error"``, ``errorKind: "budget_exhausted"``, ``disabledReason: "budget"``.
  The others are ``status: "unknown"``, ``mcpStatus: "unknown"``: the daemon cannot see
  the agent's connections. ``discoveryState`` stays ``not_started`` for the same reason
  (the daemon runs no discovery).
* ``budgets[]``: empty in ``off`` mode; else one ``scope: "session"`` cell whose
  ``liveCount`` is the number of servers a session would connect (``warning`` at
  ≥ 75 % of the budget, ``error`` when any server is refused).

No server cell carries ``command``, ``args``, ``env``, ``url`` or ``headers``: they may
hold credentials. Only the name, transport, description and the booleans above.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["BUDGET_WARNING_RATIO", "MAX_SERVERS", "mcp_snapshot", "transport_of"]

#: Fraction of the budget at which the budget cell turns ``warning``.
BUDGET_WARNING_RATIO: Final = 0.75
#: Most server cells reported.
MAX_SERVERS: Final = 1000
_BUDGET_HINT: Final = "Raise --mcp-client-budget or remove servers from mcpServers config."


def transport_of(config: dict[str, Any]) -> str:
    """qwen-code's transport choice: command → stdio, httpUrl → http, url → sse, tcp → ws."""
    if isinstance(config.get("command"), str):
        return "stdio"
    if isinstance(config.get("httpUrl"), str):
        return "http"
    if isinstance(config.get("url"), str):
        return "http" if config.get("type") == "http" else "sse"
    if isinstance(config.get("tcp"), str):
        return "websocket"
    return "unknown"


def _name_list(value: object) -> list[str] | None:
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return None


def mcp_snapshot(
    settings: dict[str, Any] | None,
    *,
    workspace_cwd: str,
    initialized: bool,
    budget: int | None,
    mode: str,
    error: str | None = None,
) -> dict[str, Any]:
    """The body of ``GET /workspace/mcp``; ``error`` reports an unusable settings file."""
    body: dict[str, Any] = {
        "v": 1,
        "workspaceCwd": workspace_cwd,
        "initialized": initialized,
        "discoveryState": "not_started",
        "clientCount": 0,
        "budgetMode": mode,
    }
    if budget is not None:
        body["clientBudget"] = budget
    body["budgets"] = []
    body["servers"] = []
    if error is not None:
        body["errors"] = [
            {
                "kind": "mcp_config",
                "status": "error",
                "error": error,
                "errorKind": "parse_error",
                "hint": "fix .qwen/settings.json",
            }
        ]
    if not initialized or settings is None:
        return body
    servers = settings.get("mcpServers")
    mcp_section = settings.get("mcp")
    mcp: dict[str, Any] = mcp_section if isinstance(mcp_section, dict) else {}
    excluded = set(_name_list(mcp.get("excluded")) or ())
    allowed = _name_list(mcp.get("allowed"))
    cells: list[dict[str, Any]] = []
    live = 0
    refused = 0
    for name, config in list(servers.items() if isinstance(servers, dict) else ())[:MAX_SERVERS]:
        if not isinstance(config, dict):
            cells.append(
                {
                    "kind": "mcp_server",
                    "status": "error",
                    "name": name,
                    "mcpStatus": "disconnected",
                    "transport": "unknown",
                    "disabled": False,
                    "errorKind": "parse_error",
                    "hint": "each mcpServers entry must be an object",
                }
            )
            continue
        cell: dict[str, Any] = {
            "kind": "mcp_server",
            "status": "unknown",
            "name": name,
            "mcpStatus": "unknown",
            "transport": transport_of(config),
            "disabled": False,
        }
        if isinstance(config.get("description"), str):
            cell["description"] = config["description"]
        if name in excluded or (allowed is not None and name not in allowed):
            cell.update(status="disabled", mcpStatus="disconnected", disabled=True)
            cell["disabledReason"] = "config"
        elif mode == "enforce" and budget is not None and live >= budget:
            refused += 1
            cell.update(status="error", mcpStatus="disconnected")
            cell["disabledReason"] = "budget"
            cell["errorKind"] = "budget_exhausted"
            cell["hint"] = _BUDGET_HINT
        else:
            live += 1
        cells.append(cell)
    body["servers"] = cells
    body["clientCount"] = live
    if mode != "off" and budget is not None:
        cell = {
            "kind": "mcp_budget",
            "scope": "session",
            "status": "ok",
            "liveCount": live,
            "budget": budget,
            "mode": mode,
            "refusedCount": refused,
        }
        if refused:
            cell.update(status="error", errorKind="budget_exhausted", hint=_BUDGET_HINT)
        elif live >= BUDGET_WARNING_RATIO * budget:
            cell.update(status="warning", hint=_BUDGET_HINT)
        body["budgets"] = [cell]
    return body
