"""Agent children of a workspace: the pool (warm children, slots, packing)."""

from serve.agents.pool import AgentLease, AgentPool

__all__ = ["AgentLease", "AgentPool"]
