"""Builds the McpPool and the ChildSpec that runs it under the root supervisor.

``build(settings, sessions_for)`` reads ``--mcp-client-budget`` / ``--mcp-budget-mode`` from the
settings and ``QWEN_SERVE_NO_MCP_POOL`` from the environment; the pool's sockets live under
``<state-dir>/mcp-<pid>/``. The Host builder (:mod:`serve.runtime.build`) calls it; routes
reach the running pool as ``host.mcp_pool``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from actors import ChildSpec, Mailbox, Restart
from serve.events.messages import PublishEvent
from serve.mcp.budget import BudgetMode, BudgetPolicy
from serve.mcp.pool import McpPool

if TYPE_CHECKING:
    from serve.settings import Settings

SERVICE_NAME = "mcp-pool"
NO_POOL_ENV = "QWEN_SERVE_NO_MCP_POOL"


def pooling_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """False when ``QWEN_SERVE_NO_MCP_POOL`` is ``1`` (or ``true``)."""
    value = (os.environ if environ is None else environ).get(NO_POOL_ENV, "")
    return value.strip().lower() not in ("1", "true")


def build(
    settings: Settings, sessions_for: Callable[[str], Sequence[Mailbox[PublishEvent]]]
) -> tuple[McpPool, ChildSpec]:
    """The pool and its ChildSpec; ``sessions_for(workspace)`` lists its live sessions (the
    actors it publishes events to: it needs no more of a session)."""
    # The flag parser accepts only BudgetMode's values; Settings keeps the string.
    mode: BudgetMode = settings.mcp_budget_mode  # type: ignore[assignment]
    pool = McpPool(
        workspaces=settings.workspaces,
        policy=BudgetPolicy(settings.mcp_client_budget, mode),
        pooling=pooling_enabled(),
        socket_dir=settings.state_dir,
        sessions_for=sessions_for,
    )
    spec = ChildSpec(
        SERVICE_NAME, pool.run, Restart.PERMANENT, shutdown_grace_s=10.0, stop=pool.close
    )
    return pool, spec
