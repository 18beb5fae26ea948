"""ACP ``session/fork`` at ``/acp`` (unstable ACP; ``ForkSessionRequest``/``Response``).

``{sessionId, cwd, mcpServers?, additionalDirectories?, _meta?}`` → ``{sessionId, modes?,
models?, configOptions?}`` plus the daemon's session fields (``workspaceCwd``, ``attached``,
``clientId``, ``createdAt``, as ``session/new``) and ``parentSessionId``, ``inherited``.

The fork is the use case the REST branch route calls too (:func:`serve.sessions.fork.
fork_session`): a new daemon session with its own journal, agent binding, clients and limits,
with its parent's model, mode and MCP servers; this connection owns it and its session
stream replays from the start, so it begins with ``_qwen/notify session_forked
{sessionId, parentSessionId}``. The parent is any live session of the daemon (as
``session/load`` reaches any), in the workspace ``cwd`` names (a fork stays in its parent's
workspace). The request's ``mcpServers`` are not used, as in ``session/new``: the fork gets the
workspace's servers, as its parent did. Errors: an agent that does not advertise
``sessionCapabilities.fork`` answers ``-32601`` with ``data {httpStatus: 501, code:
"not_supported_by_agent"}``; an unknown parent ``-32002 session_not_found``; a ``cwd`` of
another workspace ``-32602 workspace_mismatch``.
"""

from __future__ import annotations

from typing import Any

from serve.acpfront.jsonrpc import INVALID_PARAMS, RESOURCE_NOT_FOUND, SERVER_ERROR, RpcError
from serve.sessions.fork import current_state, fork_session

_SETUP_KEYS = ("modes", "models", "configOptions")


def _params_error(message: str, **data: Any) -> RpcError:
    return RpcError(INVALID_PARAMS, message, {"httpStatus": 400, **data})


async def session_fork(front: Any, conn: Any, params: dict[str, Any]) -> Any:
    """The ``session/fork`` handler: ``front`` is the :class:`~serve.acpfront.front.AcpFront`
    (it lends its session-owning steps), ``conn`` the asking connection."""
    sid = params.get("sessionId")
    if not isinstance(sid, str) or not sid:
        raise _params_error("`sessionId` must be a non-empty string")
    servers = params.get("mcpServers")
    if servers is not None and not isinstance(servers, list):
        raise _params_error("`mcpServers` must be an array")
    workspace = front._workspace(conn, params)
    if getattr(front.host, "draining", False):
        raise RpcError(
            SERVER_ERROR, "Daemon is draining", {"httpStatus": 503, "code": "daemon_draining"}
        )
    parent = front.host.registry.get(sid)
    if parent is None:
        raise RpcError(
            RESOURCE_NOT_FOUND,
            f'No session with id "{sid}"',
            {"httpStatus": 404, "code": "session_not_found", "sessionId": sid},
        )
    if parent.workspace != workspace:
        raise _params_error(
            f"Session {sid} belongs to workspace {parent.workspace}; a fork stays in its "
            f"parent's workspace (cwd {workspace})",
            code="workspace_mismatch",
            requestedWorkspace=workspace,
            sessionWorkspace=parent.workspace,
        )
    reserved = front._reserve(conn)
    try:
        forked = await fork_session(front.host.registry, parent)
        # A session made for this call: its stream from the start (session_forked first).
        link, view = await front._own_made(conn, forked.session, False, replay=True)
    finally:
        conn.reserved_sessions -= reserved
    out: dict[str, Any] = front._session_result(view, link, False)
    out.update(current_state({k: out[k] for k in _SETUP_KEYS if k in out}, view))
    out["parentSessionId"] = forked.parent_id
    out["inherited"] = forked.inherited
    return out


def fork_capability(host: Any, workspace: str) -> dict[str, Any]:
    """``sessionCapabilities`` entry of ``initialize`` at ``/acp``: ``{"fork": {}}`` unless
    the workspace's agent is known not to fork (its pool initialized a child that does not
    advertise it); while nothing is known it is offered, and a session whose agent cannot
    fork answers ``session/fork`` with the precise error above."""
    runtimes = getattr(getattr(host, "registry", None), "runtimes", {})
    pool = getattr(runtimes.get(workspace), "agents", None)
    info = getattr(pool, "agent_info", None)
    if info is not None and not info.supports_fork:
        return {}
    return {"fork": {}}
