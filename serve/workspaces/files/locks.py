"""Per-path mutual exclusion for workspace writes running in worker threads.

Theory of operation
-------------------
The file functions run in ``trio.to_thread.run_sync`` worker threads, so the lock is a
``threading.Lock`` (a trio lock cannot be taken off the event loop). :class:`PathLocks`
hands out one lock per canonical absolute path. The table holds an entry only while some
thread holds or waits for that path (a reference count, dropped to zero → entry removed),
so its size is bounded by the number of concurrent operations, not by the number of paths
ever written. Acquisition waits at most ``timeout`` seconds and then raises ``io_error``
(503: the daemon is busy), so a stuck writer cannot pile up threads forever.

Scope: serialises writers *inside this daemon*. Another process (an editor on the pod) is
outside it; the write path re-checks the file's hash just before the rename for that case.
Two hard links to one inode are two keys.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from serve.workspaces.files.errors import make_error

__all__ = ["LOCK_TIMEOUT_SECONDS", "PathLocks"]

#: Longest a writer waits for another writer of the same path (seconds).
LOCK_TIMEOUT_SECONDS: Final = 30.0


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


class PathLocks:
    """A bounded table of per-path ``threading.Lock``s (see module docstring)."""

    def __init__(self, timeout: float = LOCK_TIMEOUT_SECONDS) -> None:
        self._timeout = timeout
        self._guard = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        """Paths currently held or waited for (for status reporting and tests)."""
        with self._guard:
            return len(self._entries)

    @contextmanager
    def hold(self, key: str, rel_path: str) -> Iterator[None]:
        """Hold the lock for ``key``; ``rel_path`` names the file in the timeout error."""
        with self._guard:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry()
            entry.users += 1
        try:
            if not entry.lock.acquire(timeout=self._timeout):
                raise make_error(
                    "io_error",
                    f"timed out after {self._timeout:g}s waiting for another write to {rel_path!r}",
                    "retry the write",
                )
            try:
                yield
            finally:
                entry.lock.release()
        finally:
            with self._guard:
                entry.users -= 1
                if entry.users == 0:
                    del self._entries[key]
