#!/usr/bin/env python3
"""Benchmark how fast SIGTERM ends the daemon: medians of a few runs per scenario.

    .venv/bin/python scripts/bench_shutdown.py [--runs 5] [--no-qwen]

Scenarios (each a fresh daemon; the time is from SIGTERM to the process's exit):

* ``no session``: nothing but the daemon;
* ``keep-alive``: one idle HTTP/1.1 keep-alive connection open (it already got a response);
* ``idle qwen``: one session whose agent is the real ``qwen --acp`` (node, from
  ``.cache/node``, pointed at the fake model server as ``tests/support/node.py`` does), idle;
* ``qwen serve``: the reference daemon ``qwen serve`` with one idle session, for comparison.

The agent and the reference need ``scripts/install-node-deps``; without node they are skipped.
"""

from __future__ import annotations

import argparse
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


def keep_alive(server: Server) -> socket.socket:
    """A connection that got one response and stays open, idle."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
    got = b""
    while b'{"status":"ok"}' not in got:
        got += sock.recv(4096)
    return sock


def stop_time_ms(server: Server) -> float:
    t0 = time.monotonic()
    os.kill(server.proc.pid, signal.SIGTERM)
    try:
        server.proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        return float("inf")
    elapsed = (time.monotonic() - t0) * 1000
    try:  # whatever the daemon left of its group (it should leave nothing)
        os.killpg(server.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-qwen", action="store_true", help="skip the node scenarios")
    parser.add_argument("--qwen-cli", type=Path, default=None, help="qwen's cli.js elsewhere")
    args = parser.parse_args()

    from tests.support.fake_openai import FakeOpenAI
    from tests.support.node import qwen_acp_argv, qwen_cli, qwen_env

    tmp = Path(tempfile.mkdtemp(prefix="bench-shutdown-"))
    workspace = tmp / "ws"
    workspace.mkdir()
    cli = None if args.no_qwen or not shutil.which("node") else (args.qwen_cli or qwen_cli())
    results: dict[str, list[float]] = {}
    with FakeOpenAI(workdir=str(workspace)) as model:
        env = qwen_env(tmp / "home", model.env())
        env["QWEN_SERVER_TOKEN"] = TOKEN
        qwen_agent = " ".join(qwen_acp_argv(cli)) if cli is not None else None

        def acp_serve(run: int, agent: str | None) -> Server:
            port = free_port()
            argv = acp_serve_argv(workspace, tmp / f"state{run}", port, agent)
            return start("acp-serve", argv, env, port, ROOT)

        def with_session(server: Server) -> None:
            status, body = http(server, "POST", "/session", b'{"sessionScope":"thread"}')
            if status != 200:
                raise RuntimeError(f"POST /session: {status} {body[:200]!r}")

        scenarios: list[tuple[str, Callable[[int], Server], Callable[[Server], object]]] = [
            ("acp-serve, no session", lambda r: acp_serve(r, None), lambda s: None),
            ("acp-serve, idle keep-alive conn", lambda r: acp_serve(r, None), keep_alive),
            ("acp-serve, scripted agent idle", lambda r: acp_serve(r, None), with_session),
        ]
        if cli is not None and qwen_agent is not None:
            scenarios.append(
                ("acp-serve, idle qwen --acp", lambda r: acp_serve(r, qwen_agent), with_session)
            )

            def reference(_: int) -> Server:
                port = free_port()
                return start("qwen-serve", qwen_serve_argv(cli, workspace, port), env, port, tmp)

            scenarios.append(("qwen serve, idle session", reference, with_session))
        for name, make, prepare in scenarios:
            for run in range(args.runs):
                server = make(run)
                held = None
                try:
                    held = prepare(server)
                    time.sleep(0.3)  # let the agent settle into idleness
                    results.setdefault(name, []).append(stop_time_ms(server))
                except (RuntimeError, OSError) as exc:  # e.g. a session that never started
                    print(f"  {name}: run {run} failed: {exc}", file=sys.stderr)
                finally:
                    if isinstance(held, socket.socket):
                        held.close()
                    server.stop()
    print(f"SIGTERM to exit, median of {args.runs} runs (ms)")
    for name, values in results.items():
        runs = sorted(round(v) for v in values)
        print(f"  {name:<36}{statistics.median(values):>10.0f}   runs: {runs}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
