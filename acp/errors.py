"""Exceptions raised by the ACP layer, and the JSON-RPC error codes they map to.

The tree says who failed (in the manner of trio's ``ClosedResourceError`` vs
``BrokenResourceError``)::

    AcpError                      base of everything raised by ``acp``
    ├── RemoteError               the *agent* answered a call with a JSON-RPC error object
    │                             (``code``, ``message``, ``data`` kept verbatim)
    ├── ChannelClosed             the connection is gone: the agent exited, closed its stdout,
    │                             or we closed it. Every pending call and every later call gets
    │                             this; ``exit`` carries the child's exit info when known.
    ├── RequestTimeout            a call got no answer within its deadline (``method``,
    │                             ``timeout_s``); the connection itself is still usable.
    ├── ProtocolError             the agent violated ACP in a way the caller must see (a result
    │                             that does not decode, an unsupported protocol version).
    └── HandlerError              raised by *our* client-side handlers to answer an agent->client
                                  request with a specific JSON-RPC error (``code``, ``message``,
                                  ``data``); anything else a handler raises becomes -32603.

Error codes are the JSON-RPC / ACP ones (``schema/v1`` ``ErrorCode``); they are mapped to
wire errors in exactly one place, :func:`acp.jsonrpc.encode_error`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from acp.process import ExitInfo

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REQUEST_CANCELLED = -32800
AUTH_REQUIRED = -32000
RESOURCE_NOT_FOUND = -32002


class AcpError(Exception):
    """Base class of every exception raised by the ``acp`` package."""


class RemoteError(AcpError):
    """The agent answered our request with a JSON-RPC error object."""

    def __init__(self, code: int, message: str, data: object | None = None, *, method: str = ""):
        self.code = code
        self.message = message
        self.data = data
        self.method = method
        where = f" to {method}" if method else ""
        super().__init__(f"agent answered{where} with error {code}: {message}")


class ChannelClosed(AcpError):
    """The connection to the agent is closed; no answer will ever come."""

    def __init__(self, reason: str, exit: ExitInfo | None = None):
        self.reason = reason
        self.exit = exit
        detail = f" ({exit.describe()})" if exit is not None else ""
        super().__init__(f"ACP channel closed: {reason}{detail}")


class RequestTimeout(AcpError):
    """No answer to ``method`` within ``timeout_s`` seconds (the agent may still be alive)."""

    def __init__(self, method: str, timeout_s: float):
        self.method = method
        self.timeout_s = timeout_s
        super().__init__(f"agent did not answer {method} within {timeout_s:g} s")


class ProtocolError(AcpError):
    """The agent sent something that violates ACP where we cannot be lenient."""


class HandlerError(AcpError):
    """Raised by a client-side handler to answer an agent request with this JSON-RPC error."""

    def __init__(self, code: int, message: str, data: object | None = None):
        self.code = code
        self.message = message
        self.data = data
        super().__init__(f"{code}: {message}")


def method_not_found(method: str) -> HandlerError:
    """The standard answer to a request we do not implement (vendor extensions included)."""
    return HandlerError(METHOD_NOT_FOUND, "Method not found", {"method": method})
