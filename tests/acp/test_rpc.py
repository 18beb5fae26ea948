"""RpcChannel over real OS pipes, with the test playing the agent byte by byte."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import trio

from acp import jsonrpc
from acp.errors import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    REQUEST_CANCELLED,
    ChannelClosed,
    HandlerError,
    RemoteError,
    RequestTimeout,
    method_not_found,
)
from acp.rpc import RpcChannel
from tests.acp.util import eventually


class Recorder:
    """Dispatcher: records notifications; requests are served by per-method coroutines."""

    def __init__(self) -> None:
        self.notifications: list[tuple[str, bytes]] = []
        self.release = trio.Event()
        self.started: list[str] = []

    def on_notification(self, method: str, params: msgspec.Raw) -> None:
        self.notifications.append((method, bytes(params)))

    async def on_request(self, method: str, params: msgspec.Raw) -> object:
        self.started.append(method)
        if method == "echo":
            return msgspec.json.decode(params)
        if method == "slow":
            await self.release.wait()
            return {"slow": True}
        if method == "fail":
            raise HandlerError(-32002, "Resource not found", {"path": "/x"})
        if method == "bug":
            raise RuntimeError("handler bug")
        if method == "typed":
            msgspec.json.decode(params, type=dict[str, int])
            return {}
        raise method_not_found(method)


class Peer:
    """The far end of the pipes: reads what the channel writes, writes raw bytes back."""

    def __init__(self, reader: trio.lowlevel.FdStream, writer: trio.lowlevel.FdStream) -> None:
        self.reader = reader
        self.writer = writer
        self.framer = jsonrpc.LineFramer(2**20)
        self.lines: list[bytes] = []

    async def send(self, data: bytes) -> None:
        await self.writer.send_all(data)

    async def recv(self) -> dict[str, Any]:
        while not self.lines:
            data = await self.reader.receive_some(65536)
            assert data, "channel closed its side"
            self.lines.extend(x for x in self.framer.feed(data) if isinstance(x, bytes))
        msg: dict[str, Any] = msgspec.json.decode(self.lines.pop(0))
        return msg


@pytest.fixture
async def pair(nursery: trio.Nursery) -> AsyncIterator[tuple[RpcChannel, Peer, Recorder]]:
    to_peer_r, to_peer_w = os.pipe()
    to_chan_r, to_chan_w = os.pipe()
    rec = Recorder()
    chan = RpcChannel(
        trio.lowlevel.FdStream(to_peer_w),
        trio.lowlevel.FdStream(to_chan_r),
        rec,
        name="peer",
        max_line_bytes=1024,
        max_concurrent_requests=2,
    )
    chan.start(nursery)
    peer = Peer(trio.lowlevel.FdStream(to_peer_r), trio.lowlevel.FdStream(to_chan_w))
    yield chan, peer, rec
    chan.close(ChannelClosed("test over"))
    await peer.writer.aclose()
    await peer.reader.aclose()


async def test_out_of_order_responses_reach_their_callers(
    pair: tuple[RpcChannel, Peer, Recorder], nursery: trio.Nursery
) -> None:
    chan, peer, _ = pair
    results: dict[str, object] = {}

    async def call(name: str) -> None:
        results[name] = msgspec.json.decode(await chan.call(name, {"n": name}))

    nursery.start_soon(call, "first")
    first = await peer.recv()
    nursery.start_soon(call, "second")
    second = await peer.recv()
    assert first["method"] == "first" and second["method"] == "second"
    assert first["id"] != second["id"]
    await peer.send(
        jsonrpc.encode_result(second["id"], "two") + jsonrpc.encode_result(first["id"], "one")
    )
    await eventually(lambda: len(results) >= 2)
    assert results == {"first": "one", "second": "two"}


async def test_notifications_before_a_response_are_delivered_first(
    pair: tuple[RpcChannel, Peer, Recorder], nursery: trio.Nursery
) -> None:
    chan, peer, rec = pair
    seen_at_return: list[list[tuple[str, bytes]]] = []

    async def call() -> None:
        await chan.call("session/load", {})
        seen_at_return.append(list(rec.notifications))

    nursery.start_soon(call)
    req = await peer.recv()
    wire = (
        jsonrpc.encode_notification("session/update", {"n": 1})
        + jsonrpc.encode_notification("session/update", {"n": 2})
        + jsonrpc.encode_result(req["id"], {})
    )
    # deliver in awkward pieces: lines split mid-way and several lines per chunk
    for i in range(0, len(wire), 7):
        await peer.send(wire[i : i + 7])
    await eventually(lambda: seen_at_return)
    assert seen_at_return[0] == [("session/update", b'{"n":1}'), ("session/update", b'{"n":2}')]


async def test_garbage_and_oversized_lines_do_not_break_the_connection(
    pair: tuple[RpcChannel, Peer, Recorder], nursery: trio.Nursery
) -> None:
    chan, peer, rec = pair
    got: list[object] = []

    async def call() -> None:
        got.append(msgspec.json.decode(await chan.call("m", {})))

    nursery.start_soon(call)
    req = await peer.recv()
    await peer.send(b"this is not json\n")
    await peer.send(b'{"jsonrpc":"2.0","method":"x","params":{"big":"' + b"y" * 5000 + b'"}}\n')
    await peer.send(b"[1,2]\n\xff\xfe\n")
    await peer.send(b'{"jsonrpc":"2.0","id":999,"result":{}}\n')  # nobody asked
    await peer.send(jsonrpc.encode_notification("after", {}))
    await peer.send(jsonrpc.encode_result(req["id"], "fine"))
    await eventually(lambda: got)
    assert got == ["fine"]
    assert rec.notifications == [("after", b"{}")]  # the oversized notification was dropped
    stats = chan.statistics()
    assert stats.dropped_oversized == 1
    assert stats.dropped_invalid == 3
    assert stats.unknown_responses == 1
    assert not chan.closed


async def test_invalid_request_with_an_id_is_answered(
    pair: tuple[RpcChannel, Peer, Recorder],
) -> None:
    _, peer, _ = pair
    await peer.send(b'{"jsonrpc":"2.0","id":"q"}\n')
    reply = await peer.recv()
    assert reply["id"] == "q"
    assert reply["error"]["code"] == INVALID_REQUEST


async def test_remote_error_keeps_code_message_and_data(
    pair: tuple[RpcChannel, Peer, Recorder], nursery: trio.Nursery
) -> None:
    chan, peer, _ = pair
    errors: list[RemoteError] = []

    async def call() -> None:
        with pytest.raises(RemoteError) as exc_info:
            await chan.call("session/prompt", {})
        errors.append(exc_info.value)

    nursery.start_soon(call)
    req = await peer.recv()
    await peer.send(jsonrpc.encode_error(req["id"], -32603, "boom", {"why": ["x"]}))
    await eventually(lambda: errors)
    err = errors[0]
    assert (err.code, err.message, err.data, err.method) == (
        -32603,
        "boom",
        {"why": ["x"]},
        "session/prompt",
    )


async def test_timeout_sends_cancel_request_and_ignores_the_late_answer(
    pair: tuple[RpcChannel, Peer, Recorder], nursery: trio.Nursery
) -> None:
    chan, peer, _ = pair
    with pytest.raises(RequestTimeout) as exc_info:
        await chan.call("slowpoke", {}, timeout_s=0.05)
    assert exc_info.value.method == "slowpoke"
    req = await peer.recv()
    cancel = await peer.recv()
    assert cancel == {
        "jsonrpc": "2.0",
        "method": "$/cancel_request",
        "params": {"requestId": req["id"]},
    }
    await peer.send(jsonrpc.encode_result(req["id"], "late"))
    # still usable
    results: list[object] = []

    async def call() -> None:
        results.append(msgspec.json.decode(await chan.call("again", {})))

    nursery.start_soon(call)
    again = await peer.recv()
    await peer.send(jsonrpc.encode_result(again["id"], "ok"))
    await eventually(lambda: results)
    assert results == ["ok"]
    assert chan.statistics().unknown_responses == 1


@pytest.mark.parametrize(
    ("method", "params", "expected"),
    [
        ("echo", {"a": [1, 2]}, {"result": {"a": [1, 2]}}),
        ("craft/drainMidTurnQueue", {}, {"error": {"code": METHOD_NOT_FOUND}}),
        ("fail", {}, {"error": {"code": -32002, "data": {"path": "/x"}}}),
        ("bug", {}, {"error": {"code": INTERNAL_ERROR}}),
        ("typed", {"a": "not an int"}, {"error": {"code": -32602}}),
    ],
)
async def test_agent_requests_are_answered(
    pair: tuple[RpcChannel, Peer, Recorder], method: str, params: object, expected: dict[str, Any]
) -> None:
    _, peer, _ = pair
    await peer.send(jsonrpc.encode_request(41, method, params))
    reply = await peer.recv()
    assert reply["id"] == 41
    if "result" in expected:
        assert reply["result"] == expected["result"]
    else:
        for key, value in expected["error"].items():
            assert reply["error"][key] == value


async def test_cancel_request_from_agent_cancels_the_handler(
    pair: tuple[RpcChannel, Peer, Recorder],
) -> None:
    chan, peer, rec = pair
    await peer.send(jsonrpc.encode_request("r1", "slow", {}))
    await eventually(lambda: "slow" in rec.started)
    assert chan.statistics().inflight_requests == 1
    await peer.send(jsonrpc.encode_notification("$/cancel_request", {"requestId": "r1"}))
    reply = await peer.recv()
    assert reply["id"] == "r1"
    assert reply["error"]["code"] == REQUEST_CANCELLED
    assert chan.statistics().inflight_requests == 0


async def test_reader_keeps_going_while_handlers_block_and_excess_requests_are_refused(
    pair: tuple[RpcChannel, Peer, Recorder],
) -> None:
    _, peer, rec = pair
    # two slow handlers fill the bound of 2; the third request is refused at once
    await peer.send(jsonrpc.encode_request(1, "slow", {}) + jsonrpc.encode_request(2, "slow", {}))
    await peer.send(jsonrpc.encode_request(3, "slow", {}))
    refused = await peer.recv()
    assert refused["id"] == 3 and refused["error"]["code"] == INTERNAL_ERROR
    # notifications still flow while both handlers wait
    await peer.send(jsonrpc.encode_notification("tick", {}))
    await eventually(lambda: rec.notifications)
    rec.release.set()
    answers = {(await peer.recv())["id"], (await peer.recv())["id"]}
    assert answers == {1, 2}


async def test_eof_fails_pending_and_later_calls(
    pair: tuple[RpcChannel, Peer, Recorder], nursery: trio.Nursery
) -> None:
    chan, peer, _ = pair
    failures: list[BaseException] = []

    async def call() -> None:
        try:
            await chan.call("never", {})
        except ChannelClosed as exc:
            failures.append(exc)

    nursery.start_soon(call)
    await peer.recv()
    await peer.writer.aclose()  # the agent's stdout reaches EOF
    await eventually(lambda: failures)
    assert "closed its stdout" in str(failures[0])
    assert chan.closed
    with pytest.raises(ChannelClosed):
        await chan.call("after", {})
    with pytest.raises(ChannelClosed):
        await chan.notify("after", {})


async def test_deadline_covers_a_peer_that_stops_reading(nursery: trio.Nursery) -> None:
    to_peer_r, to_peer_w = os.pipe()
    to_chan_r, to_chan_w = os.pipe()
    chan = RpcChannel(
        trio.lowlevel.FdStream(to_peer_w),
        trio.lowlevel.FdStream(to_chan_r),
        Recorder(),
        write_queue_messages=1,
    )
    chan.start(nursery)
    big = {"blob": "x" * 2**20}  # far more than a pipe buffer; nobody reads the other end
    with pytest.raises(RequestTimeout):
        await chan.call("a", big, timeout_s=0.2)
    with pytest.raises(RequestTimeout):
        await chan.call("b", big, timeout_s=0.2)
    with pytest.raises(RequestTimeout):
        await chan.notify("c", big, timeout_s=0.2)
    chan.close(ChannelClosed("test over"))
    for fd in (to_peer_r, to_chan_w):
        os.close(fd)
