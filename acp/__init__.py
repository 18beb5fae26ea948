"""ACP (Agent Client Protocol, v1) for acp-serve: the client side of agents run as children.

Layering (each module's docstring gives its theory of operation)::

    errors    exception tree and JSON-RPC error codes
    jsonrpc   sans-IO: line framing, envelopes with raw payloads, encoders
    schema    frozen msgspec Structs for ACP v1 (schema 1.21); lenient decoding of agent output
    process   one agent child: own process group, stderr tail, exit info, stop by escalation
    telemetry the tracing facade: spans, a no-op until serve.telemetry installs OpenTelemetry
    rpc       a JSON-RPC peer over two byte streams: reader, writer, pending calls, handlers
    terminal  client-side terminals (real processes, bounded output)
    handler   the ClientHandler interface and BaseClientHandler defaults
    client    AgentConnection: spawn + handshake + typed session calls
    agents/   the scripted reference agent (``python -m acp.agents.scripted``)

Nothing here knows about HTTP. The public names below are imported lazily, so that
``python -m acp.agents.scripted`` (which needs only msgspec) starts without importing trio.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from acp.client import DEFAULT_CLIENT_CAPABILITIES, AgentConnection
    from acp.errors import (
        AcpError,
        ChannelClosed,
        HandlerError,
        ProtocolError,
        RemoteError,
        RequestTimeout,
    )
    from acp.handler import BaseClientHandler, ClientHandler
    from acp.process import AgentProcess, ExitInfo, scrub_env
    from acp.schema import PROTOCOL_VERSION

_EXPORTS = {
    "DEFAULT_CLIENT_CAPABILITIES": "acp.client",
    "AgentConnection": "acp.client",
    "AcpError": "acp.errors",
    "ChannelClosed": "acp.errors",
    "HandlerError": "acp.errors",
    "ProtocolError": "acp.errors",
    "RemoteError": "acp.errors",
    "RequestTimeout": "acp.errors",
    "BaseClientHandler": "acp.handler",
    "ClientHandler": "acp.handler",
    "AgentProcess": "acp.process",
    "ExitInfo": "acp.process",
    "scrub_env": "acp.process",
    "PROTOCOL_VERSION": "acp.schema",
}

__all__ = [
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
]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'acp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
