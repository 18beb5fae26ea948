"""Memory of agent children: PSS of each child's process tree, from ``/proc``.

PSS (proportional set size, ``Pss:`` in ``/proc/<pid>/smaps_rollup``) splits shared pages
among the processes mapping them, so summing it over children does not count the node
binary or shared libraries once per child the way RSS does. A child's figure is the sum
over the child and all its descendants (:class:`acp.procfs.TreeWalker`: each one's
``/proc/<pid>/task/*/children``; one scan of ``/proc`` on a kernel without those files).

Blocking file I/O: callers run :func:`measure_trees` in a worker thread. Unreadable
entries (a process that just exited, another user's process) count as 0.
"""

from __future__ import annotations

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


def measure_trees(pids: Iterable[int]) -> dict[int, int]:
    """PSS in KiB of each ``pid``'s process tree (at most one ``/proc`` scan for all of them)."""
    walker = procfs.TreeWalker()
    return {root: sum(_pss_kib(pid) for pid in walker.tree(root)) for root in pids}
