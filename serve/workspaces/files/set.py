"""The daemon's workspace objects: one :class:`~serve.workspaces.files.Workspace` per root.

Ownership
---------
The Host owns one :class:`WorkspaceSet` (built in ``serve/runtime/build.py`` and handed to
the effect gate and the workspace-state service; the fronts reach it as
``host.workspaces``). It keeps one :class:`Workspace` per canonical root, so the HTTP file
routes and the ACP ``fs/*`` handlers (which know a session's workspace path, not the
daemon) share one boundary and, above all, one per-path writer lock table: a client's
``POST /file/write`` and an agent's ``fs/write_text_file`` on the same file serialise.
The table is guarded by a ``threading.Lock`` (it is reached from worker threads) and
bounded by :data:`MAX_SHARED_WORKSPACES` roots (one per configured workspace in practice).

Errors: a workspace root that has vanished raises ``io_error`` (a
:class:`~serve.workspaces.files.WorkspaceFsError`), never a bare ``ValueError``.
"""

from __future__ import annotations

import os
import threading
from typing import Final

from serve.workspaces.files.errors import make_error
from serve.workspaces.files.paths import Workspace

__all__ = ["MAX_SHARED_WORKSPACES", "WorkspaceSet"]

#: Distinct workspace objects kept (one per configured root in practice).
MAX_SHARED_WORKSPACES: Final = 256


class WorkspaceSet:
    """The Host's table of :class:`Workspace` objects, by spelling and by canonical root."""

    def __init__(self, limit: int = MAX_SHARED_WORKSPACES) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._by_spelling: dict[tuple[str, bool], Workspace] = {}
        self._by_root: dict[tuple[str, bool], Workspace] = {}

    def get(self, root: str, *, trusted: bool = True) -> Workspace:
        """The :class:`Workspace` for ``root`` (any spelling of one directory)."""
        key = (root, trusted)
        with self._lock:
            found = self._by_spelling.get(key)
            if found is not None:
                return found
            canonical = (os.path.realpath(root), trusted)
            found = self._by_root.get(canonical)
            if found is None:
                if len(self._by_root) >= self._limit:
                    raise make_error("internal_error", "too many distinct workspaces")
                try:
                    found = Workspace(root, trusted=trusted)
                except ValueError:
                    raise make_error(
                        "io_error",
                        "the workspace directory is not available",
                        "the bound workspace was removed or unmounted; restart the daemon",
                    ) from None
                self._by_root[canonical] = found
            self._by_spelling[key] = found
            return found
