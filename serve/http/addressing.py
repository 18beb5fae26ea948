"""What a request addresses: its workspace, the agent that answers for it, its client id.

:func:`addressed_path` is the ``<workspace>`` of a plural ``/workspaces/<workspace>/...``
route (id or URL-encoded path; ``404 workspace_not_found`` when unknown), else the primary
workspace. :func:`agent_session` picks the live session whose agent answers status
questions (the most recently created one in the addressed workspace that finished its
handshake); status snapshots never start one. :func:`publish_workspace_event` sends a
workspace-scoped event to the :class:`~serve.workspaces.hub.WorkspaceHub` actor, which has
every live session of the workspace append it to its log by message (the reference's
"workspace-wide" fan-out); it returns once the sessions have it (bounded). With no live
session there is nobody to tell and nothing is stored. An unregistered client id is
``400 invalid_client_id``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quart import has_request_context, request

from serve.access import OPERATOR
from serve.http.access import principal
from serve.http.errors import ApiError
from serve.workspaces.files import Workspace

if TYPE_CHECKING:
    from serve.host import Host
    from serve.sessions.actor import SessionActor

__all__ = [
    "addressed_path",
    "agent_session",
    "check_workspace_client",
    "primary_workspace",
    "publish_workspace_event",
]


def addressed_path(daemon: Host) -> str:
    """The workspace a request addresses: the ``<workspace>`` of a plural
    ``/workspaces/<workspace>/...`` route (id or URL-encoded path; 404 when unknown),
    else the primary workspace."""
    ref = _route_workspace_ref()
    if ref is None:
        return daemon.settings.primary_workspace
    runtime = daemon.registry.by_ref(ref)
    if runtime is None:
        raise ApiError(
            404,
            {
                "error": f'No workspace "{ref}" is served by this daemon',
                "code": "workspace_not_found",
                "workspace": ref,
            },
        )
    return runtime.path


def _route_workspace_ref() -> str | None:
    if not has_request_context():
        return None
    args = request.view_args or {}
    ref = args.get("workspace")
    return ref if isinstance(ref, str) and request.path.startswith("/workspaces/") else None


def primary_workspace(daemon: Host) -> Workspace:
    """The workspace the request addresses (see :func:`addressed_path`), with its trust:
    the primary for singular routes."""
    path = addressed_path(daemon)
    trusted = path not in daemon.settings.untrusted_workspaces
    return daemon.workspaces.get(path, trusted=trusted)


def agent_session(daemon: Host) -> SessionActor | None:
    """The newest live session of the primary workspace whose agent finished set-up."""
    best: SessionActor | None = None
    for session in daemon.registry.live(addressed_path(daemon)):
        conn = session.conn
        if conn is None or conn.closed or session.setup is None:
            continue
        if best is None or session.created_monotonic > best.created_monotonic:
            best = session
    return best


async def publish_workspace_event(
    daemon: Host, event_type: str, data: dict[str, Any], originator: str | None
) -> int:
    """Publish ``event_type`` on every live session's log of the addressed workspace,
    through the workspace hub; returns how many logs took it (once they have)."""
    return await daemon.hub.broadcast(addressed_path(daemon), event_type, data, originator)


def check_workspace_client(daemon: Host, client_id: str | None) -> str | None:
    """A present client id must be registered, by the caller's principal, on some live
    session of the addressed workspace (another principal's id is answered as unknown)."""
    if client_id is None:
        return None
    who = principal().id if has_request_context() else OPERATOR.id
    if client_id not in daemon.registry.known_client_ids(addressed_path(daemon), who):
        raise ApiError(
            400,
            {
                "error": f'Client id "{client_id}" is not registered for this workspace',
                "code": "invalid_client_id",
                "clientId": client_id,
            },
        )
    return client_id
