"""``acp-serve attach``: a stdio ACP agent forwarding to a remote /acp, surviving a cut link.

The bridge reaches the daemon through a TCP proxy in the test that can cut every
connection and refuse new ones for a while: the bridge's streams drop, it reconnects (with
``Last-Event-ID``), and the editor side sees what happened meanwhile exactly once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx
import trio

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import ROOT, DaemonProcess

GUARD_S = 30


class Proxy:
    """127.0.0.1:<port> → the daemon; :meth:`cut` drops every connection."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.open = trio.Event()
        self.open.set()
        self.scopes: set[trio.CancelScope] = set()
        self.accepted = 0

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        async with client:
            if not self.open.is_set():
                return  # refused while the link is "down"
            self.accepted += 1
            with trio.CancelScope() as scope:
                self.scopes.add(scope)
                try:
                    upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
                    async with upstream, trio.open_nursery() as nursery:
                        # The daemon's Host allowlist names its own port: present that.
                        host = (
                            f"127.0.0.1:{self.port}".encode(),
                            f"127.0.0.1:{self.target_port}".encode(),
                        )
                        nursery.start_soon(_copy, client, upstream, nursery.cancel_scope, host)
                        nursery.start_soon(_copy, upstream, client, nursery.cancel_scope, None)
                finally:
                    self.scopes.discard(scope)

    def cut(self) -> None:
        self.open = trio.Event()
        for scope in list(self.scopes):
            scope.cancel()

    def restore(self) -> None:
        self.open.set()


async def _copy(
    src: trio.SocketStream,
    dst: trio.SocketStream,
    scope: trio.CancelScope,
    rewrite: tuple[bytes, bytes] | None,
) -> None:
    try:
        while data := await src.receive_some(65536):
            if rewrite is not None:
                data = data.replace(b"Host: " + rewrite[0], b"Host: " + rewrite[1])
                data = data.replace(b"host: " + rewrite[0], b"host: " + rewrite[1])
            await dst.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    scope.cancel()


class Editor:
    """The editor side of the bridge: newline-delimited JSON-RPC over its stdio."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.buffer = b""
        self.messages: list[dict[str, Any]] = []

    async def send(self, obj: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(json.dumps(obj).encode() + b"\n")

    async def recv(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        with trio.fail_after(GUARD_S):
            while b"\n" not in self.buffer:
                chunk = await self.process.stdout.receive_some(65536)
                assert chunk, "the bridge closed its stdout"
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        msg = json.loads(line)
        self.messages.append(msg)
        return msg  # type: ignore[no-any-return]

    async def request(self, rid: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        await self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while True:
            msg = await self.recv()
            if msg.get("id") == rid and "method" not in msg:
                return msg
            if msg.get("method") == "session/request_permission":
                await self.send(
                    {
                        "jsonrpc": "2.0",
                        "id": msg["id"],
                        "result": {"outcome": {"outcome": "selected", "optionId": "allow"}},
                    }
                )

    def texts(self) -> list[str]:
        return [
            m["params"]["update"]["content"]["text"]
            for m in self.messages
            if m.get("method") == "session/update"
            and m["params"]["update"].get("sessionUpdate") == "agent_message_chunk"
        ]


async def test_attach_survives_a_cut_link(daemon_proc: DaemonProcess) -> None:
    proxy = Proxy(daemon_proc.port)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "serve", "attach", f"http://127.0.0.1:{proxy.port}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            env={"QWEN_SERVER_TOKEN": TOKEN, "PATH": "/usr/bin:/bin"},
        )
        editor = Editor(process)
        try:
            init = await editor.request(1, "initialize", {"protocolVersion": 1})
            assert init["result"]["protocolVersion"] == 1
            cwd = str(daemon_proc.workspace.resolve())
            created = await editor.request(2, "session/new", {"cwd": cwd, "mcpServers": []})
            sid = created["result"]["sessionId"]
            first = await editor.request(
                3, "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "a"}]}
            )
            assert first["result"]["stopReason"] == "end_turn"

            # The link goes down; meanwhile another client runs a turn on the session.
            proxy.cut()
            async with httpx.AsyncClient(
                base_url=daemon_proc.url, headers=AUTH, timeout=30
            ) as rest:
                r = await rest.post(
                    f"/session/{sid}/prompt",
                    json={"prompt": [{"type": "text", "text": "meanwhile"}]},
                )
                assert r.status_code == 200, r.text
            proxy.restore()

            # The bridge reconnected: the turn it missed arrives, and the session still works.
            with trio.fail_after(GUARD_S):
                while "echo: meanwhile" not in editor.texts():
                    await editor.recv()
            after = await editor.request(
                4, "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "b"}]}
            )
            assert after["result"]["stopReason"] == "end_turn"
            assert editor.texts() == ["echo: a", "echo: meanwhile", "echo: b"]
            assert proxy.accepted > 3  # streams and posts came back through the proxy
            closed = await editor.request(5, "session/close", {"sessionId": sid})
            assert closed["result"] == {}
        finally:
            assert process.stdin is not None
            await process.stdin.aclose()
            with trio.fail_after(GUARD_S):
                code = await process.wait()
            nursery.cancel_scope.cancel()
    assert code == 0


async def test_attach_renews_a_connection_the_daemon_forgot() -> None:
    """The link stays down past the idle expiry: the daemon drops the connection and closes
    its session; back online, the bridge initialises a new connection, resumes the session
    (restored from the journal) and carries on."""
    from tests.support.daemon import spawn_daemon

    d = spawn_daemon(env={"QWEN_SERVER_TOKEN": TOKEN, "QWEN_SERVE_ACP_IDLE_TIMEOUT_MS": "300"})
    proxy = Proxy(d.port)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.run)
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "serve", "attach", f"http://127.0.0.1:{proxy.port}"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=ROOT,
                env={"QWEN_SERVER_TOKEN": TOKEN, "PATH": "/usr/bin:/bin"},
            )
            editor = Editor(process)
            try:
                await editor.request(1, "initialize", {"protocolVersion": 1})
                cwd = str(d.workspace.resolve())
                sid = (await editor.request(2, "session/new", {"cwd": cwd}))["result"]["sessionId"]
                first = await editor.request(
                    3,
                    "session/prompt",
                    {"sessionId": sid, "prompt": [{"type": "text", "text": "a"}]},
                )
                assert first["result"]["stopReason"] == "end_turn"
                async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30) as rest:
                    async with rest.stream(
                        "GET", f"/session/{sid}/events", headers={"Accept": "text/event-stream"}
                    ) as watcher:
                        proxy.cut()
                        # Expired: the connection's session is closed.
                        from tests.support.sse import collect_until

                        ended = await collect_until(
                            watcher, lambda e: e.get("type") == "session_closed"
                        )
                        assert ended[-1]["data"]["reason"] == "acp_connection_closed"
                proxy.restore()
                after = await editor.request(
                    4,
                    "session/prompt",
                    {"sessionId": sid, "prompt": [{"type": "text", "text": "b"}]},
                )
                assert after.get("result", {}).get("stopReason") == "end_turn", after
                assert editor.texts()[-1] == "echo: b"
                assert editor.texts().count("echo: a") == 1  # nothing delivered twice
            finally:
                assert process.stdin is not None
                await process.stdin.aclose()
                with trio.fail_after(GUARD_S):
                    code = await process.wait()
                nursery.cancel_scope.cancel()
        assert code == 0
    finally:
        d.stop()
