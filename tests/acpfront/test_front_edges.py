"""The /acp front's edges (issue 22, items 16-19), against real daemons (scripted agent):
the per-connection session bound refuses before anything is made, connection slots cannot
be taken for everyone, loaded sessions share the log's frames, and one rule gates every
approval-mode change; a connection is bound to the transport and credentials that made it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import trio

from serve.acpfront.front import MAX_SESSIONS
from tests.acpfront.helpers import AcpHttp, Ws
from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until


@pytest.fixture(scope="module")
def packed() -> Iterator[DaemonProcess]:
    """Room for more sessions than one connection may own, on one shared child."""
    d = spawn_daemon(
        ["--max-sessions", "0", "--sessions-per-agent", "100", "--warm-agents", "0"],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
async def packed_client(packed: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=packed.url, headers=AUTH, timeout=30) as client:
        yield client


async def _active_sessions(client: httpx.AsyncClient) -> int:
    r = await client.get("/daemon/status")
    assert r.status_code == 200, r.text
    return int(r.json()["runtime"]["sessions"]["active"])


async def test_session_bound_refuses_new_and_load_before_making_a_session(
    packed: DaemonProcess, packed_client: httpx.AsyncClient
) -> None:
    cwd = str(packed.workspace.resolve())
    async with trio.open_nursery() as nursery:
        # A session that exists only on disk (its connection closed it).
        other = AcpHttp(packed_client, nursery)
        await other.initialize({"protocolVersion": 1})
        async with other.stream() as conn:
            stored = (await other.new_session(cwd, conn))["sessionId"]
        async with packed_client.stream(
            "GET", f"/session/{stored}/events", headers={"Accept": "text/event-stream"}
        ) as watcher:
            await packed_client.delete("/acp", headers=other.headers())
            await collect_until(watcher, lambda e: e.get("type") == "session_closed")

        acp = AcpHttp(packed_client, nursery)
        await acp.initialize({"protocolVersion": 1})
        async with acp.stream() as conn:
            for _ in range(MAX_SESSIONS):
                await acp.new_session(cwd, conn)
            assert await _active_sessions(packed_client) == MAX_SESSIONS
            for method, params in (
                ("session/new", {"cwd": cwd, "mcpServers": []}),
                ("session/load", {"sessionId": stored, "cwd": cwd, "mcpServers": []}),
            ):
                rid = await acp.request(method, params)
                reply = await conn.reply(rid)
                assert reply.message["error"]["data"]["code"] == "connection_session_limit"
                # Nothing was made or restored for the refused call.
                assert await _active_sessions(packed_client) == MAX_SESSIONS
        await packed_client.delete("/acp", headers=acp.headers())
        nursery.cancel_scope.cancel()


# ---- item 19: one rule for every approval-mode change; connections bound to their maker --


@pytest.fixture(scope="module")
def tokenless() -> Iterator[DaemonProcess]:
    d = spawn_daemon()
    try:
        yield d
    finally:
        d.stop()


async def test_no_path_changes_the_approval_mode_on_a_tokenless_daemon(
    tokenless: DaemonProcess,
) -> None:
    cwd = str(tokenless.workspace.resolve())
    async with httpx.AsyncClient(base_url=tokenless.url, timeout=30) as client:
        # REST create with approvalMode: refused like the approval-mode route, nothing made.
        r = await client.post("/session", json={"approvalMode": "yolo"})
        assert r.status_code == 401, r.text
        assert r.json()["code"] == "token_required"
        assert await _active_sessions(client) == 0
        async with trio.open_nursery() as nursery:
            acp = AcpHttp(client, nursery)
            await acp.initialize({"protocolVersion": 1})
            async with acp.stream() as conn:
                rid = await acp.request(
                    "session/new", {"cwd": cwd, "mcpServers": [], "approvalMode": "yolo"}
                )
                reply = await conn.reply(rid)
                assert reply.message["error"]["data"]["code"] == "token_required"
                assert await _active_sessions(client) == 0
                sid = (await acp.new_session(cwd, conn))["sessionId"]
                async with acp.stream(sid) as sess:
                    for method, params in (
                        ("session/set_config_option", {"configId": "mode", "value": "yolo"}),
                        ("session/set_mode", {"modeId": "yolo"}),
                    ):
                        rid = await acp.request(method, {"sessionId": sid, **params})
                        reply = await sess.reply(rid)
                        assert reply.message["error"]["data"]["code"] == "token_required"
                rid = await acp.request("_qwen/session/context", {"sessionId": sid})
                state = (await conn.reply(rid)).message["result"]["state"]
                assert state["modes"]["currentModeId"] != "yolo"
            await client.delete("/acp", headers=acp.headers())
            nursery.cancel_scope.cancel()


async def test_a_connection_answers_only_its_own_transport_and_caller(
    daemon_proc: DaemonProcess, client: httpx.AsyncClient
) -> None:
    """Another address naming a known HTTP connection id cannot take over its stream or
    post to it; an HTTP POST naming a WebSocket connection's id does not reach it."""
    elsewhere = httpx.AsyncClient(
        base_url=daemon_proc.url,
        headers=AUTH,
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        timeout=30,
    )
    async with elsewhere, trio.open_nursery() as nursery:
        acp = AcpHttp(client, nursery)
        await acp.initialize({"protocolVersion": 1})
        async with acp.stream() as conn:
            stolen = {"Acp-Connection-Id": acp.connection_id or "", "Accept": "text/event-stream"}
            async with elsewhere.stream("GET", "/acp", headers=stolen) as r:
                assert r.status_code == 404
            r = await elsewhere.post(
                "/acp",
                json={"jsonrpc": "2.0", "id": 7, "method": "_qwen/health", "params": {}},
                headers={"Acp-Connection-Id": acp.connection_id or ""},
            )
            assert r.status_code == 404, r.text
            # The owner's stream was not taken over: it still gets its replies.
            rid = await acp.request("_qwen/health", {})
            assert (await conn.reply(rid)).message["result"] == {"status": "ok"}
        await client.delete("/acp", headers=acp.headers())

        ws = await Ws.connect(daemon_proc.port, headers=AUTH)
        await ws.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
        ws_id = (await ws.recv())["result"]["agentCapabilities"]["_meta"]["qwen"]["connectionId"]
        r = await client.post(
            "/acp",
            json={"jsonrpc": "2.0", "id": 9, "method": "_qwen/health", "params": {}},
            headers={"Acp-Connection-Id": ws_id},
        )
        assert r.status_code == 404, r.text
        await ws.send({"jsonrpc": "2.0", "id": 10, "method": "_qwen/health", "params": {}})
        assert (await ws.recv())["id"] == 10  # nothing was injected before it
        await ws.abort()
        nursery.cancel_scope.cancel()


