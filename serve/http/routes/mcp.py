"""``POST /workspace/mcp/<server>/restart`` and the McpPool's capability tags.

``GET /workspace/mcp`` (tag ``workspace_mcp``) is served by :mod:`serve.http.routes.workspace`;
the pool's view of it is :meth:`serve.mcp.McpPool.snapshot` (for the lead to wire there).
The tags here that name ``GET /workspace/mcp`` describe fields of that snapshot.

Handlers validate (client id, server name, ``entryIndex``), ask the pool, and map its
exceptions to the wire here: :class:`~serve.mcp.McpServerNotFound` → 404
``mcp_server_not_found``, :class:`~serve.mcp.McpRestartFailed` → 502
``mcp_server_restart_failed``, a pool that is not running → 503 ``mcp_pool_unavailable``.
The restart route is a strict-gate route (``serve.http.security.strict``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quart import Blueprint, Response, request

from actors import ActorError
from serve.http.addressing import check_workspace_client
from serve.http.capabilities import Feature
from serve.http.context import daemon
from serve.http.errors import ApiError, bad_request, service_unavailable
from serve.http.routes.sessions import header_client_id
from serve.http.wire import json_body, json_response
from serve.mcp import McpPool, McpRestartFailed, McpServerNotFound

if TYPE_CHECKING:
    from serve.host import Host

blueprint = Blueprint("mcp", __name__)

MCP_RULE = "/workspace/mcp"
RESTART_RULE = "/workspace/mcp/<server>/restart"


def _pool_active(d: Host) -> bool:
    return d.mcp_pool.pooling


FEATURES: tuple[Feature, ...] = (
    Feature("mcp_guardrails", (("GET", MCP_RULE),), modes=("warn", "enforce")),
    Feature("mcp_guardrail_events", (("GET", "/session/<session_id>/events"),)),
    Feature("workspace_mcp_restart", (("POST", RESTART_RULE),), when=_pool_active),
    Feature("mcp_workspace_pool", (("GET", MCP_RULE),), when=_pool_active),
    Feature("mcp_pool_restart", (("POST", RESTART_RULE),), when=_pool_active),
)


def workspace_client_id() -> str | None:
    """The ``X-Qwen-Client-Id`` header, which must belong to a live session when present."""
    return check_workspace_client(daemon(), header_client_id())


def _unavailable() -> ApiError:
    return service_unavailable("The MCP pool is not running", "mcp_pool_unavailable")


def _pool() -> McpPool:
    pool = daemon().mcp_pool
    if pool.closed:
        raise _unavailable()
    return pool


def _entry_index() -> str | None:
    """``?entryIndex=N|*``: None (absent), ``"*"`` or ``"0"`` (the pool has one entry)."""
    raw = request.args.get("entryIndex")
    if raw is None:
        return None
    raw = raw.strip()
    if raw == "*":
        return raw
    if not raw.isdigit():
        raise bad_request("entryIndex must be a non-negative integer or *", "invalid_entry_index")
    return str(int(raw))


@blueprint.post(RESTART_RULE)
async def restart_server(server: str) -> Response:
    if not server.strip():
        raise bad_request("MCP server name must not be empty", "invalid_server_name")
    await json_body()
    originator = workspace_client_id()
    entry_index = _entry_index()
    if entry_index is not None and entry_index not in ("*", "0"):
        raise ApiError(
            404,
            {
                "error": f'MCP server "{server}" has no pool entry {entry_index}',
                "code": "mcp_pool_entry_not_found",
                "serverName": server,
                "entryIndex": int(entry_index),
            },
        )
    d = daemon()
    try:
        result = await _pool().restart(d.settings.primary_workspace, server, originator=originator)
    except McpServerNotFound as exc:
        body: dict[str, Any] = {
            "error": str(exc),
            "code": "mcp_server_not_found",
            "serverName": server,
        }
        if exc.reason != "not_configured":
            body["reason"] = exc.reason
        raise ApiError(404, body) from None
    except McpRestartFailed as exc:
        raise ApiError(
            502,
            {
                "error": str(exc),
                "code": "mcp_server_restart_failed",
                "serverName": server,
                "errorKind": exc.error_kind,
            },
        ) from None
    except ActorError:
        raise _unavailable() from None
    if entry_index is None:
        return json_response(result)
    entry = {k: v for k, v in result.items() if k != "serverName"}
    return json_response({"serverName": server, "entries": [{"entryIndex": 0, **entry}]})
