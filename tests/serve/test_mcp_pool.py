"""The McpPool actor with real MCP server processes, real sockets and the real bridge.

Each test runs a pool in-process (pytest-trio) over a temporary workspace whose
``.qwen/settings.json`` names ``tests/support/mcp_server.py`` servers. Sessions are
stand-in actors whose inbox records the ``PublishEvent`` messages the pool sent them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from acp.jsonrpc import LineFramer
from actors import Actor
from serve.events.messages import PublishEvent
from serve.mcp import BudgetPolicy, McpPool, McpRestartFailed, McpServerNotFound

ROOT = Path(__file__).resolve().parents[2]
MCP_SERVER = str(ROOT / "tests" / "support" / "mcp_server.py")
WAIT_S = 30.0


class Log(Actor[PublishEvent]):
    """A session stand-in: the ``PublishEvent`` messages the pool sent it, in order (read
    straight from its inbox: the pool posts them before its call returns)."""

    def __init__(self) -> None:
        super().__init__("session-stand-in", inbox_size=1024)
        self._events: list[tuple[str, dict[str, Any], str | None]] = []

    @property
    def events(self) -> list[tuple[str, dict[str, Any], str | None]]:
        while True:
            try:
                envelope = self._recv.receive_nowait()
            except trio.WouldBlock:
                return self._events
            msg = envelope.msg
            self._events.append((msg.event_type, json.loads(json.dumps(msg.data)), msg.originator))
            if envelope.reply is not None:
                envelope.reply.set(len(self._events))

    def of(self, event_type: str) -> list[dict[str, Any]]:
        return [data for kind, data, _ in self.events if kind == event_type]


def stdio(name: str, *extra: str) -> dict[str, Any]:
    return {"command": sys.executable, "args": [MCP_SERVER, "--name", name, *extra]}


def write_settings(ws: Path, servers: dict[str, Any], **extra: Any) -> None:
    (ws / ".qwen").mkdir(exist_ok=True)
    (ws / ".qwen" / "settings.json").write_text(json.dumps({"mcpServers": servers, **extra}))


@asynccontextmanager
async def running_pool(
    tmp_path: Path,
    *,
    budget: int | None = None,
    mode: str = "off",
    pooling: bool = True,
    live: list[Log] | None = None,
    handshake_timeout_s: float = 10.0,
) -> AsyncIterator[McpPool]:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    pool = McpPool(
        workspaces=[str(ws)],
        policy=BudgetPolicy(budget, mode),  # type: ignore[arg-type]
        pooling=pooling,
        socket_dir=str(tmp_path / "state"),
        sessions_for=lambda _ws: list(live or []),
        handshake_timeout_s=handshake_timeout_s,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        try:
            yield pool
        finally:
            pool.close()


async def eventually(predicate: Callable[[], Awaitable[bool]]) -> None:
    """Wait (bounded) for a condition the pool reaches asynchronously (polled: the pool
    has no hook for tests to wait on)."""
    with trio.fail_after(WAIT_S):
        while not await predicate():  # noqa: ASYNC110
            await trio.sleep(0.05)


async def snapshot(pool: McpPool, tmp_path: Path) -> dict[str, Any]:
    return await pool.snapshot(str(tmp_path / "ws"))


def cell(snap: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in snap["servers"] if c["name"] == name]
    assert isinstance(found, dict)
    return found


def pool_pid(snap: dict[str, Any], name: str) -> int | None:
    entries = cell(snap, name).get("pool", {}).get("entries", [])
    return entries[0]["pid"] if entries else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class BridgeClient:
    """An agent-side MCP client speaking through the real bridge script."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.framer = LineFramer()
        self.lines: list[dict[str, Any]] = []

    @classmethod
    @asynccontextmanager
    async def open(cls, server: dict[str, Any]) -> AsyncIterator[BridgeClient]:
        proc = await trio.lowlevel.open_process(
            [server["command"], *server["args"]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            yield cls(proc)
        finally:
            assert proc.stdin is not None
            await proc.stdin.aclose()
            with trio.move_on_after(5):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

    async def request(self, rid: Any, method: str, params: Any = None) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        message = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}}
        await self.proc.stdin.send_all(json.dumps(message).encode() + b"\n")
        with trio.fail_after(WAIT_S):
            while True:
                for i, msg in enumerate(self.lines):
                    if msg.get("id") == rid and "method" not in msg:
                        return self.lines.pop(i)
                data = await self.proc.stdout.receive_some(65536)
                assert data, "bridge closed its stdout"
                self.lines.extend(
                    json.loads(line) for line in self.framer.feed(data) if isinstance(line, bytes)
                )

    async def call_tool(self, rid: Any, name: str, **arguments: Any) -> str:
        answer = await self.request(rid, "tools/call", {"name": name, "arguments": arguments})
        return answer["result"]["content"][0]["text"]  # type: ignore[no-any-return]