# ---- item 17: /acp connection slots cannot be taken for everyone -------------------------

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}


def _from(d: DaemonProcess, n: int) -> httpx.AsyncClient:
    """A client whose requests come from 127.0.0.``n``."""
    transport = httpx.AsyncHTTPTransport(local_address=f"127.0.0.{n}")
    return httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30, transport=transport)


def test_initialize_is_rate_limited_by_address_not_client_id() -> None:
    d = spawn_daemon(
        env={
            "QWEN_SERVER_TOKEN": TOKEN,
            "QWEN_SERVE_RATE_LIMIT": "1",
            "QWEN_SERVE_RATE_LIMIT_MUTATION": "3",
        }
    )
    try:

        async def main() -> None:
            async with _from(d, 1) as here, _from(d, 2) as elsewhere:
                for n in range(3):
                    r = await here.post("/acp", json=INIT, headers={"X-Qwen-Client-Id": f"c{n}"})
                    assert r.status_code == 200, r.text
                r = await here.post("/acp", json=INIT, headers={"X-Qwen-Client-Id": "fresh"})
                assert r.status_code == 429, r.text
                assert r.json()["error"]["data"]["code"] == "rate_limit_exceeded"
                assert int(r.headers["retry-after"]) >= 1
                # The WebSocket's initialize counts against the same budget.
                ws = await Ws.connect(d.port, headers=AUTH)
                await ws.send(INIT)
                reply = await ws.recv()
                assert reply["error"]["data"]["code"] == "rate_limit_exceeded"
                await ws.abort()
                assert (await elsewhere.post("/acp", json=INIT)).status_code == 200

        trio.run(main)
    finally:
        d.stop()


def test_connections_per_address_are_capped_and_unused_ones_expire_soon() -> None:
    from serve.acpfront.front import MAX_CONNECTIONS_PER_CLIENT

    # 4 s: long enough that a loaded machine opens all 32 before the bare ones expire.
    d = spawn_daemon(env={"QWEN_SERVER_TOKEN": TOKEN, "QWEN_SERVE_ACP_UNUSED_TIMEOUT_MS": "4000"})
    try:

        async def main() -> None:
            health = {"jsonrpc": "2.0", "id": 2, "method": "_qwen/health", "params": {}}
            async with _from(d, 3) as here, _from(d, 4) as elsewhere:
                ids = []
                for _ in range(MAX_CONNECTIONS_PER_CLIENT):
                    r = await here.post("/acp", json=INIT)
                    assert r.status_code == 200, r.text
                    ids.append(r.headers["acp-connection-id"])
                    if len(ids) == 2:
                        second_opened = trio.current_time()
                    if len(ids) == 1:  # the first one is used at once: it never expires
                        used = {"Acp-Connection-Id": ids[0]}
                        r = await here.post("/acp", json=health, headers=used)
                        assert r.status_code == 202
                r = await here.post("/acp", json=INIT)
                assert r.status_code == 503, r.text
                assert r.json()["error"]["data"]["code"] == "client_connection_limit_exceeded"
                # Another address is not locked out by this one.
                assert (await elsewhere.post("/acp", json=INIT)).status_code == 200
                # The bare initializes expire; the used one does not. (Probing a bare one
                # would use it, so it is looked at once, well after its expiry.)
                await trio.sleep_until(second_opened + 4 + 3)
                unused = {"Acp-Connection-Id": ids[1]}
                assert (await here.post("/acp", json=health, headers=unused)).status_code == 404
                assert (await here.post("/acp", json=health, headers=used)).status_code == 202
                assert (await here.post("/acp", json=INIT)).status_code == 200

        trio.run(main)
    finally:
        d.stop()
