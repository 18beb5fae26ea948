"""``acp-serve attach``: a stdio ACP agent forwarding to a remote /acp, surviving a cut link.

The bridge reaches the daemon through a TCP proxy in the test that can cut every
connection and refuse new ones for a while: the bridge's streams drop, it reconnects (with
``Last-Event-ID``), and the editor side sees what happened meanwhile exactly once.
"""

from __future__ import annotations

import contextlib
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


async def _bridge(url: str) -> Editor:
    """``serve attach URL`` (the token from the environment) and its editor side."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "serve", "attach", url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env={"QWEN_SERVER_TOKEN": TOKEN, "PATH": "/usr/bin:/bin"},
    )
    return Editor(process)


async def test_attach_survives_a_cut_link(daemon_proc: DaemonProcess) -> None:
    proxy = Proxy(daemon_proc.port)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        editor = await _bridge(f"http://127.0.0.1:{proxy.port}")
        process = editor.process
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
            editor = await _bridge(f"http://127.0.0.1:{proxy.port}")
            process = editor.process
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


class FakeAcp:
    """A hostile stand-in for a daemon's /acp (plain HTTP/1.1 on 127.0.0.1): it answers
    ``initialize``, then its connection stream sends ``frames``; every POST is recorded."""

    def __init__(self, frames: list[dict[str, Any]]) -> None:
        self.frames = frames
        self.port = 0
        self.posts: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.posted = trio.Event()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        # The bridge may reset its connections as it exits (its stdin closed): that ends
        # this connection, not the test.
        with contextlib.suppress(trio.BrokenResourceError):
            await self._serve(stream)

    async def _serve(self, stream: trio.SocketStream) -> None:
        async with stream:
            buffer = b""
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        return
                    buffer += chunk
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                request_line, *lines = head.decode().split("\r\n")
                headers = {k.lower(): v.strip() for k, v in (x.split(":", 1) for x in lines)}
                length = int(headers.get("content-length", "0"))
                while len(buffer) < length:
                    buffer += await stream.receive_some(65536)
                body, buffer = buffer[:length], buffer[length:]
                method = request_line.split(" ")[0]
                if method == "GET":
                    await stream.send_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                        b"connection: close\r\n\r\n"
                    )
                    for frame in self.frames:
                        await stream.send_all(f"data: {json.dumps(frame)}\n\n".encode())
                    await trio.sleep_forever()
                message = json.loads(body) if body else {}
                if method == "POST":
                    self.posts.append((headers, message))
                    self.posted.set()
                    self.posted = trio.Event()
                if message.get("method") == "initialize":
                    reply = json.dumps(
                        {"jsonrpc": "2.0", "id": message["id"], "result": {"protocolVersion": 1}}
                    ).encode()
                    await stream.send_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        b"acp-connection-id: c1\r\ncontent-length: "
                        + str(len(reply)).encode()
                        + b"\r\n\r\n"
                        + reply
                    )
                else:
                    await stream.send_all(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")


async def test_attach_refuses_fs_and_terminal_requests_from_the_daemon(
    tmp_path: Any,
) -> None:
    """The real daemon never sends fs/* or terminal/* to a client; one that does is answered
    -32601 by the bridge and never reaches the editor."""
    fake = FakeAcp(
        [
            {
                "jsonrpc": "2.0",
                "id": "d1",
                "method": "fs/read_text_file",
                "params": {"sessionId": "s1", "path": "/etc/passwd"},
            },
            {
                "jsonrpc": "2.0",
                "id": "d2",
                "method": "terminal/create",
                "params": {"sessionId": "s1", "command": "sh"},
            },
            {"jsonrpc": "2.0", "method": "fs/write_text_file", "params": {"path": "/x"}},
            {"jsonrpc": "2.0", "method": "_qwen/notify", "params": {"kind": "marker"}},
        ]
    )
    token_file = tmp_path / "token"
    token_file.write_text("file-token-123\n")
    async with trio.open_nursery() as nursery:
        await nursery.start(fake.run)
        process = await trio.lowlevel.open_process(
            [
                sys.executable,
                "-m",
                "serve",
                "attach",
                f"http://127.0.0.1:{fake.port}",
                "--token-file",
                str(token_file),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env={"PATH": "/usr/bin:/bin"},
        )
        editor = Editor(process)
        try:
            await editor.request(1, "initialize", {"protocolVersion": 1})
            with trio.fail_after(GUARD_S):
                while not any(m.get("params", {}).get("kind") == "marker" for m in editor.messages):
                    await editor.recv()
                while len(fake.posts) < 3:
                    await fake.posted.wait()
        finally:
            assert process.stdin is not None
            await process.stdin.aclose()
            with trio.fail_after(GUARD_S):
                code = await process.wait()
                assert process.stderr is not None
                stderr = b""
                while chunk := await process.stderr.receive_some(65536):
                    stderr += chunk
            nursery.cancel_scope.cancel()
    assert code == 0
    assert "refused fs/read_text_file" in stderr.decode()
    assert "--token" not in stderr.decode()  # a token file draws no warning
    assert [m.get("method") for m in editor.messages] == [None, "_qwen/notify"]
    answers = {m["id"]: m for _, m in fake.posts if "method" not in m}
    assert set(answers) == {"d1", "d2"}
    assert all(a["error"]["code"] == -32601 for a in answers.values())
    assert all(h["authorization"] == "Bearer file-token-123" for h, _ in fake.posts)


def test_attach_warns_about_a_token_in_argv_and_plain_http_to_another_host() -> None:
    def attach(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "serve", "attach", *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=GUARD_S,
        )
        assert done.returncode == 0, done.stderr
        return done.stderr

    loud = attach("http://192.0.2.7:4170", "--token", "argv-token")
    assert "--token on the command line is visible to other local users" in loud
    assert "plain http:// to a host that is not loopback" in loud
    assert "argv-token" not in loud
    for quiet_url in ("http://127.0.0.1:4170", "http://localhost:4170", "https://192.0.2.7"):
        assert attach(quiet_url) == ""


async def test_attach_passes_on_a_reply_answered_in_the_post(daemon_proc: DaemonProcess) -> None:
    """An editor whose ``clientInfo`` names the qwen SDK gets its replies in the POSTs'
    answers (``serve/acpfront/routing.py``): the bridge passes those on too."""
    editor = await _bridge(daemon_proc.url)
    process = editor.process
    try:
        await editor.request(1, "initialize", {"clientInfo": {"name": "qwen-code-sdk"}})
        health = await editor.request(2, "_qwen/health", {})
        assert health["result"] == {"status": "ok"}
        cwd = str(daemon_proc.workspace.resolve())
        created = await editor.request(3, "session/new", {"cwd": cwd, "mcpServers": []})
        sid = created["result"]["sessionId"]
        assert sid.startswith("sess_")
        # As for a reply on the stream, the bridge opened the new session's stream: a turn
        # another client runs reaches the editor before it names the session itself.
        async with httpx.AsyncClient(base_url=daemon_proc.url, headers=AUTH, timeout=30) as rest:
            r = await rest.post(
                f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "elsewhere"}]}
            )
            assert r.status_code == 200, r.text
        while "echo: elsewhere" not in editor.texts():
            await editor.recv()  # (each wait bounded by GUARD_S)
    finally:
        assert process.stdin is not None
        await process.stdin.aclose()
        with trio.fail_after(GUARD_S):
            code = await process.wait()
    assert code == 0
