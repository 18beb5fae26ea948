"""The scripted agent with knobs for the packing-isolation tests.

    python tests/support/packing_agent.py --state-dir DIR [--deaf] [--no-close] [--no-load]

``--deaf``: ``session/cancel``, ``$/cancel_request`` and ``session/close`` never stop a
running turn (``[sleep N]`` sleeps its N ms whatever the client says), while the agent keeps
answering every other request, for every session. ``--no-close``: ``initialize`` does not
offer ``sessionCapabilities.close`` and ``session/close`` answers ``-32601``. ``--no-load``:
it offers neither ``session/load`` nor ``session/resume`` (a session cannot be restored).
Everything else is :mod:`acp.agents.scripted`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from acp import jsonrpc
from acp.agents.scripted.agent import RpcFailure, ScriptedAgent
from acp.errors import METHOD_NOT_FOUND


class PackingAgent(ScriptedAgent):
    deaf = False
    no_close = False
    no_load = False

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

    METHODS: ClassVar = {
        **ScriptedAgent.METHODS,
        "initialize": initialize,
        "session/close": close_session,
    }


def main() -> None:
    args = sys.argv[1:]
    agent = PackingAgent(os.path.abspath(args[args.index("--state-dir") + 1]))
    agent.deaf = "--deaf" in args
    agent.no_close = "--no-close" in args
    agent.no_load = "--no-load" in args
    agent.serve(sys.stdin.buffer)


if __name__ == "__main__":
    main()
