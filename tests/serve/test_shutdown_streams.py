"""SIGTERM with clients attached (issue 22 item 13), against the real daemon process.

Every event stream gets its terminal frame and is closed, idle keep-alive connections are
closed, then the listener stops and the process exits 0. The daemon runs with a 60 s
``--http-graceful-timeout-ms``: a connection the drain leaves open would hold the exit past
the shutdown bound (5 s, logged) or past the hard-exit bound (7 s, exit code 1).
"""

from __future__ import annotations

import json
import re
import signal
import socket

import httpx
import trio
from wsproto.events import CloseConnection

from tests.acpfront.helpers import Ws, WsClosed
from tests.conftest import AUTH, TOKEN
from tests.support.daemon import spawn_daemon

LONG_GRACE = ["--http-graceful-timeout-ms", "60000"]
CHUNKED_END = b"0\r\n\r\n"  # the end of a chunked body


def _request(port: int, head: str, body: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        f"{head}\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {TOKEN}\r\n".encode()
        + (
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n" if body else ""
        ).encode()
        + b"\r\n"
        + body
    )
    return sock


def _read_until(sock: socket.socket, marker: bytes) -> bytes:
    got = b""
    while marker not in got:
        chunk = sock.recv(65536)
        assert chunk, f"closed before {marker!r}: {got[-300:]!r}"
        got += chunk
    return got


def _read_to_eof(sock: socket.socket) -> bytes:
    """Everything up to the daemon's close (the test fails on a read timeout)."""
    sock.settimeout(10)
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    return got


def _response(sock: socket.socket) -> bytes:
    """One whole response with a Content-Length (head and body); the socket is closed."""
    got = _read_until(sock, b"\r\n\r\n")
    head, _, body = got.partition(b"\r\n\r\n")
    match = re.search(rb"(?i)content-length: *(\d+)", head)
    length = int(match.group(1)) if match else 0
    while len(body) < length:
        body += sock.recv(65536)
    sock.close()
    return head + b"\r\n\r\n" + body


def _stream(port: int, path: str, *headers: str) -> socket.socket:
    extra = "".join(f"\r\n{h}" for h in headers)
    sock = _request(port, f"GET {path} HTTP/1.1\r\nAccept: text/event-stream{extra}")
    head = _read_until(sock, b"retry: 3000")
    assert head.startswith(b"HTTP/1.1 200"), head[:300]
    return sock


async def _connected_clients(client: httpx.AsyncClient, expected: int) -> None:
    with trio.fail_after(10):
        while True:
            health = (await client.get("/health", params={"deep": "1"})).json()
            if health["connectedClients"] == expected:
                return
            await trio.sleep(0.05)


