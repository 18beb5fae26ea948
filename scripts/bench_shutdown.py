#!/usr/bin/env python3
"""Benchmark how fast and how cleanly SIGTERM ends the daemon: per scenario, the median time
from SIGTERM to the process's exit, the exit codes, and whether every attached event stream
got its terminal frame and an end (EOF) before the exit.

    .venv/bin/python scripts/bench_shutdown.py [--runs 5] [--no-qwen]

Scenarios (each a fresh daemon):

* ``no session``: nothing but the daemon;
* ``keep-alive``: one idle HTTP/1.1 keep-alive connection open (it already got a response);
* ``keep-alive after POST``: the same after a request with a body (``POST /session``);
* ``scripted agent idle``: one session of the scripted agent, idle;
* ``idle /acp conn stream``: one ACP connection (``initialize``) with its SSE stream open;
* ``stalled SSE reader``: a session stream whose reader stopped reading, a 3 MB update
  blocked on its socket (the shutdown must cut it after the graceful timeout, 2 s);
* ``idle qwen --acp``: one session whose agent is the real ``qwen --acp`` (node, from
  ``.cache/node``, pointed at the fake model server as ``tests/support/node.py`` does), idle
  after one prompt, then the same with 1 and 10 ``GET /session/:id/events`` clients;
* ``idle qwen --acp + /acp WebSocket``: the same session made and prompted over one ``/acp``
  WebSocket (``initialize``, ``session/new``, ``session/prompt``), which stays open (its end
  is the close frame);
* ``qwen serve``: the reference daemon ``qwen serve`` in the same three ways, for comparison.

The agent and the reference need ``scripts/install-node-deps``; without node they are skipped.
A stream counts as ended cleanly when it got its terminal frame (``session_died`` for a
session stream, the chunked body's end for an /acp connection stream) and then EOF.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.bench_serve import (  # noqa: E402
    TOKEN,
    Server,
    acp_serve_argv,
    free_port,
    qwen_serve_argv,
    start,
)


def http(server: Server, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(head + body)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, rest = data.partition(b"\r\n\r\n")
        match = re.search(rb"(?i)content-length: *(\d+)", head)
        length = int(match.group(1)) if match else 0
        while len(rest) < length:
            rest += sock.recv(65536)
    return int(head.split(b" ", 2)[1]), rest


def keep_alive_after_post(server: Server) -> socket.socket:
    """A connection that sent a request with a body, got its response and stays open."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    body = b'{"sessionScope":"thread"}'
    sock.sendall(
        f"POST /session HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    got = b""
    while b'"sessionId"' not in got:
        got += sock.recv(65536)
    return sock


def open_stream(server: Server, path: str, *headers: str) -> socket.socket:
    """An SSE request whose response head has arrived; nothing is read after that."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    extra = "".join(f"{h}\r\n" for h in headers)
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nAccept: text/event-stream\r\n{extra}\r\n".encode()
    )
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError(f"GET {path}: closed before the response head")
        got += chunk
    if b" 200 " not in got.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"GET {path}: {got[:200]!r}")
    return sock


class Reader:
    """Reads an attached stream as a real client does (a thread, until EOF or an error),
    keeping the tail, so a large event never leaves the daemon blocked on a full socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.tail = b""
        self.eof = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.sock.settimeout(None)
        try:
            while chunk := self.sock.recv(65536):
                self.tail = (self.tail + chunk)[-65536:]
        except OSError:  # a reset: not a clean end
            return
        self.eof = True

    def ended_cleanly(self, terminal: bytes) -> bool:
        """The terminal frame, then EOF (waited for up to 2 s after the exit)."""
        self.thread.join(2)
        return self.eof and terminal in self.tail


def prompt_once(server: Server, sid: str) -> None:
    """One prompt, waited for on the session's stream until its ``turn_complete``."""
    sock = open_stream(server, f"/session/{sid}/events")
    try:
        body = b'{"prompt":[{"type":"text","text":"hello"}]}'
        status, reply = http(server, "POST", f"/session/{sid}/prompt", body)
        if status not in (200, 202):
            raise RuntimeError(f"prompt: {status} {reply[:200]!r}")
        seen = b""
        deadline = time.monotonic() + 120
        while b"turn_complete" not in seen and b"turn_error" not in seen:
            if time.monotonic() > deadline:
                raise RuntimeError("the prompt did not complete in 120 s")
            seen = seen[-4096:] + sock.recv(65536)
    finally:
        sock.close()


def acp_websocket(server: Server, cwd: Path) -> socket.socket:
    """An /acp WebSocket that made a session and ran one prompt on it, then stays open."""
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, Request, TextMessage

    sock = socket.create_connection(("127.0.0.1", server.port), timeout=120)
    ws = WSConnection(ConnectionType.CLIENT)
    auth = (b"authorization", f"Bearer {TOKEN}".encode())
    sock.sendall(
        ws.send(Request(host=f"127.0.0.1:{server.port}", target="/acp", extra_headers=[auth]))
    )
    accepted = False
    while not accepted:
        data = sock.recv(65536)
        if not data:
            raise RuntimeError("/acp WebSocket refused")
        ws.receive_data(data)
        accepted = any(isinstance(e, AcceptConnection) for e in ws.events())
    text = ""

    def until(predicate: Callable[[dict], bool]) -> dict:
        nonlocal text
        while True:
            for event in ws.events():
                if isinstance(event, TextMessage):
                    text += event.data
                    if event.message_finished:
                        message, text = json.loads(text), ""
                        if predicate(message):
                            return message
            data = sock.recv(65536)
            if not data:
                raise RuntimeError("/acp WebSocket closed")
            ws.receive_data(data)

    def call(rid: int, method: str, params: dict) -> dict:
        sock.sendall(
            ws.send(
                TextMessage(
                    json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
                )
            )
        )
        reply = until(lambda m: m.get("id") == rid)
        if "result" not in reply:
            raise RuntimeError(f"{method}: {reply}")
        return reply["result"]

    call(1, "initialize", {"protocolVersion": 1})
    sid = call(2, "session/new", {"cwd": str(cwd), "mcpServers": []})["sessionId"]
    call(3, "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "hello"}]})
    return sock


def keep_alive(server: Server) -> socket.socket:
    """A connection that got one response and stays open, idle."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
    got = b""
    while b'{"status":"ok"}' not in got:
        got += sock.recv(4096)
    return sock


def stop_time_ms(server: Server) -> tuple[float, int | None]:
    """SIGTERM, then the time to the exit (ms) and the exit code (None: killed after 30 s)."""
    t0 = time.monotonic()
    os.kill(server.proc.pid, signal.SIGTERM)
    try:
        code: int | None = server.proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        return float("inf"), None
    elapsed = (time.monotonic() - t0) * 1000
    try:  # whatever the daemon left of its group (it should leave nothing)
        os.killpg(server.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return elapsed, code


#: What a scenario leaves attached: (socket, the terminal frame its stream must get, or
#: None for a plain connection, not a stream).
Held = list[tuple[socket.socket, bytes | None]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-qwen", action="store_true", help="skip the node scenarios")
    parser.add_argument("--qwen-cli", type=Path, default=None, help="qwen's cli.js elsewhere")
    parser.add_argument("--only", default="", help="run only scenarios whose name has this")
    args = parser.parse_args()

    from tests.support.fake_openai import FakeOpenAI
    from tests.support.node import qwen_acp_argv, qwen_cli, qwen_env

    tmp = Path(tempfile.mkdtemp(prefix="bench-shutdown-"))
    workspace = tmp / "ws"
    workspace.mkdir()
    cli = None if args.no_qwen or not shutil.which("node") else (args.qwen_cli or qwen_cli())
    results: dict[str, list[tuple[float, int | None, int, int]]] = {}
    died = b"session_died"
    with FakeOpenAI(workdir=str(workspace)) as model:
        env = qwen_env(tmp / "home", model.env())
        env["QWEN_SERVER_TOKEN"] = TOKEN
        qwen_agent = " ".join(qwen_acp_argv(cli)) if cli is not None else None

        def acp_serve(run: int, agent: str | None) -> Server:
            port = free_port()
            # One state directory for every run, as a daemon restarted in place has: a node
            # agent's compile-cache probe runs once (prime()), not in every measured run.
            argv = acp_serve_argv(workspace, tmp / "state", port, agent)
            argv += ["--initialize-timeout-ms", "60000"]  # (a busy machine starts node slowly)
            return start("acp-serve", argv, env, port, ROOT)

        def new_session(server: Server) -> str:
            status, body = http(server, "POST", "/session", b'{"sessionScope":"thread"}')
            if status != 200:
                raise RuntimeError(f"POST /session: {status} {body[:200]!r}")
            return str(json.loads(body)["sessionId"])

        def with_session(server: Server) -> Held:
            new_session(server)
            return []

        def prompted(clients: int) -> Callable[[Server], Held]:
            def prepare(server: Server) -> Held:
                sid = new_session(server)
                prompt_once(server, sid)
                return [
                    (open_stream(server, f"/session/{sid}/events"), died) for _ in range(clients)
                ]

            return prepare

        def acp_connection(server: Server) -> Held:
            init = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}'
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
            sock.sendall(
                f"POST /acp HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(init)}\r\nConnection: close\r\n\r\n".encode()
                + init
            )
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(65536)
            sock.close()
            match = re.search(rb"(?i)acp-connection-id: *([^\r]+)", head)
            if match is None:
                raise RuntimeError(f"initialize: {head[:200]!r}")
            conn = match.group(1).decode()
            return [(open_stream(server, "/acp", f"Acp-Connection-Id: {conn}"), b"\r\n0\r\n\r\n")]

        def stalled_reader(server: Server) -> Held:
            """A stream whose reader stopped reading, with a 3 MB update blocked on it."""
            sid = new_session(server)
            sock = open_stream(server, f"/session/{sid}/events")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            body = json.dumps({"prompt": [{"type": "text", "text": "x" * 3_000_000}]})
            http(server, "POST", f"/session/{sid}/prompt", body.encode())
            return [(sock, None)]

        def websocket(server: Server) -> Held:
            return [(acp_websocket(server, workspace.resolve()), b"\x88")]  # a close frame

        def held(sock: socket.socket) -> Held:
            return [(sock, None)]

        scenarios: list[tuple[str, Callable[[int], Server], Callable[[Server], Held]]] = [
            ("acp-serve, no session", lambda r: acp_serve(r, None), lambda s: []),
            (
                "acp-serve, idle keep-alive conn",
                lambda r: acp_serve(r, None),
                lambda s: held(keep_alive(s)),
            ),
            (
                "acp-serve, keep-alive after POST",
                lambda r: acp_serve(r, None),
                lambda s: held(keep_alive_after_post(s)),
            ),
            ("acp-serve, scripted agent idle", lambda r: acp_serve(r, None), with_session),
            ("acp-serve, scripted + 10 SSE", lambda r: acp_serve(r, None), prompted(10)),
            ("acp-serve, idle /acp conn stream", lambda r: acp_serve(r, None), acp_connection),
            ("acp-serve, stalled SSE reader", lambda r: acp_serve(r, None), stalled_reader),
        ]
        if cli is not None and qwen_agent is not None:
            agent = qwen_agent

            def reference(_: int) -> Server:
                port = free_port()
                return start("qwen-serve", qwen_serve_argv(cli, workspace, port), env, port, tmp)

            for clients in (0, 1, 10):
                label = "idle after a prompt" if not clients else f"+ {clients} SSE"
                scenarios.append(
                    (
                        f"acp-serve, qwen --acp {label}",
                        lambda r: acp_serve(r, agent),
                        prompted(clients),
                    )
                )
                scenarios.append((f"qwen serve, {label}", reference, prompted(clients)))
            scenarios.append(
                ("acp-serve, qwen --acp + /acp WebSocket", lambda r: acp_serve(r, agent), websocket)
            )

        def prime(agent: str) -> None:
            """One unmeasured life that lets the compile-cache probe finish (its stamp)."""
            server = acp_serve(0, agent)
            try:
                stamp = tmp / "state" / "node-compile-cache" / ".acp-serve-stamp"
                deadline = time.monotonic() + 120
                while not stamp.exists() and time.monotonic() < deadline:
                    time.sleep(0.2)
            finally:
                server.stop()

        if qwen_agent is not None and (not args.only or "qwen" in args.only):
            prime(qwen_agent)
        for name, make, prepare in scenarios:
            if args.only and args.only not in name:
                continue
            for run in range(args.runs):
                server = make(run)
                streams: Held = []
                try:
                    streams = prepare(server)
                    readers = [(Reader(sock), end) for sock, end in streams if end is not None]
                    time.sleep(0.3)  # let the agent settle into idleness
                    elapsed, code = stop_time_ms(server)
                    clean = sum(reader.ended_cleanly(end) for reader, end in readers)
                    expected = len(readers)
                    results.setdefault(name, []).append((elapsed, code, clean, expected))
                except (RuntimeError, OSError) as exc:  # e.g. a session that never started
                    print(f"  {name}: run {run} failed: {exc}", file=sys.stderr)
                finally:
                    for sock, _ in streams:
                        sock.close()
                    server.stop()
    print(f"SIGTERM to exit, median of {args.runs} runs (ms); exit codes; streams ended cleanly")
    for name, values in results.items():
        times = [v[0] for v in values]
        runs = sorted(round(v) for v in times)
        codes = sorted({str(v[1]) for v in values})
        clean = sum(v[2] for v in values)
        expected = sum(v[3] for v in values)
        streams = f"{clean}/{expected}" if expected else "-"
        print(
            f"  {name:<40}{statistics.median(times):>8.0f}   exit {','.join(codes):<5}"
            f" streams {streams:<7} runs: {runs}"
        )
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
