"""The MCP multiplexer: many agent connections over one stdio MCP server (sans-IO).

Theory of operation
-------------------
A pooled MCP server process is shared by every agent of its workspace. Each agent reaches
it through the bridge (:mod:`serve.mcp.bridge`), one *connection* per agent-side MCP
client. JSON-RPC ids are per connection, so two agents may both send id ``1``; the mux
gives every forwarded request a fresh upstream id and remembers ``(conn, original id)``
to route the answer back with the original id restored.

The server was initialized once, by the pool (:meth:`Mux.pool_request`); a connection's
``initialize`` is answered locally from that cached result, and its
``notifications/initialized`` is swallowed. ``ping`` is answered locally too.

======================  =====================================================
from a connection       action
======================  =====================================================
request initialize      answer from the cached InitializeResult (error if none)
request ping            answer ``{}``
other request           forward with a fresh upstream id (bounded in-flight table)
notification            forward; ``notifications/cancelled`` gets its id rewritten
                        (unknown ids are dropped); ``initialized`` is swallowed
response                dropped (server requests are never sent to connections)
======================  =====================================================

======================  =====================================================
from the server         action
======================  =====================================================
response                to the connection that asked (original id), or to the pool
request                 answered by the pool: ``ping`` → ``{}``, ``roots/list`` → the
                        workspace root, anything else → -32601
notification            broadcast to every attached connection
======================  =====================================================

When the server process goes away, :meth:`Mux.reset` answers every in-flight request
with an error naming the server, so no agent waits forever. A connection that detaches
gets its in-flight requests cancelled upstream. Outputs are returned as values
(:class:`ToServer`, :class:`ToClient`, :class:`ToPool`); the I/O layer delivers them.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from msgspec import Raw

from acp.errors import INTERNAL_ERROR, METHOD_NOT_FOUND
from acp.jsonrpc import (
    EMPTY,
    NULL,
    ErrorObject,
    Invalid,
    Notification,
    Request,
    RequestId,
    Response,
    encode_error,
    encode_notification,
    encode_request,
    encode_result,
    parse_line,
)

SERVER_UNAVAILABLE: Final = -32000
DEFAULT_MAX_INFLIGHT: Final = 4096


class ToServer(msgspec.Struct, frozen=True):
    line: bytes


class ToClient(msgspec.Struct, frozen=True):
    conn: int
    line: bytes


class ToPool(msgspec.Struct, frozen=True):
    """The answer to one of the pool's own requests."""

    id: int
    response: Response


Out = ToServer | ToClient | ToPool


class _Cancelled(msgspec.Struct, frozen=True):
    requestId: RequestId
    reason: str | None = None


_cancelled_decoder: Final = msgspec.json.Decoder(_Cancelled)


def _params(raw: Raw) -> Raw | None:
    """Absent or ``null`` params are forwarded as ``{}``."""
    return None if raw == NULL or not raw else raw