async def test_sigterm_ends_every_event_stream_closes_idle_connections_and_exits_0() -> None:
    daemon = spawn_daemon(LONG_GRACE, env={"QWEN_SERVER_TOKEN": TOKEN})
    socks: list[socket.socket] = []
    try:
        port = daemon.port
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            # Three REST event streams of one session.
            rest = [_stream(port, f"/session/{sid}/events") for _ in range(3)]
            socks += rest
            # A keep-alive connection that sent a request with a body and got its answer.
            idle = _request(port, f"POST /session/{sid}/heartbeat HTTP/1.1", b"{}")
            _read_until(idle, b"lastSeenAt")
            socks.append(idle)
            # An ACP connection: its connection stream and one session's stream.
            init = _request(
                port,
                "POST /acp HTTP/1.1",
                json.dumps(
                    {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}
                ).encode(),
            )
            head = _response(init)
            match = re.search(rb"(?i)acp-connection-id: *([^\r]+)", head)
            assert match is not None, head[:300]
            conn_header = f"Acp-Connection-Id: {match.group(1).decode()}"
            acp_conn = _stream(port, "/acp", conn_header)
            socks.append(acp_conn)
            new = _request(
                port,
                f"POST /acp HTTP/1.1\r\n{conn_header}",
                json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "session/new",
                        "params": {"cwd": str(daemon.workspace), "mcpServers": []},
                    }
                ).encode(),
            )
            assert _response(new).startswith(b"HTTP/1.1 202")
            reply = _read_until(acp_conn, b'"sessionId"')
            acp_sid = re.search(rb'"sessionId": *"([^"]+)"', reply)
            assert acp_sid is not None
            acp_session = _stream(
                port, "/acp", conn_header, f"Acp-Session-Id: {acp_sid.group(1).decode()}"
            )
            socks.append(acp_session)
            # ACP over a WebSocket.
            ws = await Ws.connect(port, headers={"Authorization": f"Bearer {TOKEN}"})
            await ws.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}})
            assert "result" in await ws.recv()
            await _connected_clients(client, 5)

        closed: list[int] = []

        async def ws_client() -> None:
            """Reads the WebSocket as a client does, and answers the server's close."""
            try:
                while True:
                    await ws.recv()
            except WsClosed as exc:
                closed.append(exc.code)
                await ws.stream.send_all(ws.conn.send(CloseConnection(code=exc.code)))
            await ws.abort()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ws_client)
            code = await trio.to_thread.run_sync(daemon.stop, signal.SIGTERM, 30.0)
        assert code == 0, daemon.stderr()[-3000:]
        assert closed == [1000]
        assert "shutdown reached its" not in daemon.stderr(), daemon.stderr()[-4000:]

        for sock in rest:
            data = _read_to_eof(sock)
            assert b"event: session_died" in data and b'"reason":"daemon_shutdown"' in data
            assert data.endswith(CHUNKED_END), data[-300:]
        assert _read_to_eof(idle) == b""
        assert _read_to_eof(acp_conn).endswith(CHUNKED_END)
        data = _read_to_eof(acp_session)
        assert b"daemon_shutdown" in data, data[-500:]
        assert data.endswith(CHUNKED_END), data[-300:]
    finally:
        for sock in socks:
            sock.close()
        daemon.stop(signal.SIGKILL)


def test_sigterm_closes_a_keep_alive_connection_that_sent_a_body() -> None:
    """The connection is idle after its response (hypercorn's keep-alive task runs), so the
    drain closes it instead of waiting out the graceful timeout."""
    daemon = spawn_daemon(LONG_GRACE)
    try:
        sock = _request(daemon.port, "POST /session HTTP/1.1", b"{}")
        _read_until(sock, b'"sessionId"')
        code = daemon.stop(signal.SIGTERM, timeout_s=30)
        assert code == 0, daemon.stderr()[-3000:]
        assert "shutdown reached its" not in daemon.stderr(), daemon.stderr()[-4000:]
        assert _read_to_eof(sock) == b""
        sock.close()
    finally:
        daemon.stop(signal.SIGKILL)


async def test_sigterm_with_a_reader_that_stopped_reading_still_exits_0() -> None:
    """A write blocked on a full socket cannot be cancelled (hypercorn shields it), so it
    held the listener past the hard-exit bound: exit 1. After the graceful timeout the
    connections still open are shut down, the blocked write fails, and the exit is clean."""
    daemon = spawn_daemon(env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            stuck = socket.create_connection(("127.0.0.1", daemon.port))
            stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stuck.sendall(
                f"GET /session/{sid}/events HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\n"
                f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
            )
            await _connected_clients(client, 1)
            r = await client.post(
                f"/session/{sid}/prompt",
                # Echoed back as one 3 MB update: more than the socket buffers hold.
                json={"prompt": [{"type": "text", "text": "x" * 3_000_000}]},
            )
            assert r.status_code == 200
        code = await trio.to_thread.run_sync(daemon.stop, signal.SIGTERM, 30.0)
        assert code == 0, daemon.stderr()[-3000:]
        assert "shutdown reached its" not in daemon.stderr(), daemon.stderr()[-3000:]
        stuck.close()
    finally:
        daemon.stop(signal.SIGKILL)
