"""The agent link's seam: a session gets its connected, initialized agent from the
registry's ``AgentSource`` (what an agent pool plugs in), in one replaceable step."""

from __future__ import annotations

from pathlib import Path

import trio

from acp.client import AgentConnection
from acp.handler import ClientHandler
from serve.sessions.agent_link import SpawnAgentSource
from tests.serve.test_session_lifetime import inprocess
from tests.support.sse import collect_until


class CountingSource:
    def __init__(self, inner: SpawnAgentSource) -> None:
        self.inner = inner
        self.handed: list[AgentConnection] = []

    async def acquire(
        self,
        nursery: trio.Nursery,
        *,
        cwd: str,
        handler: ClientHandler,
        timeout_s: float,
        tenant: str | None = None,
    ) -> AgentConnection:
        """The session's agent, for ``tenant`` (the principal it works for)."""
        conn = await self.inner.acquire(
            nursery, cwd=cwd, handler=handler, timeout_s=timeout_s, tenant=tenant
        )
        assert isinstance(conn, AgentConnection)  # no limits here: the connection itself
        assert conn.info is not None  # initialized before it is handed over
        self.handed.append(conn)
        return conn


async def test_sessions_take_their_agents_from_the_registry_source(tmp_path: Path) -> None:
    async with inprocess(tmp_path) as (d, client):
        source = CountingSource(SpawnAgentSource(d.settings))
        d.host.registry.primary.registry.agent_source = source  # the test's own source
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
        r = await client.post(
            f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "hello"}]}
        )
        assert r.status_code == 200 and r.json()["stopReason"] == "end_turn"
        session = d.host.registry.get(sid)
        assert session is not None
        assert source.handed == [session.conn]
        # A restart in place asks the source again.
        async with client.stream(
            "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
        ) as stream:
            await client.post(
                f"/session/{sid}/prompt",
                json={"prompt": [{"type": "text", "text": "[crash]"}]},
                headers={"Prefer": "respond-async"},
            )
            await collect_until(stream, lambda e: e["type"] == "session_restarted")
        assert len(source.handed) == 2 and source.handed[1] is session.conn
