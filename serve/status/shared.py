"""Daemon-wide workspace objects.

Ownership
---------
:func:`shared_workspace` keeps one :class:`~serve.workspace.Workspace` per canonical root
for the whole process, so the HTTP file routes and the ACP ``fs/*`` handlers (which know a
session's workspace path, not the daemon) share one boundary and, above all, one per-path
writer lock table: a client's ``POST /file/write`` and an agent's ``fs/write_text_file``
on the same file serialise. The cache is guarded by a ``threading.Lock`` (it may be
reached from worker threads) and bounded by the number of configured workspaces.

What a *request* addresses (the workspace of a plural route, the agent that answers status
questions, a client id that must be known, workspace-wide events) is decided in the HTTP
layer: :mod:`serve.http.addressing`.

Errors: a workspace root that has vanished raises ``io_error`` (a
:class:`~serve.workspace.WorkspaceFsError`), never a bare ``ValueError``.
"""

from __future__ import annotations

import os
import threading
from typing import Final

from serve.workspace import Workspace
from serve.workspace.errors import make_error

__all__ = ["HUB_SERVICE", "shared_workspace"]

#: The root supervisor's name for the WorkspaceHub (serve/workspace/hub.py).
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
