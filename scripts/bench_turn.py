#!/usr/bin/env python3
"""The daemon's own cost per turn: the same agent driven directly over its stdio, beside
acp-serve (and ``qwen serve`` for ``qwen --acp``), the prompts interleaved one by one.

    .venv/bin/python scripts/bench_turn.py [--agents scripted,qwen] [--prompts 300]
        [--runs 1] [--acp-flags "--warm-agents 0"]

Per agent, one process of each kind lives through the run, each with one session made and
prompted once (warm-up): ``direct`` is the agent spawned by this script (``initialize``,
``session/new``, then ``session/prompt`` "hi N" over JSON-RPC lines on its stdio, a
blocking client with no event loop: the floor); ``acp`` is acp-serve (``--no-journal``
like the other rows of ``scripts/bench_round.py``; ``--acp-flags`` adds flags) answering
``POST /session/:id/prompt`` when the turn ends (``--prompt-response blocking``, the
default), on one keep-alive connection; ``acp-sse`` is the same daemon with ``Prefer:
respond-async`` and the turn's ``turn_complete`` read from the session's SSE stream, and
``qwen`` is ``qwen serve`` measured that way (its POST answers 202 at admission). The
clients are raw sockets with the requests pre-built (a few µs each). Then one prompt per
kind in turn, ``--prompts`` times, so the machine's load falls on all of them alike.

Printed per agent: p50 and p99 of each kind, the daemon's own cost per turn,
``acp - direct`` (p50 minus p50, p99 minus p99), and the daemon's CPU per blocking turn
(``daemon_cpu_ms``, the mean over its threads' ``schedstat``: steady on a busy machine,
where the wall-clock difference is not). ``--acp-root DIR`` runs the daemon of another
source tree (e.g. ``git archive main`` unpacked): before/after. Both daemons run the agent
against the fake model of ``tests/support/fake_openai.py``; the scripted agent needs none.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_density import (  # noqa: E402
    TOKEN,
    acp_serve_argv,
    free_port,
    qwen_serve_argv,
    start,
    stop,
)

SCRIPTED = f"{shlex.quote(sys.executable)} -m acp.agents.scripted"


class Direct:
    """An ACP agent on this process's pipes: JSON-RPC lines, blocking reads."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.next_id = 0
        self.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        self.session = self.call("session/new", {"cwd": str(cwd), "mcpServers": []})["sessionId"]

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        want = self.next_id
        line = {"jsonrpc": "2.0", "id": want, "method": method, "params": params}
        self.stdin.write(json.dumps(line).encode() + b"\n")
        self.stdin.flush()
        while True:
            raw = self.stdout.readline()
            if not raw:
                raise EOFError(f"agent exited during {method}")
            msg = json.loads(raw)
            if "method" in msg:
                if "id" in msg:  # a request to the client (e.g. qwen's vendor methods)
                    err = {"code": -32601, "message": "Method not found"}
                    reply = {"jsonrpc": "2.0", "id": msg["id"], "error": err}
                    self.stdin.write(json.dumps(reply).encode() + b"\n")
                    self.stdin.flush()
                continue  # notifications (session/update...)
            if msg.get("id") == want:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg["result"]
                return result

    def prompt(self, text: str) -> float:
        t0 = time.perf_counter()
        self.call(
            "session/prompt",
            {"sessionId": self.session, "prompt": [{"type": "text", "text": text}]},
        )
        return (time.perf_counter() - t0) * 1000

    def close(self) -> None:
        self.stdin.close()
        try:
            self.proc.wait(3)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` so far (``schedstat``: ns, not 10 ms ticks)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            pass
    return total


def _request(port: int, method: str, path: str, body: bytes = b"", extra: str = "") -> bytes:
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n"
        f"Content-Type: application/json\r\n{extra}\r\n"
    )
    return head.encode() + body


class Http:
    """One keep-alive connection to a daemon with one session, and its SSE stream."""

    def __init__(self, port: int, pid: int = 0) -> None:
        self.port = port
        self.pid = pid  # the daemon's, to count its CPU per blocking turn (0: not)
        self.cpu_ms: list[float] = []
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        body = json.dumps({"sessionScope": "thread"}).encode()
        status, reply = self.exchange(_request(port, "POST", "/session", body))
        if status != 200:
            raise RuntimeError(f"create: {status} {reply[:200]!r}")
        self.session = json.loads(reply)["sessionId"]
        self.events: socket.socket | None = None
        self.sse = bytearray()

    def _fill(self, sock: socket.socket, buf: bytearray) -> None:
        data = sock.recv(65536)
        if not data:
            raise EOFError("connection closed")
        buf += data

    def _reconnect(self) -> None:
        self.sock.close()
        self.sock = socket.create_connection(("127.0.0.1", self.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf.clear()

    def exchange(self, req: bytes) -> tuple[int, bytes]:
        buf = self.buf
        try:
            self.sock.sendall(req)
            self._fill(self.sock, buf)
        except (EOFError, OSError):  # closed while idle (keep-alive timeout): once more
            self._reconnect()
            self.sock.sendall(req)
        while b"\r\n\r\n" not in buf:
            self._fill(self.sock, buf)
        end = buf.index(b"\r\n\r\n") + 4
        head = bytes(buf[:end]).lower()
        status = int(head.split(b" ", 2)[1])
        if b"connection: close" in head:  # (hypercorn: 1,000 requests per connection)
            try:
                return status, self._body(head, end)
            finally:
                self._reconnect()
        return status, self._body(head, end)

    def _body(self, head: bytes, end: int) -> bytes:
        buf = self.buf
        if b"transfer-encoding: chunked" in head:
            while b"\r\n0\r\n\r\n" not in buf[end - 2 :]:
                self._fill(self.sock, buf)
            stop_at = buf.index(b"\r\n0\r\n\r\n", end - 2) + 7
            body = bytes(buf[end:stop_at])
            del buf[:stop_at]
            return body
        match = re.search(rb"content-length: *(\d+)", head)
        length = int(match.group(1)) if match else 0
        while len(buf) < end + length:
            self._fill(self.sock, buf)
        body = bytes(buf[end : end + length])
        del buf[: end + length]
        return body

    def prompt_request(self, text: str, respond_async: bool) -> bytes:
        body = json.dumps({"prompt": [{"type": "text", "text": text}]}).encode()
        extra = "Prefer: respond-async\r\n" if respond_async else ""
        return _request(self.port, "POST", f"/session/{self.session}/prompt", body, extra)

    def prompt(self, text: str) -> float:
        """Blocking POST: answered when the turn ends (the daemon's CPU is counted)."""
        req = self.prompt_request(text, False)
        cpu0 = cpu_ns(self.pid) if self.pid else 0
        t0 = time.perf_counter()
        status, body = self.exchange(req)
        elapsed = (time.perf_counter() - t0) * 1000
        if self.pid:
            self.cpu_ms.append((cpu_ns(self.pid) - cpu0) / 1e6)
        if status != 200:
            raise RuntimeError(f"prompt: {status} {body[:200]!r}")
        return elapsed

    def prompt_sse(self, text: str) -> float:
        """POST with ``Prefer: respond-async``, timed to ``turn_complete`` on SSE."""
        if self.events is None:
            self.events = socket.create_connection(("127.0.0.1", self.port))
            self.events.sendall(
                _request(
                    self.port,
                    "GET",
                    f"/session/{self.session}/events",
                    b"",
                    "Accept: text/event-stream\r\n",
                )
            )
        req = self.prompt_request(text, True)
        t0 = time.perf_counter()
        status, body = self.exchange(req)
        if status not in (200, 202):
            raise RuntimeError(f"prompt: {status} {body[:200]!r}")
        prompt_id = json.loads(body).get("promptId") if body else None
        mark = json.dumps(prompt_id).encode() if prompt_id else b""
        while True:
            while b"\n\n" in self.sse:  # one SSE event at a time: its own terminal only
                end = self.sse.index(b"\n\n") + 2
                event = bytes(self.sse[:end])
                del self.sse[:end]
                if b"turn_error" in event and mark in event:
                    raise RuntimeError(f"turn_error: {event[:300]!r}")
                if b"turn_complete" in event and mark in event:
                    return (time.perf_counter() - t0) * 1000
            self._fill(self.events, self.sse)

    def close(self) -> None:
        self.sock.close()
        if self.events is not None:
            self.events.close()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(
    agent: str,
    env: dict[str, str],
    workspace: Path,
    tmp: Path,
    prompts: int,
    acp_flags: list[str],
    cli: Path | None,
    acp_root: Path | None = None,
) -> dict[str, float]:
    """One run for ``agent`` ("scripted" or "qwen"): the figures of every kind."""
    if agent == "scripted":
        agent_cmd = SCRIPTED
    else:
        from tests.support.node import qwen_acp_argv

        assert cli is not None
        agent_cmd = shlex.join(qwen_acp_argv(cli))
    procs: list[subprocess.Popen[str]] = []
    clients: dict[str, Any] = {}
    try:
        port = free_port()
        argv = acp_serve_argv(
            workspace, tmp / f"state-{time.monotonic_ns()}", port, agent_cmd, acp_flags
        )
        procs.append(start(argv, env, port, acp_root or ROOT, tmp / f"acp-{port}.log"))
        clients["acp"] = Http(port, procs[-1].pid)
        clients["acp-sse"] = Http(port)  # its own session: the blocking one has no reader
        if agent == "qwen" and cli is not None:
            qport = free_port()
            procs.append(
                start(
                    qwen_serve_argv(cli, workspace, qport),
                    env,
                    qport,
                    workspace,
                    tmp / f"qwen-{qport}.log",
                )
            )
            clients["qwen"] = Http(qport)
        clients["direct"] = Direct(shlex.split(agent_cmd), env, workspace)
        kinds: dict[str, Any] = {
            "direct": clients["direct"].prompt,
            "acp": clients["acp"].prompt,
            "acp-sse": clients["acp-sse"].prompt_sse,
        }
        if "qwen" in clients:
            kinds["qwen"] = clients["qwen"].prompt_sse
        for fn in kinds.values():  # warm-up: the first turns load code paths
            for i in range(5):
                fn(f"warm {i}")
        times: dict[str, list[float]] = {k: [] for k in kinds}
        for i in range(prompts):
            for kind, fn in kinds.items():
                times[kind].append(fn(f"hi {i}"))
    finally:
        for client in clients.values():
            client.close()
        for proc in procs:
            stop(proc)
    out: dict[str, float] = {}
    for kind, values in times.items():
        out[f"{kind}_p50_ms"] = statistics.median(values)
        out[f"{kind}_p99_ms"] = pct(values, 0.99)
    out["cost_p50_ms"] = out["acp_p50_ms"] - out["direct_p50_ms"]
    out["daemon_cpu_ms"] = statistics.mean(clients["acp"].cpu_ms)
    out["cost_p99_ms"] = out["acp_p99_ms"] - out["direct_p99_ms"]
    return out


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", default="scripted,qwen")
    parser.add_argument("--prompts", type=int, default=300)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--acp-flags", default="--warm-agents 0")
    parser.add_argument(
        "--acp-root", default=None, help="run the acp-serve of this source tree (before/after)"
    )
    args = parser.parse_args()

    from tests.support.fake_openai import FakeOpenAI
    from tests.support.node import ensure_qwen, qwen_env

    agents = args.agents.split(",")
    cli = ensure_qwen() if "qwen" in agents else None
    tmp = Path(tempfile.mkdtemp(prefix="bench-turn-"))
    workspace = tmp / "ws"
    workspace.mkdir()
    print(f"load average at start: {loadavg()}", file=sys.stderr)
    results: dict[str, list[dict[str, float]]] = {}
    with FakeOpenAI(workdir=str(workspace)) as model:
        env = qwen_env(tmp / "home", model.env())
        env["QWEN_SERVER_TOKEN"] = TOKEN
        for run in range(args.runs):
            for agent in agents:
                got = measure(
                    agent,
                    env,
                    workspace,
                    tmp,
                    args.prompts,
                    shlex.split(args.acp_flags),
                    cli,
                    Path(args.acp_root) if args.acp_root else None,
                )
                results.setdefault(agent, []).append(got)
                shown = ", ".join(f"{k} {v:.3f}" for k, v in got.items())
                print(f"run {run + 1} {agent}: {shown}", file=sys.stderr)
    print(f"load average at the end: {loadavg()}", file=sys.stderr)
    for agent, runs in results.items():
        keys = runs[0].keys()
        med = {k: statistics.median(r[k] for r in runs) for k in keys}
        print(f"\n{agent} (median of {len(runs)} run(s) x {args.prompts} prompts), ms")
        for k in keys:
            print(f"  {k:<16} {med[k]:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
