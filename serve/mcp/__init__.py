"""MCP servers of the workspaces: configuration, budgets, the shared pool, the bridge.

Layers (each module's docstring has the details):

* :mod:`serve.mcp.config` — ``.qwen/settings.json`` ``mcpServers`` → typed entries, and
  the ACP ``McpServer`` hand-out shape (pure);
* :mod:`serve.mcp.budget` — admission in declaration order, the 75 %/37.5 % warning
  latch, the status cell (pure);
* :mod:`serve.mcp.mux` — many agent connections over one stdio server (pure);
* :mod:`serve.mcp.server` — one pooled server: socket, mux, supervised process;
* :mod:`serve.mcp.pool` — the :class:`McpPool` actor;
* :mod:`serve.mcp.bridge` — the stdlib-only script agents run to reach a pooled server;
* :mod:`serve.mcp.service` — registration under the root supervisor.

Importing this package does not register the service; :mod:`serve.http.routes.mcp` imports
:mod:`serve.mcp.service`, which does.
"""

from serve.mcp.budget import BudgetPolicy
from serve.mcp.config import McpConfig, McpServerConfig, acp_server, load_config
from serve.mcp.pool import McpPool, McpRestartFailed, McpServerNotFound

__all__ = [
    "BudgetPolicy",
    "McpConfig",
    "McpPool",
    "McpRestartFailed",
    "McpServerConfig",
    "McpServerNotFound",
    "acp_server",
    "load_config",
]
