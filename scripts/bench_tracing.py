#!/usr/bin/env python3
"""The prompt round trip with OpenTelemetry tracing off and on.

    .venv/bin/python scripts/bench_tracing.py [--runs 5] [--prompts 200] [--base-root DIR]

Modes, interleaved run by run, each a fresh daemon (``python -m serve``, the scripted
agent, one live session): ``off`` (this tree, defaults), ``on`` (this tree,
``--otel-endpoint`` to an OTLP/HTTP receiver run by this script on 127.0.0.1 that answers
200 and discards; the spans go through the real exporter) and, with ``--base-root`` (a source
tree, e.g. ``git archive main`` unpacked), ``base`` (that tree's daemon: before/after for
``off``). Per run: ``--prompts`` sequential ``POST /session/{id}/prompt`` (blocking until
the turn ends) after 20 warm-up prompts; printed: per mode the median over runs of the p50
and p90 round trip (ms) and the daemon's CPU per prompt (``/proc/<pid>/stat``, ms). Read
small differences against the spread between runs of one mode.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-tracing-token-0123456789"
_READY = re.compile(r"acp-serve listening on (http://\S+)")


class _Sink(BaseHTTPRequestHandler):
    spans_posts = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        _Sink.spans_posts += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks * 1000 / os.sysconf("SC_CLK_TCK")


def run(mode: str, root: Path, endpoint: str, prompts: int) -> tuple[float, float, float]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-tracing-"))
    (tmp / "ws").mkdir()
    argv = [sys.executable, "-m", "serve", "--port", "0", "--workspace", str(tmp / "ws")]
    argv += ["--state-dir", str(tmp / "state")]
    if mode == "on":
        argv += ["--otel-endpoint", endpoint]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["QWEN_SERVER_TOKEN"] = TOKEN
    env["PYTHONPATH"] = str(root)
    proc = subprocess.Popen(
        argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        match = _READY.search(proc.stdout.readline())
        assert match, "the daemon did not start"
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=match.group(1), headers=headers, timeout=30) as client:
            sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
            body = {"prompt": [{"type": "text", "text": "hello"}]}
            for _ in range(20):
                client.post(f"/session/{sid}/prompt", json=body).raise_for_status()
            times: list[float] = []
            cpu_before = cpu_ms(proc.pid)
            for _ in range(prompts):
                t0 = time.perf_counter()
                client.post(f"/session/{sid}/prompt", json=body).raise_for_status()
                times.append((time.perf_counter() - t0) * 1000)
            cpu = (cpu_ms(proc.pid) - cpu_before) / prompts
        times.sort()
        return times[len(times) // 2], times[int(len(times) * 0.9)], cpu
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--base-root", type=Path, default=None)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    modes = ["off", "on"] + (["base"] if args.base_root else [])
    results: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    for i in range(args.runs):
        for mode in modes:
            root = args.base_root if mode == "base" else ROOT
            assert root is not None
            results[mode].append(run(mode, root, endpoint, args.prompts))
            p50, p90, cpu = results[mode][-1]
            print(f"run {i + 1} {mode}: p50 {p50:.2f} ms, p90 {p90:.2f} ms, cpu {cpu:.2f} ms")
    load = os.getloadavg()[0]
    print(f"load average at end: {load:.2f}; OTLP posts received: {_Sink.spans_posts}")
    print("| mode | round trip p50 (ms) | p90 (ms) | daemon CPU per prompt (ms) |")
    print("|---|---|---|---|")
    for mode in modes:
        rows = results[mode]
        p50 = statistics.median(r[0] for r in rows)
        p90 = statistics.median(r[1] for r in rows)
        cpu = statistics.median(r[2] for r in rows)
        print(f"| {mode} | {p50:.2f} | {p90:.2f} | {cpu:.2f} |")
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
