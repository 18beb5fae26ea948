"""An agent that writes where its operator told it to, as many real ones do: it appends a
line to ``LOG_DIR/agent.log`` at start, then runs the built-in scripted agent.

Usage: ``python sandbox_logging_agent.py [--late] LOG_DIR``. Under the agents' file sandbox
without ``--agent-allow-write LOG_DIR`` it dies at once with Python's ``PermissionError``
(tests/serve/test_sandbox_grants.py); with ``--late`` it answers ``initialize`` first and
writes half a second later (as agents that open their log lazily do), dying then.
"""

from __future__ import annotations

import os
import runpy
import sys
import threading
import time
import traceback

late = sys.argv[1] == "--late"
log_dir = sys.argv[2] if late else sys.argv[1]


def write_log() -> None:
    with open(os.path.join(log_dir, "agent.log"), "a") as log:
        log.write(f"started {os.getpid()}\n")


def write_later() -> None:
    time.sleep(0.5)
    try:
        write_log()
    except OSError:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


if late:
    threading.Thread(target=write_later, daemon=True).start()
else:
    write_log()
sys.argv = [sys.argv[0]]
runpy.run_module("acp.agents.scripted", run_name="__main__")
