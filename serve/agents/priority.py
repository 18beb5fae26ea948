"""Warm refills at a lower CPU priority than live sessions' work.

A child the pool spawns ahead of need (a warm refill, a failing pool's probe) gets its
cgroup's CPU weight at :data:`REFILL_CPU_WEIGHT` from before its ``exec`` (the weight is
written when its cgroup is made, so nothing of it ever runs at full weight) and keeps it
while it waits as a spare: its start-up (about a second of CPU for a node agent) and any
background work of an idle spare yield to the live agents, which run at
``--agent-cpu-weight``. The weight goes back to ``--agent-cpu-weight`` the moment a session
takes the child, or as soon as a caller waits for a child still being spawned (a session
must not wait on a start slowed for it).

Only a kernel cpu controller can do this safely (cgroup v2 ``cpu.weight``, v1
``cpu.shares``): the daemon owns the cgroup and can raise the weight again. ``nice`` is not
used: an unprivileged daemon cannot lower a nice value it raised, and ``setpriority`` on a
pid reaches only one thread of a multi-threaded agent. Without a cpu controller (the
watchdog backend, ``--agent-limits off``, ``--agent-cpu-weight 0``) refills run at the
normal priority.

:class:`RefillPriority` is the pool's bookkeeping (pure, owned by the pool actor): which of
its children run lowered, bounded by the children it has (each entry is dropped when the
child is raised, exits or fails to start).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from serve.isolation import ChildLimits

log = logging.getLogger(__name__)

#: A refill's CPU weight (cgroup v2 scale, 1-10000; v1 ``cpu.shares`` 10 beside 1024).
REFILL_CPU_WEIGHT: Final = 1


class RefillPriority:
    """The pool's lowered children: child id → its limits (to raise it again)."""

    def __init__(self, normal_weight: int) -> None:
        #: ``--agent-cpu-weight``; 0: no weight is managed, so nothing is ever lowered.
        self.normal_weight = normal_weight
        self._lowered: dict[str, ChildLimits] = {}
        self.raised_total = 0

    @property
    def enabled(self) -> bool:
        return self.normal_weight > 0

    def spawn_weight(self, refill: bool) -> int | None:
        """The weight a new child is spawned with (None: the normal one)."""
        return REFILL_CPU_WEIGHT if refill and self.enabled else None

    def lowered(self, child_id: str, limits: ChildLimits | None) -> None:
        """``child_id`` was spawned lowered (its cgroup has a cpu controller)."""
        if limits is not None and self.enabled and limits.groups:
            self._lowered[child_id] = limits

    def is_lowered(self, child_id: str) -> bool:
        return child_id in self._lowered

    def restore(self, child_id: str) -> None:
        """Back to the normal weight (a session takes it, or waits for it)."""
        limits = self._lowered.pop(child_id, None)
        if limits is not None and limits.set_cpu_weight(self.normal_weight):
            self.raised_total += 1

    def restore_all(self) -> None:
        for child_id in list(self._lowered):
            self.restore(child_id)

    def forget(self, child_id: str) -> None:
        self._lowered.pop(child_id, None)

    def count(self) -> int:
        return len(self._lowered)
