"""The public surface of ``acp`` is pinned, and the scripted agent stays light to start."""

from __future__ import annotations

import subprocess
import sys

import acp

EXPECTED = {
    "DEFAULT_CLIENT_CAPABILITIES",
    "PROTOCOL_VERSION",
    "AcpError",
    "AgentConnection",
    "AgentProcess",
    "BaseClientHandler",
    "ChannelClosed",
    "ClientHandler",
    "ExitInfo",
    "HandlerError",
    "ProtocolError",
    "RemoteError",
    "RequestTimeout",
    "scrub_env",
}


def test_public_names() -> None:
    assert set(acp.__all__) == EXPECTED
    for name in EXPECTED:
        assert getattr(acp, name) is not None
    assert issubclass(acp.ChannelClosed, acp.AcpError)
    assert issubclass(acp.RemoteError, acp.AcpError)
    assert issubclass(acp.RequestTimeout, acp.AcpError)


def test_scripted_agent_imports_neither_trio_nor_the_client() -> None:
    code = (
        "import sys, acp.agents.scripted.agent\n"
        "heavy = [m for m in ('trio', 'acp.client', 'acp.rpc') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
