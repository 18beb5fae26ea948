#!/usr/bin/env python3
"""Isolation benchmark: one session misbehaves, do the others notice?

Starts a real daemon whose agent is the rogue fake agent (tests/support/rogue_agent.py), opens
a *noisy* session and a *quiet* one, and while the noisy one works, probes ``GET /health`` and
a small prompt on the quiet session in a loop, recording each latency. Prints medians and
worst cases, the daemon's RSS before and after (what the noisy session retains), and the bytes
of log the daemon wrote.

    scripts/bench_isolation.py big       # noisy: 3 rounds of six 16 MiB updates, one SSE reader
    scripts/bench_isolation.py garbage   # noisy: 100000 lines that are not JSON
    scripts/bench_isolation.py big --root /tmp/old-checkout   # the same against another tree

``--root`` runs ``python -m serve`` from another source tree (e.g. ``git archive main``), so
before/after figures come from the same script. Extra daemon flags go after ``--``.

Latencies measured from outside include whatever else the machine runs; so the daemon is
also started with a trio instrument (injected by this script, no daemon change) that times
every task step on the event loop: the longest steps while the noisy session works, in wall
time and in CPU time of the loop thread (what the loop itself spent; immune to preemption).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

HERE = Path(__file__).resolve().parents[1]
ROGUE = HERE / "tests" / "support" / "rogue_agent.py"
TOKEN = "bench-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MIB = 1024 * 1024


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


_PROFILED = """
import atexit, json, sys, time, runpy
import trio
steps = []
class _Steps(trio.abc.Instrument):
    def before_task_step(self, task):
        self.w = time.perf_counter(); self.c = time.thread_time()
    def after_task_step(self, task):
        w = time.perf_counter() - self.w
        if w > 0.005:
            steps.append((time.time() - w, w, time.thread_time() - self.c, task.name))
_run = trio.run
def run(*args, **kwargs):
    kwargs["instruments"] = [*kwargs.get("instruments", ()), _Steps()]
    return _run(*args, **kwargs)
