"""A pool's memory: each child's PSS, sampled, and the ``--agent-memory-budget-mb`` arithmetic.

Sampling: :func:`sample_memory` (a task in the pool's nursery) measures each child's PSS
(its process tree, ``/proc/<pid>/smaps_rollup``, :func:`serve.agents.memory.measure_trees`
in a worker thread) every :data:`SAMPLE_S` (:data:`SAMPLE_BUDGET_S` with a budget; an idle
spare only every :data:`IDLE_SAMPLE_EVERY`-th round) and reports it to the pool actor. With a
budget each child is also measured right after ``initialize`` (:func:`measure_one`), before
the pool counts it.

Budget (:class:`MemoryBudget`, pure, owned by the pool actor): a new child is assumed to
cost as much as the largest child measured so far; before any child was measured the cost
is unknown, so only one child is spawned at a time until the first one is measured (callers
wait for it; none is refused or released for an unknown cost). When spawning one would pass
the budget (stopping children do not count), the warm refill waits, and a caller that needs
a child makes the pool first ask the workspace runtime to release the least recently used
idle session (its agent is let go as with idle release, ``agent_released {reason:
"memory_budget"}``); when nothing can be released the caller gets
:class:`~serve.sessions.errors.MemoryBudgetExceeded` (``503 memory_budget_exceeded`` with
``Retry-After``). Per-child memory is in ``/daemon/status``
(``runtime.agents[].children[].pssKiB``) and ``/metrics`` (``acp_serve_agent_pss_bytes``).

The adaptive warm pool also stays below the agents' memory ceiling
(:meth:`MemoryBudget.fits_ceiling`, :mod:`serve.isolation`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

import trio

from serve.agents.child import AgentChild
from serve.agents.memory import measure_trees
from serve.isolation import Isolation
from serve.sessions.errors import MemoryBudgetExceeded

#: Memory sampling period without / with a budget (seconds).
SAMPLE_S: Final = 5.0
SAMPLE_BUDGET_S: Final = 1.0
#: An idle (untaken) spare is measured once, then every this many sampling rounds.
IDLE_SAMPLE_EVERY: Final = 12


class MemoryBudget:
    """The measured PSS of a pool's children against ``--agent-memory-budget-mb``."""

    def __init__(self, budget_mb: int) -> None:
        self.kib = budget_mb * 1024  # 0: no budget
        #: child id -> its last measured PSS (KiB).
        self.pss_kib: dict[str, int] = {}
        self.largest_kib = 0  # the largest child measured: what a new one is assumed to cost
        #: A release of an idle session is under way (one at a time).
        self.making_room = False
        self.refusals = 0
        self.releases = 0

    def measured(self, child_id: str, kib: int) -> None:
        self.pss_kib[child_id] = kib
        self.largest_kib = max(self.largest_kib, kib)

    def forget(self, child_id: str) -> None:
        self.pss_kib.pop(child_id, None)

    def used_kib(self, children: Iterable[AgentChild], spawning: int) -> int:
        """Measured PSS of the live children plus the assumed cost of spawns in flight."""
        live = sum(self.pss_kib.get(c.id, self.largest_kib) for c in children if not c.stopping)
        return live + spawning * self.largest_kib

    def in_use_kib(self, children: Iterable[AgentChild]) -> int:
        """Measured PSS of the live children (the unmeasured count 0)."""
        return sum(self.pss_kib.get(c.id, 0) for c in children if not c.stopping)

    def cost_unknown(self) -> bool:
        """With a budget, before any child was measured: spawns go one at a time."""
        return bool(self.kib) and not self.largest_kib

    def fits_new_child(self, children: Iterable[AgentChild], spawning: int) -> bool:
        if not self.kib:
            return True
        if self.cost_unknown():
            return spawning == 0
        return self.used_kib(children, spawning) + self.largest_kib <= self.kib

    def error(self, children: Iterable[AgentChild], spawning: int) -> MemoryBudgetExceeded:
        used_mb = round(self.used_kib(children, spawning) / 1024)
        return MemoryBudgetExceeded(
            f"Agent memory budget exceeded ({used_mb} of {self.kib // 1024} MiB in "
            "use) and no idle session can be released",
            "memory_budget_exceeded",
            budgetMb=self.kib // 1024,
            usedMb=used_mb,
        )

    def fits_ceiling(self, isolation: Isolation | None, spawning: int) -> bool:
        """Room below the agents' memory ceiling for one more child of the largest size
        measured (an unknown size: no child beyond the minimum)."""
        room = isolation.ceiling_room_bytes() if isolation is not None else None
        if room is None:
            return True
        largest = self.largest_kib * 1024
        return bool(largest) and room - spawning * largest >= largest


async def measure_one(pid: int) -> int:
    """One child's PSS (KiB; 0: gone) in a worker thread (one ``/proc`` scan)."""
    measured = await trio.to_thread.run_sync(measure_trees, [pid])
    return measured.get(pid, 0)


async def sample_memory(
    budget: MemoryBudget,
    children: Callable[[], Iterable[AgentChild]],
    report: Callable[[dict[str, int]], None],
) -> None:
    """Forever: measure the live ``children()`` and ``report`` child id → KiB."""
    period = SAMPLE_BUDGET_S if budget.kib else SAMPLE_S
    rounds = 0
    while True:
        # An idle spare is measured every IDLE_SAMPLE_EVERY-th round only: reading a
        # node child's smaps_rollup costs ~10 ms of CPU (a page-table walk under its
        # mmap lock) and an untaken child hardly changes; a taken one every round.
        rounds += 1
        pids = {
            c.id: c.pid
            for c in children()
            if not c.stopping
            and (c.used or c.id not in budget.pss_kib or rounds % IDLE_SAMPLE_EVERY == 0)
        }
        if pids:
            by_pid = await trio.to_thread.run_sync(measure_trees, list(pids.values()))
            report({cid: by_pid.get(pid, 0) for cid, pid in pids.items()})
        await trio.sleep(period)
