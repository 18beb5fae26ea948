#!/usr/bin/env python3
"""Benchmark the daemon: cold start, idle RSS, /health and /capabilities latency and
throughput, SSE fan-out. Prints medians, and acp-serve/qwen-serve ratios when the reference
``qwen serve`` (npm @qwen-code/qwen-code, installed by scripts/install-node-deps) is present.

    .venv/bin/python scripts/bench_serve.py [--runs 3] [--agent "CMD"] [--no-qwen]

Clients are raw sockets (a trio program with pre-built requests), so the client's own cost
stays far below the server's. ``--agent`` puts both daemons in front of the same ACP agent
command (e.g. the real ``qwen --acp`` with the fake model server) so only the daemons differ.
The fan-out measurement needs an agent that understands ``[flood N]`` (the scripted agent).
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
import time
from dataclasses import dataclass
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOKEN = "bench-token-0123456789"
READY = re.compile(r"listening on (https?://\S+)")


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[str]
    url: str
    host: str
    port: int
    started_s: float

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def wait_health(host: str, port: int, deadline: float) -> None:
    request = f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1) as sock:
                sock.sendall(request)
                if b" 200 " in sock.recv(4096):
                    return
        except OSError:
            pass
        time.sleep(0.005)
    raise RuntimeError("server did not answer /health in time")


def start(name: str, argv: list[str], env: dict[str, str], port: int, cwd: Path) -> Server:
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    wait_health("127.0.0.1", port, t0 + 60)
    started = time.monotonic() - t0
    return Server(name, proc, f"http://127.0.0.1:{port}", "127.0.0.1", port, started)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def tree_rss_mib(pid: int) -> float:
    """RSS of the process and its descendants (qwen serve relaunches itself)."""
    total = 0.0
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            total += rss_mib(p)
        except OSError:
            pass
        stack.extend(children.get(p, []))
    return total


# ---- raw HTTP client -------------------------------------------------------------------------


def request_bytes(server: Server, method: str, path: str, body: bytes = b"") -> bytes:
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {server.host}:{server.port}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n"
        "Content-Type: application/json\r\n\r\n"
    )
    return head.encode() + body


async def read_response(stream: trio.SocketStream, buf: bytearray) -> int:
    while b"\r\n\r\n" not in buf:
        data = await stream.receive_some(65536)
        if not data:
            raise EOFError
        buf += data
    head_end = buf.index(b"\r\n\r\n") + 4
    head = bytes(buf[:head_end]).lower()
    status = int(head.split(b" ", 2)[1])
    match = re.search(rb"content-length: *(\d+)", head)
    length = int(match.group(1)) if match else 0
    while len(buf) < head_end + length:
        data = await stream.receive_some(65536)
        if not data:
            raise EOFError
        buf += data
    del buf[: head_end + length]
    return status


async def latencies(server: Server, path: str, n: int) -> list[float]:
    req = request_bytes(server, "GET", path)
    out: list[float] = []
    stream = await trio.open_tcp_stream(server.host, server.port)
    buf = bytearray()
    for _ in range(n):
        t0 = time.perf_counter()
        try:
            await stream.send_all(req)
            await read_response(stream, buf)
        except (EOFError, trio.BrokenResourceError):
            await stream.aclose()
            stream = await trio.open_tcp_stream(server.host, server.port)
            buf = bytearray()
            continue
        out.append((time.perf_counter() - t0) * 1000)
    await stream.aclose()
    return out


async def throughput(server: Server, path: str, connections: int, seconds: float) -> float:
    req = request_bytes(server, "GET", path)
    done = 0
    deadline = trio.current_time() + seconds

    async def worker() -> None:
        nonlocal done
        stream = await trio.open_tcp_stream(server.host, server.port)
        buf = bytearray()
        while trio.current_time() < deadline:
            try:
                await stream.send_all(req)
                await read_response(stream, buf)
                done += 1
            except (EOFError, trio.BrokenResourceError):
                await stream.aclose()
                stream = await trio.open_tcp_stream(server.host, server.port)
                buf = bytearray()
        await stream.aclose()

    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(worker)
    return done / (trio.current_time() - t0)


async def post_json(server: Server, path: str, body: dict, headers: str = "") -> dict:
    data = json.dumps(body).encode()
    req = request_bytes(server, "POST", path, data)
    if headers:
        req = req.replace(b"\r\n\r\n", ("\r\n" + headers + "\r\n\r\n").encode(), 1)
    stream = await trio.open_tcp_stream(server.host, server.port)
    buf = bytearray()
    await stream.send_all(req)
    while b"\r\n\r\n" not in buf:
        buf += await stream.receive_some(65536)
    head_end = buf.index(b"\r\n\r\n") + 4
    length = int(re.search(rb"(?i)content-length: *(\d+)", buf[:head_end]).group(1))  # type: ignore[union-attr]
    while len(buf) < head_end + length:
        buf += await stream.receive_some(65536)
    await stream.aclose()
    return json.loads(bytes(buf[head_end : head_end + length]) or b"{}")  # type: ignore[no-any-return]


async def fanout(server: Server, subscribers: int, flood: int) -> tuple[float, int, int]:
    """[flood N] to ``subscribers`` SSE readers: (frames/s in total, evicted, frames)."""
    session = await post_json(server, "/session", {"sessionScope": "thread"})
    sid = session["sessionId"]
    ready = trio.Event()
    connected = 0
    counts = [0] * subscribers
    evicted = 0
    first_at: list[float] = []
    last_at: list[float] = []

    async def reader(i: int) -> None:
        nonlocal connected, evicted
        stream = await trio.open_tcp_stream(server.host, server.port)
        await stream.send_all(
            f"GET /session/{sid}/events?maxQueued=2048 HTTP/1.1\r\n"
            f"Host: {server.host}:{server.port}\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Accept: text/event-stream\r\n\r\n".encode()
        )
        connected += 1
        if connected == subscribers:
            ready.set()
        tail = b""
        while True:
            data = await stream.receive_some(262144)
            if not data:
                break
            if not first_at:
                first_at.append(time.perf_counter())
            chunk = tail + data
            counts[i] += chunk.count(b"\ndata: ") - tail.count(b"\ndata: ")
            if b"client_evicted" in chunk:
                evicted += 1
                break
            if b"event: turn_complete" in chunk:
                break
            tail = chunk[-64:]
        last_at.append(time.perf_counter())
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        for i in range(subscribers):
            nursery.start_soon(reader, i)
        await ready.wait()
        await trio.sleep(0.3)
        t0 = time.perf_counter()
        await post_json(
            server,
            f"/session/{sid}/prompt",
            {"prompt": [{"type": "text", "text": f"[flood {flood}]"}]},
            "Prefer: respond-async",
        )
    elapsed = max(last_at) - t0
    frames = sum(counts)
    return frames / elapsed, evicted, frames


# ---- the run ---------------------------------------------------------------------------------


def acp_serve_argv(workspace: Path, state: Path, port: int, agent: str | None) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "serve",
        "--port",
        str(port),
        "--workspace",
        str(workspace),
        "--state-dir",
        str(state),
        "--no-journal",
    ]
    if agent:
        argv += ["--agent", agent]
    return argv


def qwen_serve_argv(cli: Path, workspace: Path, port: int) -> list[str]:
    return [
        shutil.which("node") or "node",
        str(cli),
        "serve",
        "--port",
        str(port),
        "--workspace",
        str(workspace),
        "--no-web",
    ]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def measure(server: Server, fan: bool) -> dict[str, float]:
    out: dict[str, float] = {"start_ms": server.started_s * 1000}
    await trio.sleep(1.0)
    out["idle_rss_mib"] = rss_mib(server.proc.pid)
    out["idle_tree_rss_mib"] = tree_rss_mib(server.proc.pid)
    await latencies(server, "/health", 200)  # warm up
    out["health_p50_ms"] = median(await latencies(server, "/health", 2000))
    out["caps_p50_ms"] = median(await latencies(server, "/capabilities", 2000))
    out["caps_rps_32"] = await throughput(server, "/capabilities", 32, 5.0)
    if fan:
        rate, evicted, frames = await fanout(server, 50, 20000)
        out["fanout_frames_per_s"] = rate
        out["fanout_evicted"] = evicted
        out["fanout_frames"] = frames
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--agent", default=None, help="ACP agent command for both daemons")
    parser.add_argument("--no-qwen", action="store_true", help="skip the reference qwen serve")
    args = parser.parse_args()

    from tests.support.fake_openai import FakeOpenAI
    from tests.support.node import qwen_cli, qwen_env

    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    workspace = tmp / "ws"
    workspace.mkdir()
    cli = None if args.no_qwen or not shutil.which("node") else qwen_cli()
    results: dict[str, list[dict[str, float]]] = {"acp-serve": [], "qwen-serve": []}
    with FakeOpenAI(workdir=str(workspace)) as model:
        env = qwen_env(tmp / "home", model.env())
        env["QWEN_SERVER_TOKEN"] = TOKEN
        for run in range(args.runs):
            port = free_port()
            server = start(
                "acp-serve",
                acp_serve_argv(workspace, tmp / f"state{run}", port, args.agent),
                env,
                port,
                ROOT,
            )
            try:
                results["acp-serve"].append(trio.run(measure, server, args.agent is None))
            finally:
                server.stop()
            if cli is not None:
                port = free_port()
                # qwen serve always spawns its own `qwen --acp`; with --agent "<node> <cli.js>
                # --acp" acp-serve runs the very same agent, so only the daemons differ.
                server = start(
                    "qwen-serve", qwen_serve_argv(cli, workspace, port), env, port, workspace
                )
                try:
                    results["qwen-serve"].append(trio.run(measure, server, False))
                finally:
                    server.stop()
            print(f"run {run + 1}/{args.runs} done", file=sys.stderr)

    keys = [
        "start_ms",
        "idle_rss_mib",
        "idle_tree_rss_mib",
        "health_p50_ms",
        "caps_p50_ms",
        "caps_rps_32",
        "fanout_frames_per_s",
        "fanout_evicted",
    ]
    title = f"metric (median of {args.runs} runs)"
    print(f"{title:<34}{'acp-serve':>14}{'qwen-serve':>14}{'ratio':>10}")
    for key in keys:
        ours = [r[key] for r in results["acp-serve"] if key in r]
        theirs = [r[key] for r in results["qwen-serve"] if key in r]
        a, b = median(ours), median(theirs)
        ratio = f"{a / b:.2f}" if theirs and b else "-"
        fmt = (
            "{:>14.0f}"
            if key in ("caps_rps_32", "fanout_frames_per_s", "fanout_evicted")
            else "{:>14.2f}"
        )
        print(
            f"{key:<34}"
            + fmt.format(a)
            + (fmt.format(b) if theirs else f"{'-':>14}")
            + f"{ratio:>10}"
        )
    print(
        "targets: start_ms <= 350, idle_rss_mib <= 50, health_p50_ms <= 1.15, caps_p50_ms <= 1.4, "
        "fanout_frames_per_s >= 200000 with 0 evicted"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
