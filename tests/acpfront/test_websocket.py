"""ACP over one WebSocket at /acp (real daemon, scripted agent, a wsproto client)."""

from __future__ import annotations

import random

import httpx
import pytest

from tests.acpfront.helpers import Ws, WsClosed
from tests.acpfront.test_wire import _message
from tests.conftest import AUTH
from tests.support.daemon import DaemonProcess
from tests.support.sse import collect_until


async def _init(daemon_proc: DaemonProcess) -> Ws:
    ws = await Ws.connect(daemon_proc.port, headers=AUTH)
    await ws.send(
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}
    )
    reply = await ws.recv()
    assert reply["id"] == 1 and reply["result"]["protocolVersion"] == 1
    assert reply["result"]["agentCapabilities"]["_meta"]["qwen"]["transport"] == "ws"
    return ws


async def test_first_frame_must_be_initialize(daemon_proc: DaemonProcess) -> None:
    ws = await Ws.connect(daemon_proc.port, headers=AUTH)
    await ws.send({"jsonrpc": "2.0", "id": 7, "method": "session/list", "params": {}})
    error = await ws.recv()
    assert error["error"]["code"] == -32600 and error["id"] == 7
    with pytest.raises(WsClosed) as closed:
        await ws.recv()
    assert closed.value.code == 1002


async def test_upgrade_without_token_is_401(daemon_proc: DaemonProcess) -> None:
    with pytest.raises(WsClosed) as refused:
        await Ws.connect(daemon_proc.port)
    assert refused.value.code == -401


async def test_everything_flows_on_the_socket(daemon_proc: DaemonProcess) -> None:
    ws = await _init(daemon_proc)
    cwd = str(daemon_proc.workspace.resolve())
    await ws.send({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": cwd}})
    created = (await ws.until(lambda m: m.get("id") == 2))[-1]["result"]
    sid = created["sessionId"]
    await ws.send(
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "session/prompt",
            "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "[write ws.txt w]"}]},
        }
    )
    got = await ws.until(lambda m: m.get("method") == "session/request_permission")
    ask = got[-1]
    await ws.send(
        {
            "jsonrpc": "2.0",
            "id": ask["id"],
            "result": {"outcome": {"outcome": "selected", "optionId": "allow"}},
        }
    )
    rest = await ws.until(lambda m: m.get("id") == 3)
    assert rest[-1]["result"]["stopReason"] == "end_turn"
    kinds = [m["params"]["kind"] for m in got + rest if m.get("method") == "_qwen/notify"]
    assert "permission_resolved" in kinds and "turn_complete" in kinds
    assert (daemon_proc.workspace / "ws.txt").read_text() == "w"
    await ws.send(
        {"jsonrpc": "2.0", "id": 4, "method": "session/close", "params": {"sessionId": sid}}
    )
    closing = await ws.until(lambda m: m.get("id") == 4)
    assert closing[-1]["result"] == {}
    # session_closed reached the socket before the reply.
    assert any(m.get("params", {}).get("kind") == "session_closed" for m in closing)
    await ws.abort()


async def test_a_dropped_socket_releases_its_sessions(daemon_proc: DaemonProcess) -> None:
    ws = await _init(daemon_proc)
    cwd = str(daemon_proc.workspace.resolve())
    await ws.send({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": cwd}})
    sid = (await ws.until(lambda m: m.get("id") == 2))[-1]["result"]["sessionId"]
    async with httpx.AsyncClient(base_url=daemon_proc.url, headers=AUTH, timeout=30) as client:
        async with client.stream(
            "GET", f"/session/{sid}/events", headers={"Accept": "text/event-stream"}
        ) as watcher:
            await ws.abort()
            ended = await collect_until(watcher, lambda e: e.get("type") == "session_closed")
        assert ended[-1]["data"]["reason"] == "acp_connection_closed"


async def test_fuzzed_frames_get_jsonrpc_errors_and_the_socket_survives(
    daemon_proc: DaemonProcess,
) -> None:
    ws = await _init(daemon_proc)
    rng = random.Random(1919)
    for _ in range(200):
        raw = _message(rng)
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
        await ws.send(text)
    await ws.send({"jsonrpc": "2.0", "id": "last", "method": "_qwen/health", "params": {}})
    seen = await ws.until(lambda m: m.get("id") == "last")
    assert seen[-1]["result"] == {"status": "ok"}
    for msg in seen:
        assert msg["jsonrpc"] == "2.0"
        if "error" in msg:
            assert isinstance(msg["error"]["code"], int)
    assert "ACP request failed" not in daemon_proc.stderr()
    assert "unhandled error" not in daemon_proc.stderr()
    await ws.abort()
