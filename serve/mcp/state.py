"""The MCP pool's state of one workspace, and its budget arithmetic (pure).

:class:`WorkspaceMcp` is what :class:`serve.mcp.pool.McpPool` knows of one workspace: the
configuration last read, whether its first discovery pass ran (``activated``) or runs
(``in_progress``), its pooled servers (:class:`~serve.mcp.server.PoolEntry` by name), its
warning latch, the lock that serialises its passes and restarts, and which stdio commands
the operator vouched for (``trusted``; the pool's trust rule, see its module docstring).
Mutated only by the pool actor's handlers and tasks (one trio thread); read by the
snapshot (:mod:`serve.mcp.snapshot`).

:func:`admission_sets` applies the budget policy to a configuration;
:func:`counts` is the ``(live, reserved)`` pair of a workspace's budget scope.
"""

from __future__ import annotations

import trio

from actors import Mailbox
from serve.events.messages import PublishEvent
from serve.mcp.budget import BudgetPolicy, WarningLatch, admit
from serve.mcp.config import McpConfig, McpServerConfig
from serve.mcp.server import PoolEntry


class WorkspaceMcp:
    """Per-workspace state; mutated only by the actor's handlers and tasks (one thread)."""

    def __init__(self, path: str, index: int) -> None:
        self.path = path
        self.index = index
        self.config: McpConfig | None = None
        self.activated = False
        self.in_progress = False
        self.entries: dict[str, PoolEntry] = {}
        self.latch = WarningLatch()
        self.lock = trio.Lock()
        #: Who else gets the events of the pass under way (the session being created).
        self.joining: list[Mailbox[PublishEvent]] = []
        self.restarting: set[str] = set()
        self.session_counts = (0, 0)
        self.serial = 0
        #: The stdio servers the operator vouched for (module docstring: trust), by name.
        self.trusted: dict[str, McpServerConfig] = {}
        #: The untrusted configs already reported (one event per distinct config).
        self.reported: dict[str, McpServerConfig] = {}


def admission_sets(
    config: McpConfig, policy: BudgetPolicy
) -> tuple[list[McpServerConfig], set[str], set[str]]:
    usable = [s for s in config.servers if s.usable]
    admission = admit([s.name for s in usable], policy)
    return usable, set(admission.admitted), set(admission.refused)


def counts(ws: WorkspaceMcp, policy: BudgetPolicy, pooling: bool) -> tuple[int, int]:
    """``(live, reserved)`` for the workspace's budget scope."""
    if not pooling:
        return ws.session_counts
    if ws.config is None or not (ws.activated or ws.in_progress):
        return 0, 0
    usable, admitted, _ = admission_sets(ws.config, policy)
    remote = sum(1 for s in usable if s.transport != "stdio" and s.name in admitted)
    live = remote + sum(1 for e in ws.entries.values() if e.live)
    reserved = remote + sum(1 for e in ws.entries.values() if e.reserved)
    return live, reserved
