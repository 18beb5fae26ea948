"""Registers the McpPool as a root-supervised service (imported by ``serve.http.routes.mcp``).

``build(daemon)`` reads ``--mcp-client-budget`` / ``--mcp-budget-mode`` from the settings and
``QWEN_SERVE_NO_MCP_POOL`` from the environment; the pool's sockets live under
``<state-dir>/mcp-<pid>/``. Route handlers reach the running pool with :func:`pool_of`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from actors import ChildSpec, Restart
from serve.mcp.budget import BudgetPolicy
from serve.mcp.pool import McpPool
from serve.runtime.services import ServiceSpec, register_service

if TYPE_CHECKING:
    from serve.runtime.daemon import Daemon

SERVICE_NAME = "mcp-pool"
NO_POOL_ENV = "QWEN_SERVE_NO_MCP_POOL"


def pooling_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """False when ``QWEN_SERVE_NO_MCP_POOL`` is ``1`` (or ``true``)."""
    value = (os.environ if environ is None else environ).get(NO_POOL_ENV, "")
    return value.strip().lower() not in ("1", "true")


def build(daemon: Daemon) -> tuple[McpPool, ChildSpec]:
    settings = daemon.settings
    mode: Any = settings.mcp_budget_mode
    pool = McpPool(
        workspaces=settings.workspaces,
        policy=BudgetPolicy(settings.mcp_client_budget, mode),
        pooling=pooling_enabled(),
        socket_dir=settings.state_dir,
        sessions_for=lambda workspace: list(daemon.registry.live(workspace)),
    )
    spec = ChildSpec(
        SERVICE_NAME, pool.run, Restart.PERMANENT, shutdown_grace_s=10.0, stop=pool.close
    )
    return pool, spec


def pool_of(daemon: Daemon) -> McpPool | None:
    pool = daemon.services.get(SERVICE_NAME)
    return pool if isinstance(pool, McpPool) else None


register_service(ServiceSpec(SERVICE_NAME, build))
