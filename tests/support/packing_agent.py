"""The scripted agent with knobs for the packing-isolation tests.

    python tests/support/packing_agent.py --state-dir DIR [--deaf] [--no-close] [--no-load]
        [--slow-new MS]

``--deaf``: ``session/cancel``, ``$/cancel_request`` and ``session/close`` never stop a
running turn (``[sleep N]`` sleeps its N ms whatever the client says), while the agent keeps
answering every other request, for every session. ``--no-close``: ``initialize`` does not
offer ``sessionCapabilities.close`` and ``session/close`` answers ``-32601``. ``--no-load``:
it offers neither ``session/load`` nor ``session/resume`` (a session cannot be restored).
``--slow-new MS``: every ``session/new`` is answered MS ms after it arrives (as a busy
``qwen --acp`` answers one sent during a turn), and each is counted: one line per request
in ``DIR/new-requests``.
Everything else is :mod:`acp.agents.scripted`.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from acp import jsonrpc
from acp.agents.scripted.agent import _DEFERRED, RpcFailure, ScriptedAgent
from acp.errors import METHOD_NOT_FOUND


class PackingAgent(ScriptedAgent):
    deaf = False
    no_close = False
    no_load = False
    slow_new_s = 0.0
    new_log = ""

    def _on_notification(self, msg: jsonrpc.Notification) -> None:
        if self.deaf and msg.method in ("session/cancel", "$/cancel_request"):
            return
        super()._on_notification(msg)

    def initialize(self, rid: jsonrpc.RequestId, params: dict[str, Any]) -> object:
        result: Any = super().initialize(rid, params)
        if self.no_close:
            result["agentCapabilities"]["sessionCapabilities"].pop("close", None)
        if self.no_load:
            result["agentCapabilities"]["loadSession"] = False
            result["agentCapabilities"]["sessionCapabilities"].pop("resume", None)
        return result

    def close_session(self, rid: jsonrpc.RequestId, params: dict[str, Any]) -> object:
        if self.no_close:
            raise RpcFailure(METHOD_NOT_FOUND, "Method not found", {"method": "session/close"})
        if self.deaf:
            session = self._session(params)
            with self.sessions_lock:
                self.sessions.pop(session.record.session_id, None)
            return {}
        return super().close_session(rid, params)

    def new_session(self, rid: jsonrpc.RequestId, params: dict[str, Any]) -> object:
        if not self.slow_new_s:
            return super().new_session(rid, params)
        with open(self.new_log, "a") as log:
            log.write(f"{rid}\n")
        threading.Timer(self.slow_new_s, super().new_session, (rid, params)).start()
        return _DEFERRED

    METHODS: ClassVar = {
        **ScriptedAgent.METHODS,
        "initialize": initialize,
        "session/new": new_session,
        "session/close": close_session,
    }


def main() -> None:
    args = sys.argv[1:]
    state_dir = os.path.abspath(args[args.index("--state-dir") + 1])
    agent = PackingAgent(state_dir)
    agent.new_log = os.path.join(state_dir, "new-requests")
    os.makedirs(state_dir, exist_ok=True)
    agent.deaf = "--deaf" in args
    agent.no_close = "--no-close" in args
    agent.no_load = "--no-load" in args
    if "--slow-new" in args:
        agent.slow_new_s = int(args[args.index("--slow-new") + 1]) / 1000
    agent.serve(sys.stdin.buffer)


if __name__ == "__main__":
    main()
