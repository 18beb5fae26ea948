"""An agent that writes where its operator told it to, as many real ones do: it appends a
line to ``LOG_DIR/agent.log`` at start, then runs the built-in scripted agent.

Usage: ``python sandbox_logging_agent.py LOG_DIR``. Under the agents' file sandbox without
``--agent-allow-write LOG_DIR`` it dies at once with Python's ``PermissionError``
(tests/serve/test_sandbox_grants.py).
"""

from __future__ import annotations

import os
import runpy
import sys

with open(os.path.join(sys.argv[1], "agent.log"), "a") as log:
    log.write(f"started {os.getpid()}\n")
sys.argv = [sys.argv[0]]
runpy.run_module("acp.agents.scripted", run_name="__main__")
