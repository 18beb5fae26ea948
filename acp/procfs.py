"""Linux ``/proc``: every process's state, parent and process group (one scan), one
process's children (without a scan), and process trees walked with the latter
(:class:`TreeWalker`).

:func:`stats` reads one small file per process on the machine: a few ms of CPU with a
hundred processes, more on a busy host. :func:`children` reads only the target's
``/proc/<pid>/task/<tid>/children`` (one small file per thread of it: about 1 % of a scan),
so the periodic walks (the reaper, memory sampling, the watchdog) use it and fall back to a
scan only on a kernel without those files. The kernel documents the files as exact only
for a stopped process: a child forked or re-parented during the read may be missing, which
the periodic callers see on their next round.

Blocking: call both from a worker thread.
"""

from __future__ import annotations

import os
from collections.abc import Iterator


def stats() -> Iterator[tuple[int, bytes, int, int]]:
    """``(pid, state, ppid, pgid)`` of every process that can still be read."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) >= 3:
            yield int(entry), fields[0], int(fields[1]), int(fields[2])


def children(pid: int) -> list[int] | None:
    """``pid``'s children, zombies included, from ``/proc/<pid>/task/*/children`` ([] when
    ``pid`` is gone; None on a kernel without those files: use :func:`stats`)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(c) for c in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended
            return None  # a kernel without CONFIG_PROC_CHILDREN
        except (OSError, ValueError):
            continue
    return out


class TreeWalker:
    """Walks process trees through :func:`children`; on a kernel without those files, through
    one :func:`stats` scan shared by every walk of this walker (zombies included either way).
    One walker per sampling round: the scan is not refreshed."""

    def __init__(self) -> None:
        self._scanned: dict[int, list[int]] | None = None

    def children(self, pid: int) -> list[int]:
        if self._scanned is None:
            found = children(pid)
            if found is not None:
                return found
            self._scanned = {}
            for child, _state, ppid, _pgid in stats():
                self._scanned.setdefault(ppid, []).append(child)
        return self._scanned.get(pid, [])

    def tree(self, root: int) -> list[int]:
        """``root`` and its descendants, each once, ``root`` first."""
        out: list[int] = []
        seen: set[int] = set()
        stack = [root]
        while stack:
            pid = stack.pop()
            if pid in seen:
                continue
            seen.add(pid)
            out.append(pid)
            stack.extend(self.children(pid))
        return out