trio.run = run
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps(steps)))
sys.argv = ["serve", *sys.argv[2:]]
runpy.run_module("serve", run_name="__main__", alter_sys=True)
"""


def start(root: Path, extra: list[str]) -> tuple[subprocess.Popen[bytes], str, Path]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-isolation-"))
    (tmp / "ws").mkdir()
    err = tmp / "stderr.log"
    env = {**os.environ, "QWEN_SERVER_TOKEN": TOKEN, "QWEN_SERVE_NO_MCP_POOL": "1"}
    argv = [
        sys.executable,
        "-c",
        _PROFILED,
        str(tmp / "steps.json"),
        "--port",
        "0",
        "--workspace",
        str(tmp / "ws"),
        "--state-dir",
        str(tmp / "state"),
        "--agent",
        f"{sys.executable} {ROGUE}",
        *extra,
    ]
    with open(err, "wb") as f:
        proc = subprocess.Popen(
            argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=f, start_new_session=True
        )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("acp-serve listening on"):
        proc.kill()
        raise SystemExit(f"daemon did not start: {line!r}\n{err.read_text()}")
    return proc, line.split()[3], err


async def prompt(client: httpx.AsyncClient, sid: str, text: str) -> None:
    r = await client.post(
        f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": text}]}, timeout=300
    )
    r.raise_for_status()


async def run(args: argparse.Namespace) -> None:
    proc, url, err = start(Path(args.root), args.daemon_args)
    try:
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=60) as client:
            sessions = []
            for _ in range(2):
                r = await client.post("/session", json={"sessionScope": "thread"})
                r.raise_for_status()
                sessions.append(r.json()["sessionId"])
            noisy, quiet = sessions
            await prompt(client, quiet, "say warm-up")
            await trio.sleep(1)
            rss_before = rss_kib(proc.pid)
            log_before = err.stat().st_size
            health: list[float] = []
            quiet_ms: list[float] = []
            done = trio.Event()
            read_bytes = 0
            evicted: list[bytes] = []

            async def probe_health() -> None:
                while not done.is_set():
                    t = time.perf_counter()
                    (await client.get("/health")).raise_for_status()
                    health.append((time.perf_counter() - t) * 1000)
                    await trio.sleep(0.01)

            async def probe_quiet() -> None:
                while not done.is_set():
                    t = time.perf_counter()
                    await prompt(client, quiet, "say hi")
                    quiet_ms.append((time.perf_counter() - t) * 1000)
                    await trio.sleep(0.02)

            async def reader() -> None:
                nonlocal read_bytes
                async with client.stream("GET", f"/session/{noisy}/events", timeout=None) as stream:
                    async for chunk in stream.aiter_bytes():
                        read_bytes += len(chunk)
                        if (
                            b"event: client_evicted" in chunk[:4096]
                            or b"client_evicted" in chunk[-4096:]
                        ):
                            evicted.append(chunk[-600:])

            async with trio.open_nursery() as nursery:
                if args.mode == "big" and not args.no_reader:
                    nursery.start_soon(reader)
                await trio.sleep(0.3)
                nursery.start_soon(probe_health)
                nursery.start_soon(probe_quiet)
                started = time.perf_counter()
                window_start = time.time()
                for _ in range(args.rounds):
                    if args.mode == "big":
                        size = args.update_bytes - 512  # the JSON-RPC line stays under the size
                        await prompt(client, noisy, f"big {size} {args.updates}; say end")
                    else:
                        await prompt(client, noisy, f"garbage {args.lines}; say end")
                elapsed = time.perf_counter() - started
                window_end = time.time()
                await trio.sleep(0.5)
                done.set()
                await trio.sleep(0.1)
                nursery.cancel_scope.cancel()
            await trio.sleep(1.5)
            rss_after = rss_kib(proc.pid)
            log_after = err.stat().st_size

        def line(name: str, values: list[float]) -> str:
            if not values:
                return f"{name}: no samples"
            return (
                f"{name}: n={len(values)} median={statistics.median(values):.1f} ms "
                f"max={max(values):.1f} ms"
            )

        print(f"root: {args.root}  mode: {args.mode}  daemon args: {args.daemon_args}")
        if args.mode == "big":
            print(
                f"noisy: {args.rounds} x {args.updates} updates of {args.update_bytes} bytes "
                f"in {elapsed:.2f} s; SSE reader got {read_bytes / MIB:.0f} MiB"
                + (f", evicted: {evicted[0]!r}" if evicted else "")
            )
        else:
            print(f"noisy: {args.rounds} x {args.lines} invalid lines in {elapsed:.2f} s")
        print(line("GET /health", health))
        print(line("quiet session prompt", quiet_ms))
        print(
            f"daemon RSS: {rss_before / 1024:.1f} MiB before, {rss_after / 1024:.1f} MiB after "
            f"(+{(rss_after - rss_before) / 1024:.1f} MiB retained)"
        )
        print(f"log written during the run: {log_after - log_before} bytes")
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    steps_file = err.parent / "steps.json"
    if steps_file.exists():
        import json

        steps = [
            s for s in json.loads(steps_file.read_text()) if window_start <= s[0] <= window_end
        ]
        steps.sort(key=lambda s: -s[2])
        over = sum(1 for s in steps if s[2] > 0.05)
        top = ", ".join(f"{s[3].split('.')[-1][:24]} {s[2] * 1000:.0f}" for s in steps[:3])
        worst_wall = max((s[1] for s in steps), default=0.0)
        print(
            f"event loop: longest step {steps[0][2] * 1000 if steps else 0:.1f} ms CPU "
            f"(longest wall {worst_wall * 1000:.1f} ms); steps over 50 ms CPU: {over}; "
            f"top (task ms CPU): {top}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("big", "garbage"))
    parser.add_argument("--root", default=str(HERE), help="source tree to run the daemon from")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--updates", type=int, default=6, help="big: updates per round")
    parser.add_argument("--update-bytes", type=int, default=16 * MIB, help="big: line size")
    parser.add_argument("--lines", type=int, default=100_000, help="garbage: lines per round")
    parser.add_argument("--no-reader", action="store_true", help="big: no SSE reader")
    parser.add_argument("daemon_args", nargs="*", help="extra daemon flags (after --)")
    trio.run(run, parser.parse_args())


if __name__ == "__main__":
    main()
