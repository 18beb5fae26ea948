"""Workspace status snapshots behind the workspace routes.

Sans-HTTP where it can be (the routes in :mod:`serve.http.routes.workspace`,
:mod:`serve.http.routes.status` and :mod:`serve.http.routes.memory_settings` parse, call,
encode):

* :mod:`.env`           ``GET /workspace/env`` cells from an environment mapping (pure;
                        secrets as presence only, proxies stripped to ``host:port``);
* :mod:`.preflight`     ``GET /workspace/preflight`` cells (daemon-local probes, cached);
* :mod:`.agent`         snapshots of what a live agent advertised (providers, context,
                        supported commands, agent-local preflight cells);
* :mod:`.mcp`           ``GET /workspace/mcp`` from the configured ``mcpServers`` (pure);
* :mod:`.skills`        project skills under ``.qwen/skills`` (names and descriptions);
* :mod:`.init`          ``POST /workspace/init`` (the memory file);

Nothing here writes the settings file (that is :mod:`serve.workspaces.state.settings_file`),
and nothing here spawns an agent: with no live session the agent-derived parts say
``initialized: false`` / ``not_started``.
"""