class Mux:
    """Routing state of one pooled server; lives as long as the pool entry."""

    def __init__(
        self, server_name: str, *, roots: list[dict[str, Any]], max_inflight: int = 0
    ) -> None:
        self.server_name = server_name
        self.roots = roots
        self.max_inflight = max_inflight or DEFAULT_MAX_INFLIGHT
        #: The server's raw InitializeResult for the current incarnation.
        self.init_result: Raw | None = None
        self._next_id = 1
        self._inflight: dict[int, tuple[int, RequestId]] = {}
        self._pool_pending: set[int] = set()
        self._conns: set[int] = set()

    # ---- observation ---------------------------------------------------------------------

    @property
    def connections(self) -> int:
        return len(self._conns)

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    # ---- connections ---------------------------------------------------------------------

    def attach(self, conn: int) -> None:
        self._conns.add(conn)

    def detach(self, conn: int) -> list[Out]:
        """Forget ``conn``; cancel its in-flight requests upstream."""
        self._conns.discard(conn)
        out: list[Out] = []
        for uid, (owner, _) in list(self._inflight.items()):
            if owner == conn:
                del self._inflight[uid]
                params = {"requestId": uid, "reason": "client disconnected"}
                out.append(ToServer(encode_notification("notifications/cancelled", params)))
        return out

    # ---- the pool's own requests ---------------------------------------------------------

    def pool_request(self, method: str, params: dict[str, Any]) -> tuple[int, bytes]:
        uid = self._allocate()
        self._pool_pending.add(uid)
        return uid, encode_request(uid, method, params)

    def _allocate(self) -> int:
        uid = self._next_id
        self._next_id += 1
        return uid

    # ---- traffic -------------------------------------------------------------------------

    def from_client(self, conn: int, line: bytes) -> list[Out]:
        msg = parse_line(line)
        match msg:
            case Request(id=rid, method="initialize"):
                if self.init_result is None:
                    return [self._client_error(conn, rid, "is not ready")]
                return [ToClient(conn, encode_result(rid, self.init_result))]
            case Request(id=rid, method="ping"):
                return [ToClient(conn, encode_result(rid, {}))]
            case Request(id=rid, method=method, params=params):
                if len(self._inflight) >= self.max_inflight:
                    return [self._client_error(conn, rid, "has too many requests in flight")]
                uid = self._allocate()
                self._inflight[uid] = (conn, rid)
                return [ToServer(encode_request(uid, method, _params(params)))]
            case Notification(method="notifications/initialized"):
                return []
            case Notification(method="notifications/cancelled", params=params):
                return self._client_cancel(conn, params)
            case Notification(method=method, params=params):
                return [ToServer(encode_notification(method, _params(params)))]
            case Invalid(code=code, reason=reason, id=rid) if isinstance(rid, int | str):
                return [ToClient(conn, encode_error(rid, code, reason))]
            case _:
                return []

    def _client_cancel(self, conn: int, params: Raw) -> list[Out]:
        try:
            cancel = _cancelled_decoder.decode(params)
        except msgspec.DecodeError:
            return []
        for uid, (owner, rid) in self._inflight.items():
            if owner == conn and rid == cancel.requestId:
                del self._inflight[uid]
                body: dict[str, Any] = {"requestId": uid}
                if cancel.reason is not None:
                    body["reason"] = cancel.reason
                return [ToServer(encode_notification("notifications/cancelled", body))]
        return []

    def _client_error(self, conn: int, rid: RequestId, what: str) -> ToClient:
        message = f"MCP server {self.server_name!r} {what}"
        return ToClient(conn, encode_error(rid, SERVER_UNAVAILABLE, message))

    def from_server(self, line: bytes) -> list[Out]:
        msg = parse_line(line)
        match msg:
            case Response(id=uid):
                if isinstance(uid, int) and uid in self._pool_pending:
                    self._pool_pending.discard(uid)
                    return [ToPool(uid, msg)]
                route = self._inflight.pop(uid, None) if isinstance(uid, int) else None
                if route is None:
                    return []
                conn, rid = route
                if conn not in self._conns:
                    return []
                if msg.error is not None:
                    err = msg.error
                    return [ToClient(conn, encode_error(rid, err.code, err.message, err.data))]
                return [ToClient(conn, encode_result(rid, msg.result))]
            case Request(id=rid, method="ping"):
                return [ToServer(encode_result(rid, {}))]
            case Request(id=rid, method="roots/list"):
                return [ToServer(encode_result(rid, {"roots": self.roots}))]
            case Request(id=rid, method=method):
                text = f"{method} is not supported by the shared MCP pool"
                return [ToServer(encode_error(rid, METHOD_NOT_FOUND, text))]
            case Notification():
                return [ToClient(conn, line + b"\n") for conn in sorted(self._conns)]
            case _:
                return []

    def reset(self, reason: str) -> list[Out]:
        """The server went away: fail everything in flight (connections and pool)."""
        out: list[Out] = []
        message = f"MCP server {self.server_name!r} {reason}"
        for conn, rid in self._inflight.values():
            if conn in self._conns:
                out.append(ToClient(conn, encode_error(rid, SERVER_UNAVAILABLE, message)))
        self._inflight.clear()
        for uid in sorted(self._pool_pending):
            error = ErrorObject(code=INTERNAL_ERROR, message=message)
            out.append(ToPool(uid, Response(uid, EMPTY, error)))
        self._pool_pending.clear()
        self.init_result = None
        return out