# ---- hand-out and sharing ------------------------------------------------------------------


async def test_first_session_starts_pooled_servers_and_hands_out_bridges(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    write_settings(
        ws,
        {
            "a": stdio("a"),
            "web": {"httpUrl": "https://mcp.example/mcp", "headers": {"Authorization": "B x"}},
        },
    )
    async with running_pool(tmp_path) as pool:
        before = await snapshot(pool, tmp_path)
        assert before["discoveryState"] == "not_started" and before["initialized"] is False
        assert pool_pid(before, "a") is None

        servers = await pool.acp_servers_for(str(ws), requester=Log())
        assert [s["name"] for s in servers] == ["a", "web"]
        bridged = servers[0]
        assert bridged["command"] == sys.executable and bridged["env"] == []
        assert bridged["args"][-2].endswith("bridge.py")
        assert Path(bridged["args"][-1]).is_socket()  # noqa: ASYNC240
        assert servers[1] == {
            "type": "http",
            "name": "web",
            "url": "https://mcp.example/mcp",
            "headers": [{"name": "Authorization", "value": "B x"}],
        }

        snap = await snapshot(pool, tmp_path)
        assert snap["discoveryState"] == "completed" and snap["initialized"] is True
        a = cell(snap, "a")
        assert (a["status"], a["mcpStatus"], a["managedBy"]) == ("ok", "connected", "pool")
        assert a["toolCount"] == 3 + 4
        pid = pool_pid(snap, "a")
        assert pid is not None and alive(pid)
        assert cell(snap, "web")["managedBy"] == "agent"
        assert "headers" not in json.dumps(snap) and "Authorization" not in json.dumps(snap)
        assert snap["budgets"] == [] and snap["budgetMode"] == "off"

        # A second session shares the same process.
        again = await pool.acp_servers_for(str(ws), requester=Log())
        assert again == servers
        # An agent without mcpCapabilities.http gets no http server.
        stdio_only = await pool.acp_servers_for(str(ws), http=False, sse=False)
        assert [s["name"] for s in stdio_only] == ["a"]
        assert pool_pid(await snapshot(pool, tmp_path), "a") == pid
    assert not alive(pid)


async def test_bridge_clients_share_one_server_process(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    server_log = tmp_path / "server.log"
    write_settings(ws, {"a": stdio("a", "--log", str(server_log))})
    async with running_pool(tmp_path) as pool:
        (server,) = await pool.acp_servers_for(str(ws))
        pid = pool_pid(await snapshot(pool, tmp_path), "a")
        async with BridgeClient.open(server) as one, BridgeClient.open(server) as two:
            for client in (one, two):
                init = await client.request(1, "initialize", {"protocolVersion": "2025-06-18"})
                assert init["result"]["serverInfo"]["name"] == "a"
            # Both use id 2 at once; each gets its own answer.
            async with trio.open_nursery() as nursery:
                answers: dict[str, str] = {}

                async def call(name: str, client: BridgeClient, text: str) -> None:
                    answers[name] = await client.call_tool(2, "echo", text=text)

                nursery.start_soon(call, "one", one, "from one")
                nursery.start_soon(call, "two", two, "from two")
            assert answers == {"one": "from one", "two": "from two"}
            assert await one.call_tool(3, "whoami") == f"a pid {pid}"
            assert await two.call_tool(3, "whoami") == f"a pid {pid}"
            roots = json.loads(await one.call_tool(4, "roots"))
            assert roots == {"roots": [{"uri": f"file://{ws}", "name": "ws"}]}
        received = [json.loads(line) for line in server_log.read_text().splitlines()]
        assert [m.get("method") for m in received].count("initialize") == 1


# ---- supervision and restarts --------------------------------------------------------------


async def test_killed_server_is_restarted_and_clients_keep_their_connection(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    write_settings(ws, {"a": stdio("a")})
    async with running_pool(tmp_path) as pool:
        (server,) = await pool.acp_servers_for(str(ws))
        old = pool_pid(await snapshot(pool, tmp_path), "a")
        assert old is not None
        async with BridgeClient.open(server) as client:
            await client.request(1, "initialize", {})
            assert await client.call_tool(2, "whoami") == f"a pid {old}"
            os.kill(old, signal.SIGKILL)

            async def restarted() -> bool:
                snap = await snapshot(pool, tmp_path)
                new = pool_pid(snap, "a")
                return new not in (None, old) and cell(snap, "a")["mcpStatus"] == "connected"

            await eventually(restarted)
            snap = await snapshot(pool, tmp_path)
            new = pool_pid(snap, "a")
            assert cell(snap, "a")["pool"]["entries"][0]["restarts"] == 1
            assert await client.call_tool(3, "whoami") == f"a pid {new}"
        assert not alive(old)


async def test_crash_loop_gives_up_and_the_server_is_no_longer_handed_out(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    write_settings(ws, {"flaky": stdio("flaky", "--exit-after-handshake", "3"), "ok": stdio("ok")})
    async with running_pool(tmp_path) as pool:
        await pool.acp_servers_for(str(ws))

        async def gave_up() -> bool:
            return bool(cell(await snapshot(pool, tmp_path), "flaky")["status"] == "error")

        await eventually(gave_up)
        snap = await snapshot(pool, tmp_path)
        flaky = cell(snap, "flaky")
        assert flaky["errorKind"] == "mcp_server_spawn_failed"
        assert "gave up" in flaky["hint"]
        assert flaky["pool"]["entries"][0]["restarts"] >= 3
        assert cell(snap, "ok")["mcpStatus"] == "connected"  # its sibling is untouched
        assert [s["name"] for s in await pool.acp_servers_for(str(ws))] == ["ok"]


async def test_restart_replaces_the_process_and_publishes_an_event(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    write_settings(ws, {"a": stdio("a")})
    session = Log()
    async with running_pool(tmp_path, live=[session]) as pool:
        await pool.acp_servers_for(str(ws))
        old = pool_pid(await snapshot(pool, tmp_path), "a")
        result = await pool.restart(str(ws), "a", originator="client-1")
        assert result["restarted"] is True and result["serverName"] == "a"
        assert isinstance(result["durationMs"], int) and result["durationMs"] >= 0
        new = pool_pid(await snapshot(pool, tmp_path), "a")
        assert new is not None and new != old
        assert old is not None and not alive(old)
        (event,) = session.of("mcp_server_restarted")
        assert event == {
            "serverName": "a",
            "durationMs": result["durationMs"],
            "originatorClientId": "client-1",
        }
        assert session.events[-1][2] == "client-1"


async def test_restart_activates_an_idle_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    write_settings(ws, {"a": stdio("a")})
    async with running_pool(tmp_path) as pool:
        result = await pool.restart(str(ws), "a")
        assert result["restarted"] is True
        snap = await snapshot(pool, tmp_path)
        assert snap["discoveryState"] == "completed"
        assert cell(snap, "a")["mcpStatus"] == "connected"


async def test_restart_soft_skips_and_refusals(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    write_settings(
        ws,
        {
            "a": stdio("a", "--init-delay-ms", "300"),
            "b": stdio("b"),
            "off": stdio("off"),
            "web": {"url": "https://mcp.example/sse"},
        },
        disabledMcpServers=["off"],
    )
    session = Log()
    async with running_pool(tmp_path, budget=1, mode="enforce", live=[session]) as pool:
        await pool.acp_servers_for(str(ws))
        skipped = await pool.restart(str(ws), "b")
        assert skipped == {
            "serverName": "b",
            "restarted": False,
            "skipped": True,
            "reason": "budget_would_exceed",
        }
        assert (await pool.restart(str(ws), "off"))["reason"] == "disabled"
        with pytest.raises(McpServerNotFound) as missing:
            await pool.restart(str(ws), "nope")
        assert missing.value.reason == "not_configured"

        # Two restarts of one server at once: the pool handles one ask first and starts it
        # (300 ms: the server's init delay); the other finds it in flight and is skipped.
        results: list[dict[str, Any]] = []

        async def restart() -> None:
            results.append(await pool.restart(str(ws), "a"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(restart)
            nursery.start_soon(restart)
        assert sorted(r.get("reason", "done") for r in results) == ["done", "in_flight"]
        refused = [e["reason"] for e in session.of("mcp_server_restart_refused")]
        assert refused == ["budget_would_exceed", "disabled", "in_flight"]

    write_settings(ws, {"web": {"url": "https://mcp.example/sse"}})
    async with running_pool(tmp_path) as pool:
        with pytest.raises(McpServerNotFound) as remote:
            await pool.restart(str(ws), "web")
        assert remote.value.reason == "not_pooled"


# ---- budgets and events --------------------------------------------------------------------


async def test_enforce_refuses_in_declaration_order_with_events(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    write_settings(ws, {"a": stdio("a"), "b": stdio("b"), "c": stdio("c")})
    existing, joining = Log(), Log()
    async with running_pool(tmp_path, budget=2, mode="enforce", live=[existing]) as pool:
        servers = await pool.acp_servers_for(str(ws), requester=joining)
        assert [s["name"] for s in servers] == ["a", "b"]
        for log in (existing, joining):
            (warning,) = log.of("mcp_budget_warning")
            assert warning["budget"] == 2 and warning["thresholdRatio"] == 0.75
            assert warning["mode"] == "enforce" and warning["scope"] == "workspace"
            (batch,) = log.of("mcp_child_refused_batch")
            assert batch["refusedServers"] == [
                {"name": "c", "transport": "stdio", "reason": "budget_exhausted"}
            ]
            assert (batch["liveCount"], batch["reservedCount"], batch["budget"]) == (2, 2, 2)

        snap = await snapshot(pool, tmp_path)
        assert (snap["clientCount"], snap["clientBudget"], snap["budgetMode"]) == (2, 2, "enforce")
        (budget_cell,) = snap["budgets"]
        assert budget_cell["status"] == "error" and budget_cell["refusedCount"] == 1
        c = cell(snap, "c")
        assert (c["status"], c["disabledReason"], c["errorKind"]) == (
            "error",
            "budget",
            "budget_exhausted",
        )
        assert "pool" not in c

        # A later session hears its own refusal; nobody hears a second warning.
        later = Log()
        await pool.acp_servers_for(str(ws), requester=later)
        assert len(later.of("mcp_child_refused_batch")) == 1
        assert later.of("mcp_budget_warning") == []
        assert len(existing.of("mcp_child_refused_batch")) == 1
        assert len(existing.of("mcp_budget_warning")) == 1


async def test_warn_mode_admits_everything_and_warns_once(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    write_settings(ws, {"a": stdio("a"), "b": stdio("b"), "c": stdio("c")})
    session = Log()
    async with running_pool(tmp_path, budget=2, mode="warn", live=[session]) as pool:
        servers = await pool.acp_servers_for(str(ws))
        assert [s["name"] for s in servers] == ["a", "b", "c"]
        await pool.acp_servers_for(str(ws))
        assert len(session.of("mcp_budget_warning")) == 1
        assert session.of("mcp_child_refused_batch") == []
        (budget_cell,) = (await snapshot(pool, tmp_path))["budgets"]
        assert budget_cell["status"] == "warning" and budget_cell["liveCount"] == 3


async def test_off_mode_publishes_nothing(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    write_settings(ws, {"a": stdio("a"), "b": stdio("b")})
    session = Log()
    async with running_pool(tmp_path, live=[session]) as pool:
        await pool.acp_servers_for(str(ws), requester=session)
        assert session.events == []
        snap = await snapshot(pool, tmp_path)
        assert snap["budgets"] == [] and "clientBudget" not in snap
        assert snap["clientCount"] == 2


async def test_without_the_pool_each_session_spawns_its_own(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    write_settings(ws, {"a": stdio("a"), "b": stdio("b")})
    existing = Log()
    async with running_pool(
        tmp_path, budget=1, mode="enforce", pooling=False, live=[existing]
    ) as pool:
        first, second = Log(), Log()
        servers = await pool.acp_servers_for(str(ws), requester=first)
        assert servers == [
            {"name": "a", "command": sys.executable, "args": stdio("a")["args"], "env": []}
        ]
        await pool.acp_servers_for(str(ws), requester=second)
        for log in (first, second):  # per-session accounting: each hears its own pass
            assert [k for k, _, _ in log.events] == [
                "mcp_budget_warning",
                "mcp_child_refused_batch",
            ]
            assert log.of("mcp_budget_warning")[0]["scope"] == "session"
        assert existing.events == []
        snap = await snapshot(pool, tmp_path)
        assert snap["pool"] == {"enabled": False, "entryCount": 0}
        assert cell(snap, "a")["managedBy"] == "agent"
        assert snap["budgets"][0]["scope"] == "session"
        with pytest.raises(McpServerNotFound) as not_pooled:
            await pool.restart(str(ws), "a")
        assert not_pooled.value.reason == "not_pooled"


# ---- failures and reconfiguration ----------------------------------------------------------


async def test_start_failures_are_reported_and_not_handed_out(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    write_settings(
        ws,
        {
            "missing": {"command": str(tmp_path / "no-such-binary")},
            "mute": stdio("mute", "--hang-initialize"),
            "ok": stdio("ok"),
        },
    )
    async with running_pool(tmp_path, handshake_timeout_s=0.5) as pool:
        servers = await pool.acp_servers_for(str(ws))
        assert [s["name"] for s in servers] == ["ok"]
        snap = await snapshot(pool, tmp_path)
        assert cell(snap, "missing")["errorKind"] == "missing_binary"
        assert cell(snap, "mute")["errorKind"] == "init_timeout"
        assert cell(snap, "mute")["mcpStatus"] == "disconnected"
        with pytest.raises(McpRestartFailed) as failed:
            await pool.restart(str(ws), "missing")
        assert failed.value.error_kind == "missing_binary"


async def test_configuration_changes_are_held_until_the_operator_restarts_them(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    write_settings(ws, {"a": stdio("a"), "b": stdio("b")})
    session = Log()
    async with running_pool(tmp_path, live=[session]) as pool:
        await pool.acp_servers_for(str(ws))
        snap = await snapshot(pool, tmp_path)
        a_old, b_old = pool_pid(snap, "a"), pool_pid(snap, "b")
        # Changed and added since the daemon started (an agent may have written the file).
        write_settings(ws, {"a": stdio("a", "--tools", "1"), "c": stdio("c")})
        assert await pool.acp_servers_for(str(ws)) == []
        held = {e["serverName"]: e["reason"] for e in session.of("mcp_server_untrusted")}
        assert held == {"a": "command_changed", "c": "new_server"}
        assert await pool.acp_servers_for(str(ws)) == []
        assert len(session.of("mcp_server_untrusted")) == 2  # said once per config
        assert a_old is not None and not alive(a_old)
        assert b_old is not None and not alive(b_old)
        # The operator's restart vouches for the current command.
        for name in ("a", "c"):
            assert (await pool.restart(str(ws), name))["restarted"] is True
        servers = await pool.acp_servers_for(str(ws))
        assert [s["name"] for s in servers] == ["a", "c"]
        snap = await snapshot(pool, tmp_path)
        assert pool_pid(snap, "a") not in (None, a_old)
        assert cell(snap, "a")["toolCount"] == 1 + 4
        assert [c["name"] for c in snap["servers"]] == ["a", "c"]


async def test_a_server_an_agent_wrote_into_the_settings_never_runs(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    marker = tmp_path / "marker"
    session = Log()
    async with running_pool(tmp_path, live=[session]) as pool:
        await pool.acp_servers_for(str(ws))
        write_settings(ws, {"evil": {"command": "/bin/sh", "args": ["-c", f"id > {marker}"]}})
        assert await pool.acp_servers_for(str(ws)) == []
        (event,) = session.of("mcp_server_untrusted")
        assert event["serverName"] == "evil" and event["command"] == "/bin/sh"
        assert pool_pid(await snapshot(pool, tmp_path), "evil") is None  # no process
        assert not marker.exists()


async def test_untrusted_or_unknown_workspaces_get_nothing(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    write_settings(other, {"a": stdio("a")})
    async with running_pool(tmp_path) as pool:
        assert await pool.acp_servers_for(str(other)) == []
