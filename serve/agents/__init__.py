"""Agent children of a workspace: the pool (warm children, slots, packing).

``pool.py`` is the pool actor; a warm agent is taken in ``slots.py``; one child's start,
watch and stop are ``child.py``; ``memory_budget.py``/``memory.py`` its memory,
``spawn_health.py`` the failures and backoff; ``warm.py`` how much to keep warm (with
``adaptive.py``), ``priority.py`` the spares' CPU weight; ``pool_view.py`` its status,
``exit_charge.py`` a shared child's exit charged once.
"""

from serve.agents.pool import AgentLease, AgentPool

__all__ = ["AgentLease", "AgentPool"]
