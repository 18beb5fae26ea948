"""Bounds of the ACP front: eviction of an unread session stream and its resume, idle
expiry of HTTP connections, and QWEN_SERVE_ACP_HTTP=0 (real daemons, scripted agent)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
import trio

from tests.acpfront.helpers import AcpHttp
from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until


async def test_unread_session_stream_is_evicted_then_resumes_from_the_ring(
    acp: AcpHttp, daemon_proc: DaemonProcess
) -> None:
    await acp.initialize({"protocolVersion": 1})
    before = await evictions(acp.client)
    async with acp.stream() as conn:
        sid = (await acp.new_session(str(daemon_proc.workspace.resolve()), conn))["sessionId"]
        # 3000 updates while no session stream is open: more than an outbox holds (2048).
        rid = await acp.request(
            "session/prompt",
            {"sessionId": sid, "prompt": [{"type": "text", "text": "[flood 3000]"}]},
        )
        # Open the session stream only once the overflow evicted it, or a reader keeping up
        # would see no eviction at all (correctly). No other stream is open, so the daemon's
        # counter counts this one: an SSE watcher here could itself be evicted on a busy
        # machine and move the counter first (the CI flake this replaced).
        await wait_for_eviction(acp.client, before)
        async with acp.stream(sid) as sess:
            frames = await sess.until(lambda f: f.message.get("id") == rid)
    evicted = [f for f in frames if f.kind == "client_evicted"]
    assert len(evicted) == 1 and evicted[0].id is None
    data = evicted[0].message["params"]["data"]
    assert data["reason"] == "queue_overflow" and data["sessionId"] == sid
    # Reopening resumed from the ring: every update of the turn arrives, in order, once.
    ids = [f.id for f in frames if f.id is not None]
    assert ids == list(range(ids[0], ids[-1] + 1))  # in order, once, no gap
    updates = [f for f in frames if f.method == "session/update"]
    chunks = [
        f
        for f in updates
        if f.message["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
    ]
    assert len(chunks) >= 3000
    kinds = [f.kind for f in frames]
    # The prompt's reply, queued before the eviction, follows the whole turn (where the
    # replay ends depends on how far the paced agent got before the eviction).
    assert "replay_complete" in kinds and kinds.index("turn_complete") < len(frames) - 1
    assert frames[-1].message["result"]["stopReason"] == "end_turn"


async def evictions(client: httpx.AsyncClient) -> float:
    """The daemon's ``acp_serve_sse_evictions`` counter (``GET /metrics``)."""
    r = await client.get("/metrics")
    assert r.status_code == 200, r.text
    for line in r.text.splitlines():
        if line.startswith("acp_serve_sse_evictions_total ") or line.startswith(
            "acp_serve_sse_evictions "
        ):
            return float(line.split()[1])
    raise AssertionError("no acp_serve_sse_evictions in /metrics")


async def wait_for_eviction(client: httpx.AsyncClient, before: float) -> None:
    """Until the counter passed ``before`` (bounded: 60 s)."""
    with trio.fail_after(60):
        while await evictions(client) <= before:  # noqa: ASYNC110 (another process)
            await trio.sleep(0.05)


@pytest.fixture(scope="module")
def short_idle() -> Iterator[DaemonProcess]:
    d = spawn_daemon(env={"QWEN_SERVER_TOKEN": TOKEN, "QWEN_SERVE_ACP_IDLE_TIMEOUT_MS": "400"})
    try:
        yield d
    finally:
        d.stop()


async def test_idle_http_connection_expires_and_releases(short_idle: DaemonProcess) -> None:
    async with httpx.AsyncClient(base_url=short_idle.url, headers=AUTH, timeout=30) as client:
        async with trio.open_nursery() as nursery:
            acp = AcpHttp(client, nursery)
            await acp.initialize({"protocolVersion": 1})
            async with acp.stream() as conn:
                sid = (await acp.new_session(str(short_idle.workspace.resolve()), conn))[
                    "sessionId"
                ]
            # An open stream keeps it alive; with none and no request it expires.
            async with client.stream(
                "GET", f"/session/{sid}/events", headers={"Accept": "text/event-stream"}
            ) as watcher:
                ended = await collect_until(watcher, lambda e: e.get("type") == "session_closed")
            assert ended[-1]["data"]["reason"] == "acp_connection_closed"
            r = await acp.post({"jsonrpc": "2.0", "id": 5, "method": "session/list"})
            assert r.status_code == 404
            nursery.cancel_scope.cancel()


def test_acp_can_be_turned_off() -> None:
    d = spawn_daemon(env={"QWEN_SERVER_TOKEN": TOKEN, "QWEN_SERVE_ACP_HTTP": "0"})
    try:
        with httpx.Client(base_url=d.url, headers=AUTH, timeout=30) as client:
            r = client.post(
                "/acp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
            )
            assert r.status_code == 404
            caps = client.get("/capabilities").json()
            assert "acp_http_transport" not in caps["features"]
            assert "acp_websocket_transport" not in caps["features"]
    finally:
        d.stop()


async def test_capabilities_advertise_acp_tags_and_rest_transport(
    client: httpx.AsyncClient,
) -> None:
    caps = (await client.get("/capabilities")).json()
    assert {"acp_http_transport", "acp_websocket_transport"} <= set(caps["features"])
    # Deliberately REST only (docs/reference/acp.md): negotiateTransport would pick acp-ws first.
    assert caps["transports"] == ["rest"]


def test_strict_gate_and_rate_limit_apply_per_method() -> None:
    """A daemon without a token: the strict twins answer token_required; with rate limits
    on, the prompt tier is counted per JSON-RPC method (429 on the POST, as on REST)."""
    d = spawn_daemon(env={"QWEN_SERVE_RATE_LIMIT": "1", "QWEN_SERVE_RATE_LIMIT_PROMPT": "1"})
    try:
        with httpx.Client(base_url=d.url, timeout=30) as client:
            r = client.post(
                "/acp",
                json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
            )
            assert r.status_code == 200
            headers = {"Acp-Connection-Id": r.headers["acp-connection-id"]}
            with client.stream(
                "GET", "/acp", headers={**headers, "Accept": "text/event-stream"}
            ) as stream:
                lines = stream.iter_lines()
                r = client.post(
                    "/acp",
                    json={
                        "jsonrpc": "2.0",
                        "id": 2,
                        "method": "_qwen/file/write",
                        "params": {"path": "x.txt", "content": "x", "mode": "create"},
                    },
                    headers=headers,
                )
                assert r.status_code == 202
                reply = next(json.loads(line[6:]) for line in lines if line.startswith("data: "))
            assert reply["id"] == 2
            assert reply["error"]["data"]["code"] == "token_required"
            assert reply["error"]["data"]["httpStatus"] == 401
            assert not (d.workspace / "x.txt").exists()
            prompt = {
                "jsonrpc": "2.0",
                "method": "session/prompt",
                "params": {"sessionId": "s", "prompt": [{"type": "text", "text": "x"}]},
            }
            first = client.post("/acp", json={**prompt, "id": 3}, headers=headers)
            second = client.post("/acp", json={**prompt, "id": 4}, headers=headers)
            assert first.status_code == 202
            assert second.status_code == 429
            assert second.json()["error"]["data"]["code"] == "rate_limit_exceeded"
            assert second.json()["id"] == 4
            assert int(second.headers["retry-after"]) >= 1
    finally:
        d.stop()
