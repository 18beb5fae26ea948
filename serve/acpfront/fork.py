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

from serve.acpfront import access as acp_access
from serve.acpfront.connections import ASK_TIMEOUT_S, Connection, Connections
from serve.acpfront.errors import draining, not_found, params_error
from serve.acpfront.links import own_made, reserve
from serve.acpfront.session_methods import session_result, workspace_of
from serve.host import Host
from serve.sessions.fork import current_state, fork_session
from serve.sessions.messages import Describe, SessionView

_SETUP_KEYS = ("modes", "models", "configOptions")


async def session_fork(
    front: Connections, conn: Connection, params: dict[str, Any]
) -> dict[str, Any]:
    """The ``session/fork`` handler: the session-owning steps are :mod:`.links`', ``conn``
    the asking connection."""
    sid = params.get("sessionId")
    if not isinstance(sid, str) or not sid:
        raise params_error("`sessionId` must be a non-empty string")
    servers = params.get("mcpServers")
    if servers is not None and not isinstance(servers, list):
        raise params_error("`mcpServers` must be an array")
    workspace = workspace_of(front, conn, params)
    if front.host.draining:
        raise draining()
    parent = front.host.registry.get(sid)
    if parent is None:
        raise not_found(sid)
    # Its workspace as its view answers (a session gone meanwhile: the same 404).
    parent_view: SessionView = await parent.call(Describe(), timeout_s=ASK_TIMEOUT_S)
    if parent_view.workspace != workspace:
        raise params_error(
            f"Session {sid} belongs to workspace {parent_view.workspace}; a fork stays in its "
            f"parent's workspace (cwd {workspace})",
            code="workspace_mismatch",
            requestedWorkspace=workspace,
            sessionWorkspace=parent_view.workspace,
        )
    reserved = reserve(conn)
    try:
        acp_access.check_workspace(front.host, conn, workspace)
        owner, quota = acp_access.owner_of(front.host, conn)
        forked = await fork_session(front.host.registry, parent, owner, quota)
        # A session made for this call: its stream from the start (session_forked first).
        link, view = await own_made(front, conn, forked.session, False, replay=True)
    finally:
        conn.reserved_sessions -= reserved
    out: dict[str, Any] = session_result(view, link, False)
    out.update(current_state({k: out[k] for k in _SETUP_KEYS if k in out}, view))
    out["parentSessionId"] = forked.parent_id
    out["inherited"] = forked.inherited
    return out


def fork_capability(host: Host, workspace: str) -> dict[str, Any]:
    """``sessionCapabilities`` entry of ``initialize`` at ``/acp``: ``{"fork": {}}`` unless
    the workspace's agent is known not to fork (its pool initialized a child that does not
    advertise it); while nothing is known it is offered, and a session whose agent cannot
    fork answers ``session/fork`` with the precise error above."""
    runtime = host.registry.runtimes.get(workspace)
    info = runtime.agents.agent_info if runtime is not None else None
    if info is not None and not info.supports_fork:
        return {}
    return {"fork": {}}
