"""Daemon-wide workspace objects, live-session picking, and workspace-wide events.

Ownership
---------
:func:`shared_workspace` keeps one :class:`~serve.workspace.Workspace` per canonical root
for the whole process, so the HTTP file routes and the ACP ``fs/*`` handlers (which know a
session's workspace path, not the daemon) share one boundary and, above all, one per-path
writer lock table: a client's ``POST /file/write`` and an agent's ``fs/write_text_file``
on the same file serialise. The cache is guarded by a ``threading.Lock`` (it may be
reached from worker threads) and bounded by the number of configured workspaces.

Sessions: :func:`agent_session` picks the live session whose agent answers status
questions (the most recently created one in the primary workspace that finished its
handshake); status snapshots never start one. :func:`publish_workspace_event` sends a
workspace-scoped event to the :class:`~serve.workspace.hub.WorkspaceHub` actor (registered
here as a root-supervised service), which has every live session of the workspace append
it to its log by message (the reference's "workspace-wide" fan-out); it returns once the
sessions have it (bounded). With no live session there is nobody to tell and nothing is
stored.

Errors: a workspace root that has vanished raises ``io_error`` (a
:class:`~serve.workspace.WorkspaceFsError`), never a bare ``ValueError``; an unregistered
client id raises the ``400 invalid_client_id`` :class:`~serve.http.errors.ApiError`.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, Final

from actors import ChildSpec, Restart
from serve.http.errors import ApiError
from serve.runtime.services import ServiceSpec, register_service
from serve.workspace import Workspace
from serve.workspace.errors import make_error
from serve.workspace.hub import WorkspaceHub

if TYPE_CHECKING:
    from serve.runtime.daemon import Daemon
    from serve.sessions.actor import SessionActor

__all__ = [
    "HUB_SERVICE",
    "addressed_path",
    "agent_session",
    "check_workspace_client",
    "hub_of",
    "live_sessions",
    "primary_workspace",
    "publish_workspace_event",
    "shared_workspace",
]

HUB_SERVICE: Final = "workspace-hub"

#: Distinct workspace objects kept (one per configured root in practice).
MAX_SHARED_WORKSPACES: Final = 256

_lock = threading.Lock()
_by_spelling: dict[tuple[str, bool], Workspace] = {}
_by_root: dict[tuple[str, bool], Workspace] = {}


def shared_workspace(root: str, *, trusted: bool = True) -> Workspace:
    """The process-wide :class:`Workspace` for ``root`` (any spelling of one directory)."""
    key = (root, trusted)
    with _lock:
        found = _by_spelling.get(key)
        if found is not None:
            return found
        canonical = (os.path.realpath(root), trusted)
        found = _by_root.get(canonical)
        if found is None:
            if len(_by_root) >= MAX_SHARED_WORKSPACES:
                raise make_error("internal_error", "too many distinct workspaces")
            try:
                found = Workspace(root, trusted=trusted)
            except ValueError:
                raise make_error(
                    "io_error",
                    "the workspace directory is not available",
                    "the bound workspace was removed or unmounted; restart the daemon",
                ) from None
            _by_root[canonical] = found
        _by_spelling[key] = found
        return found


def addressed_path(daemon: Daemon) -> str:
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
    from quart import has_request_context, request

    if not has_request_context():
        return None
    args = request.view_args or {}
    ref = args.get("workspace")
    return ref if isinstance(ref, str) and request.path.startswith("/workspaces/") else None


def primary_workspace(daemon: Daemon) -> Workspace:
    """The workspace the request addresses (see :func:`addressed_path`), with its trust:
    the primary for singular routes."""
    path = addressed_path(daemon)
    trusted = path not in tuple(getattr(daemon.settings, "untrusted_workspaces", ()))
    return shared_workspace(path, trusted=trusted)


def live_sessions(daemon: Daemon, workspace: str | None = None) -> list[SessionActor]:
    registry = getattr(daemon, "registry", None)
    if registry is None:
        return []
    return list(registry.live(workspace))


def agent_session(daemon: Daemon) -> SessionActor | None:
    """The newest live session of the primary workspace whose agent finished set-up."""
    best: SessionActor | None = None
    for session in live_sessions(daemon, addressed_path(daemon)):
        conn = getattr(session, "conn", None)
        if conn is None or getattr(conn, "closed", True) or getattr(session, "setup", None) is None:
            continue
        if best is None or session.created_monotonic > best.created_monotonic:
            best = session
    return best


async def publish_workspace_event(
    daemon: Daemon, event_type: str, data: dict[str, Any], originator: str | None
) -> int:
    """Publish ``event_type`` on every live session's log of the addressed workspace,
    through the workspace hub; returns how many logs took it (once they have)."""
    hub = hub_of(daemon)
    if hub is None:
        return 0
    return await hub.broadcast(addressed_path(daemon), event_type, data, originator)


def hub_of(daemon: Daemon) -> WorkspaceHub | None:
    hub = getattr(daemon, "services", {}).get(HUB_SERVICE)
    return hub if isinstance(hub, WorkspaceHub) else None


def _build_hub(daemon: Daemon) -> tuple[WorkspaceHub, ChildSpec]:
    def sessions_for(workspace: str | None) -> list[Any]:
        registry = getattr(daemon, "registry", None)
        return list(registry.live(workspace)) if registry is not None else []

    hub = WorkspaceHub(sessions_for)
    spec = ChildSpec(HUB_SERVICE, hub.run, Restart.PERMANENT, shutdown_grace_s=2.0, stop=hub.close)
    return hub, spec


register_service(ServiceSpec(HUB_SERVICE, _build_hub, optional=False))  # routes await it


def check_workspace_client(daemon: Daemon, client_id: str | None) -> str | None:
    """A present client id must be registered on some live session of the daemon."""
    if client_id is None:
        return None
    registry = getattr(daemon, "registry", None)
    known = registry.known_client_ids(addressed_path(daemon)) if registry is not None else set()
    if client_id not in known:
        raise ApiError(
            400,
            {
                "error": f'Client id "{client_id}" is not registered for this workspace',
                "code": "invalid_client_id",
                "clientId": client_id,
            },
        )
    return client_id
