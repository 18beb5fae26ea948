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
from tests.acpfront.helpers import AcpHttp
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
