"""What ``/daemon/status`` shows of an agent pool: its children, warm capacity and health.

A read model, apart from the actor: it changes with what operators need to see (the
status document under ``runtime.agents[]``), not with how the pool decides. It reads the
pool's state on the pool's own task (the status route asks through the runtime); it never
changes it.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any, Protocol

import trio

from serve.agents.child import AgentChild
from serve.agents.memory_budget import MemoryBudget
from serve.agents.priority import RefillPriority
from serve.agents.slots import Slots
from serve.agents.spawn_health import SpawnHealth
from serve.agents.warm import WarmPolicy

__all__ = ["PoolState", "pool_status"]


class PoolState(Protocol):
    """What the read model reads of a pool (:class:`~serve.agents.pool.AgentPool`)."""

    workspace: str
    warm: WarmPolicy
    priority: RefillPriority
    per_agent: int
    slots: Slots
    children: dict[str, AgentChild]
    spawning: int
    spawned_total: int
    exited_total: int
    budget: MemoryBudget
    health: SpawnHealth

    def others(self, besides: AgentChild | None = None) -> int: ...

    def warm_count(self) -> int: ...


def _state(pool: PoolState, child: AgentChild) -> str:
    if child.stopping:
        return "stopping"
    if not child.slots:
        return "warm"
    return "full" if pool.slots.free(child) == 0 else "shared"


def _child(pool: PoolState, child: AgentChild) -> dict[str, Any]:
    return {
        "id": child.id,
        "pid": child.pid,
        "state": _state(pool, child),
        "sessions": sum(1 for sid in child.slots.values() if sid),
        "primed": child.primed is not None,
        "closesSessions": child.conn.info is not None and child.conn.info.supports_close,
        "deadSessions": child.dead,
        # oversized lines naming no session on it (acp/mux.py; logged, not reported)
        "unattributedDroppedLines": child.mux.unattributed_drops,
        "slots": pool.per_agent,
        "readyAt": _iso(child.ready_at),
        "pssKiB": pool.budget.pss_kib.get(child.id),
        "limits": child.limits.usage() if child.limits is not None else None,
    }


def pool_status(pool: PoolState) -> dict[str, Any]:
    """The pool's entry in ``runtime.agents[]``."""
    health = pool.health
    out: dict[str, Any] = {
        "workspaceCwd": pool.workspace,
        "warmTarget": pool.warm.minimum,
        # the adaptive pool: the most spares, and how many it keeps now (adaptive.py)
        "warmMax": pool.warm.maximum,
        "warmWanted": pool.warm.wanted(trio.current_time(), pool.others()),
        # packed: a spare child once every child is full (warm.py)
        "packedSpare": pool.warm.packed_spare,
        # children spawned ahead of need still at the refill CPU weight (priority.py)
        "lowPriority": pool.priority.count(),
        "sessionsPerAgent": pool.per_agent,
        # what happens to a session the agent cannot close (no session/close): it keeps
        # its slot, and a child holding only such sessions is stopped
        "withoutSessionClose": "recycle",
        "warm": pool.warm_count(),
        "spawning": pool.spawning,
        "waiting": len(pool.slots.waiters),
        "failing": health.failing,
        "consecutiveFailures": health.failures,
        "spawnedTotal": pool.spawned_total,
        "exitedTotal": pool.exited_total,
        "memoryBudgetMb": pool.budget.kib // 1024 or None,
        "memoryUsedKiB": pool.budget.in_use_kib(pool.children.values()),
        "budgetReleases": pool.budget.releases,
        "budgetRefusals": pool.budget.refusals,
        "children": [_child(pool, c) for c in pool.children.values()],
    }
    if health.last_error is not None:
        out["lastError"] = health.last_error
        out["lastErrorAt"] = _iso(health.last_error_at or time.time())
    return out


def _iso(epoch_s: float) -> str:
    moment = datetime.fromtimestamp(epoch_s, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
