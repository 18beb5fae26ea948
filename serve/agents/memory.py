"""Memory of agent children: PSS of each child's process tree, from ``/proc``.

PSS (proportional set size, ``Pss:`` in ``/proc/<pid>/smaps_rollup``) splits shared pages
among the processes mapping them, so summing it over children does not count the node
binary or shared libraries once per child the way RSS does. A child's figure is the sum
over the child and all its descendants (each one's ``/proc/<pid>/task/*/children``, see
:func:`acp.procfs.children`; one scan of ``/proc`` on a kernel without those files).

Blocking file I/O: callers run :func:`measure_trees` in a worker thread. Unreadable
entries (a process that just exited, another user's process) count as 0.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from acp import procfs


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            ppid = int(stat.rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    return children


def measure_trees(pids: Iterable[int]) -> dict[int, int]:
    """PSS in KiB of each ``pid``'s process tree (at most one ``/proc`` scan for all of them)."""
    wanted = list(pids)
    if not wanted:
        return {}
    scanned: dict[int, list[int]] | None = None
    out: dict[int, int] = {}
    for root in wanted:
        total = 0
        stack = [root]
        seen: set[int] = set()
        while stack:
            pid = stack.pop()
            if pid in seen:
                continue
            seen.add(pid)
            total += _pss_kib(pid)
            kids = procfs.children(pid) if scanned is None else None
            if kids is None:
                scanned = scanned if scanned is not None else _children_map()
                kids = scanned.get(pid, [])
            stack.extend(kids)
        out[root] = total
    return out
