"""The userspace watchdog: each agent child's process-tree memory, sampled; over its cap,
the whole tree is killed.

The backend of last resort (no writable cgroup: a Kubernetes pod without delegation, an
unprivileged user on a cgroup v2 host). Each sample walks every child's tree through
``/proc/<pid>/task/*/children`` (one scan of all of ``/proc`` instead on a kernel without
those files), then reads ``/proc/<pid>/statm`` of each tree member: resident pages (RSS; it
counts a page shared by two processes of a tree twice, so the cap errs on the safe side).
Blocking: :func:`sample` runs in a worker thread. Unlike the kernel, the watchdog only sees a
tree between samples (:data:`SAMPLE_S`): a child that allocates faster than that may pass
its cap by what it allocates in one period before it is killed; the ceiling (the agents'
parent cgroup, when there is one) or the kernel OOM killer (agents' ``oom_score_adj``
high) covers that gap.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from acp import procfs

#: Sampling period (seconds).
SAMPLE_S: Final = 0.5
PAGE: Final = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class TreeSample:
    rss_bytes: int
    pids: tuple[int, ...]  # the root first


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


def sample(roots: Mapping[str, int]) -> dict[str, TreeSample]:
    """Per child (name → root pid): the RSS of its tree and the tree's pids.

    The tree is walked through ``/proc/<pid>/task/*/children`` (a few reads per tree member,
    not a scan of every process); a kernel without those files gets one ``/proc`` scan."""
    walker = procfs.TreeWalker()
    out: dict[str, TreeSample] = {}
    for name, root in roots.items():
        pids = walker.tree(root)
        out[name] = TreeSample(sum(_rss(p) for p in pids), tuple(pids))
    return out


def kill_tree(pids: tuple[int, ...]) -> None:
    """SIGKILL every process of a tree (the root first: it cannot fork any more)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
