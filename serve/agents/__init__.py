"""Agent children of a workspace: the pool (warm children, slots, packing).

``pool.py`` is the pool actor; a warm agent is taken in ``slots.py``; one child's start,
watch and stop are ``child.py``; ``budget.py``/``memory.py`` its memory, ``spawn_health.py`` the
failures and backoff, ``adaptive.py``/``priority.py`` the spares' number and CPU weight.
"""

from serve.agents.pool import AgentLease, AgentPool

__all__ = ["AgentLease", "AgentPool"]
