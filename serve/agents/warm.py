"""The warm policy: how much capacity an agent pool keeps ahead of need, and what it retires.

This is the pool's one policy decision, kept apart from the actor that carries it out
(:class:`~serve.agents.pool.AgentPool` spawns and stops; this module only answers numbers
and choices, pure logic, no trio, no processes). It changes for its own reasons (memory
against the latency of the next create), and each mode has its own rule:

* **Isolation** (``--sessions-per-agent 1``): ``--warm-agents`` idle children, more while
  sessions keep arriving (:class:`~serve.agents.adaptive.WarmSizer`: arrival rate × spawn
  time, up to ``--warm-agents-max``); spares beyond the wanted number are retired, the
  newest first, once arrivals paused.
* **Packed** (``M > 1``): the free slots of live children are the warm capacity. While the
  pool has no child, it keeps ``--warm-agents`` children ahead (the first create does not
  wait a whole agent start). Once it has one, it spawns a *spare child* for a full one only
  with ``--packed-spare``: a spare is a whole agent (a ``qwen --acp`` is about 215 MiB) and
  a packed pool is chosen for its memory, so by default the create that finds every child
  full starts the next child itself, as the first create of ``qwen serve`` does.

"Rooms" are children (live or being spawned) with a free slot once the waiting callers are
served (:meth:`~serve.agents.slots.Slots.rooms_after_waiters`); "others" are the children,
live or being spawned, besides the one a decision is about.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from serve.agents.adaptive import WarmSizer

if TYPE_CHECKING:
    from serve.agents.child import AgentChild

__all__ = ["WarmPolicy"]


class WarmPolicy:
    """What one pool keeps warm (see the module docstring)."""

    def __init__(
        self, minimum: int, maximum: int, per_agent: int, *, packed_spare: bool = False
    ) -> None:
        self.minimum = minimum
        self.per_agent = per_agent
        self.packed_spare = packed_spare
        self.sizer = WarmSizer(minimum, maximum)

    @property
    def adaptive(self) -> bool:
        """Isolation above the minimum: the number of spares follows the arrivals."""
        return self.sizer.adaptive and self.per_agent == 1

    @property
    def maximum(self) -> int:
        return self.sizer.maximum if self.per_agent == 1 else self.minimum

    def floor(self, others: int) -> int:
        """Rooms to keep whatever the arrivals: ``--warm-agents``, except that a packed
        pool with a child already spawns no spare unless ``--packed-spare``."""
        if self.per_agent > 1 and others > 0 and not self.packed_spare:
            return 0
        return self.minimum

    def wanted(self, now: float, others: int) -> int:
        """Rooms to keep at ``now`` (the adaptive size in isolation)."""
        if self.adaptive:
            return max(self.floor(others), self.sizer.wanted(now))
        return self.floor(others)

    def keeps_empty(self, rooms_besides: int, others: int, now: float) -> bool:
        """Whether a child left without sessions stays as warm capacity: only while the
        other children's rooms fall short of what is wanted."""
        return rooms_besides < self.wanted(now, others)

    def retire(self, now: float, spare: int, children: Iterable[AgentChild]) -> list[AgentChild]:
        """Isolation spares beyond the wanted number, the newest first, once arrivals
        paused (an adaptive pool only; ``children`` oldest first)."""
        if not self.adaptive or not self.sizer.quiet(now):
            return []
        wanted = self.sizer.wanted(now)
        out: list[AgentChild] = []
        for child in reversed(list(children)):
            if spare <= wanted:
                break
            if child.slots or child.used or child.stopping or child.conn.closed:
                continue
            out.append(child)
            spare -= 1
        return out
