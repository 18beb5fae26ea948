"""The MCP multiplexer: id rewriting, local answers, cancellation, resets (pure)."""

from __future__ import annotations

import json
from typing import Any

from msgspec import Raw

from serve.mcp.mux import SERVER_UNAVAILABLE, Mux, ToClient, ToPool, ToServer


def line(obj: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **obj}).encode()


def decode(out: ToServer | ToClient) -> dict[str, Any]:
    assert out.line.endswith(b"\n")
    return json.loads(out.line)  # type: ignore[no-any-return]


def ready_mux() -> Mux:
    mux = Mux("docs", roots=[{"uri": "file:///ws", "name": "ws"}])
    mux.init_result = Raw(b'{"protocolVersion":"2025-06-18","serverInfo":{"name":"docs"}}')
    mux.attach(1)
    mux.attach(2)
    return mux


def test_initialize_and_ping_are_answered_locally() -> None:
    mux = ready_mux()
    (out,) = mux.from_client(1, line({"id": 7, "method": "initialize", "params": {}}))
    assert isinstance(out, ToClient) and out.conn == 1
    assert decode(out) == {
        "jsonrpc": "2.0",
        "id": 7,
        "result": {"protocolVersion": "2025-06-18", "serverInfo": {"name": "docs"}},
    }
    (pong,) = mux.from_client(2, line({"id": "p", "method": "ping"}))
    assert isinstance(pong, ToClient) and decode(pong)["result"] == {}
    assert mux.from_client(1, line({"method": "notifications/initialized"})) == []


def test_initialize_before_the_server_is_ready_is_an_error() -> None:
    mux = Mux("docs", roots=[])
    mux.attach(1)
    (out,) = mux.from_client(1, line({"id": 1, "method": "initialize", "params": {}}))
    assert isinstance(out, ToClient)
    assert decode(out)["error"]["code"] == SERVER_UNAVAILABLE


def test_same_ids_from_two_connections_are_routed_back_to_their_owner() -> None:
    mux = ready_mux()
    (up1,) = mux.from_client(1, line({"id": 1, "method": "tools/list", "params": {}}))
    (up2,) = mux.from_client(2, line({"id": 1, "method": "tools/call", "params": {"name": "x"}}))
    assert isinstance(up1, ToServer) and isinstance(up2, ToServer)
    id1, id2 = decode(up1)["id"], decode(up2)["id"]
    assert id1 != id2
    assert decode(up2)["params"] == {"name": "x"}
    assert decode(up1)["params"] == {}
    # Answers come back out of order.
    (back2,) = mux.from_server(line({"id": id2, "result": {"content": []}}))
    (back1,) = mux.from_server(line({"id": id1, "error": {"code": -5, "message": "no"}}))
    assert isinstance(back2, ToClient) and back2.conn == 2
    assert decode(back2) == {"jsonrpc": "2.0", "id": 1, "result": {"content": []}}
    assert isinstance(back1, ToClient) and back1.conn == 1
    assert decode(back1)["id"] == 1 and decode(back1)["error"]["code"] == -5
    assert mux.inflight == 0


def test_string_ids_are_restored_exactly() -> None:
    mux = ready_mux()
    (up,) = mux.from_client(1, line({"id": "abc", "method": "resources/list"}))
    assert isinstance(up, ToServer)
    (back,) = mux.from_server(line({"id": decode(up)["id"], "result": {}}))
    assert isinstance(back, ToClient) and decode(back)["id"] == "abc"


def test_cancel_is_rewritten_and_unknown_cancels_are_dropped() -> None:
    mux = ready_mux()
    (up,) = mux.from_client(1, line({"id": 5, "method": "tools/call", "params": {}}))
    uid = decode(up)["id"]  # type: ignore[arg-type]
    assert (
        mux.from_client(2, line({"method": "notifications/cancelled", "params": {"requestId": 5}}))
        == []
    )
    (cancel,) = mux.from_client(
        1, line({"method": "notifications/cancelled", "params": {"requestId": 5, "reason": "x"}})
    )
    assert isinstance(cancel, ToServer)
    assert decode(cancel)["params"] == {"requestId": uid, "reason": "x"}
    # A late answer to a cancelled request goes nowhere.
    assert mux.from_server(line({"id": uid, "result": {}})) == []


def test_detach_cancels_in_flight_requests_upstream() -> None:
    mux = ready_mux()
    (up,) = mux.from_client(1, line({"id": 1, "method": "tools/call", "params": {}}))
    assert isinstance(up, ToServer)
    mux.from_client(2, line({"id": 1, "method": "tools/call", "params": {}}))
    outs = mux.detach(1)
    assert [decode(o)["params"]["requestId"] for o in outs if isinstance(o, ToServer)] == [
        decode(up)["id"]
    ]
    assert mux.inflight == 1
    assert mux.connections == 1


def test_server_notifications_are_broadcast_and_requests_answered_by_the_pool() -> None:
    mux = ready_mux()
    outs = mux.from_server(line({"method": "notifications/tools/list_changed"}))
    assert sorted(o.conn for o in outs if isinstance(o, ToClient)) == [1, 2]
    (roots,) = mux.from_server(line({"id": "r1", "method": "roots/list"}))
    assert isinstance(roots, ToServer)
    assert decode(roots)["result"] == {"roots": [{"uri": "file:///ws", "name": "ws"}]}
    (ping,) = mux.from_server(line({"id": 9, "method": "ping"}))
    assert isinstance(ping, ToServer) and decode(ping) == {"jsonrpc": "2.0", "id": 9, "result": {}}
    (other,) = mux.from_server(line({"id": 3, "method": "sampling/createMessage"}))
    assert isinstance(other, ToServer) and decode(other)["error"]["code"] == -32601


def test_pool_requests_are_answered_to_the_pool() -> None:
    mux = ready_mux()
    uid, request = mux.pool_request("tools/list", {})
    assert json.loads(request)["id"] == uid
    (out,) = mux.from_server(line({"id": uid, "result": {"tools": []}}))
    assert isinstance(out, ToPool) and out.id == uid
    assert out.response.error is None and json.loads(bytes(out.response.result)) == {"tools": []}


def test_reset_fails_everything_in_flight() -> None:
    mux = ready_mux()
    mux.from_client(1, line({"id": 1, "method": "tools/call", "params": {}}))
    mux.from_client(2, line({"id": "b", "method": "tools/call", "params": {}}))
    uid, _ = mux.pool_request("tools/list", {})
    outs = mux.reset("restarted")
    clients = {o.conn: decode(o) for o in outs if isinstance(o, ToClient)}
    assert clients[1]["id"] == 1 and clients[2]["id"] == "b"
    assert all(c["error"]["code"] == SERVER_UNAVAILABLE for c in clients.values())
    assert "restarted" in clients[1]["error"]["message"]
    (pool,) = [o for o in outs if isinstance(o, ToPool)]
    assert pool.id == uid and pool.response.error is not None
    assert mux.inflight == 0 and mux.init_result is None


def test_in_flight_table_is_bounded() -> None:
    mux = Mux("docs", roots=[], max_inflight=2)
    mux.init_result = Raw(b"{}")
    mux.attach(1)
    for i in range(2):
        (out,) = mux.from_client(1, line({"id": i, "method": "tools/call"}))
        assert isinstance(out, ToServer)
    (refused,) = mux.from_client(1, line({"id": 99, "method": "tools/call"}))
    assert isinstance(refused, ToClient)
    assert decode(refused)["error"]["code"] == SERVER_UNAVAILABLE


def test_garbage_is_answered_when_it_has_an_id_and_ignored_otherwise() -> None:
    mux = ready_mux()
    assert mux.from_client(1, b"{not json") == []
    (out,) = mux.from_client(1, b'{"jsonrpc":"2.0","id":4}')
    assert isinstance(out, ToClient) and decode(out)["id"] == 4
    assert mux.from_server(b"{not json") == []
    # Answers from a client to nothing are dropped.
    assert mux.from_client(1, line({"id": 1, "result": {}})) == []
