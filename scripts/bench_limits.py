#!/usr/bin/env python3
"""Benchmark of the per-agent-child limits: real daemons, the hostile test agent.

    .venv/bin/python scripts/bench_limits.py [--prompts N] [--oom-runs N] [--idle-s S]

1. **Noisy neighbours**: a memory hog (allocates 400 MiB again and again; with limits on it
   is killed at its 128 MiB cap and restored) and two CPU hogs (spin) beside a quiet
   session; the quiet session's prompt round trip (p50/p99) and the worst ``/health``
   during that, with ``--agent-limits auto`` (cgroup v1 here) and ``--agent-limits off``.
2. **Time to ``agent_oom``**: the hog marks (``HOSTILE_MARK``) the moment it is 12 MiB
   below its 64 MiB cap; the time from there to the ``agent_oom`` event on the session's
   stream, for the cgroup backend and the watchdog.
3. **Watchdog cost**: the daemon's CPU time (utime + stime of the whole process, its worker
   threads included) over ``--idle-s`` seconds with 32 idle warm children, watchdog vs
   off; the difference is the watchdog's cost in % of one core.

Figures only (printed); nothing is asserted. Needs root for the cgroup parts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.daemon import DaemonProcess, spawn_daemon  # noqa: E402
from tests.support.sse import collect_until  # noqa: E402

TOKEN = "bench-limits-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HOSTILE = ROOT / "tests" / "serve" / "hostile_agent.py"
TICKS = os.sysconf("SC_CLK_TCK")


def daemon(*args: str, env: dict[str, str] | None = None) -> DaemonProcess:
    return spawn_daemon(
        ["--agent", f"{sys.executable} {HOSTILE}", "--warm-agents", "0", *args],
        env={"QWEN_SERVER_TOKEN": TOKEN, **(env or {})},
        ready_timeout_s=120,
    )


def text(t: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": t}]}


async def new_session(client: httpx.AsyncClient) -> str:
    r = await client.post("/session", json={"sessionScope": "thread"})
    r.raise_for_status()
    return str(r.json()["sessionId"])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---- 1. noisy neighbours ----------------------------------------------------------------


async def neighbours(limits: str, prompts: int) -> dict[str, float]:
    args = ["--agent-limits", limits]
    if limits != "off":
        args += ["--agent-memory-max-mb", "128"]
    d = daemon(*args)
    try:
        async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=120) as client:
            quiet = await new_session(client)
            hog = await new_session(client)
            spinners = [await new_session(client), await new_session(client)]
            rtts: list[float] = []
            health: list[float] = []
            ooms = 0
            done = trio.Event()

            async def memory_hog() -> None:
                nonlocal ooms
                sid, kills = hog, 0
                while not done.is_set():
                    r = await client.post(f"/session/{sid}/prompt", json=text("alloc 400 0.3"))
                    if r.status_code != 200:
                        ooms += 1
                        kills += 1
                        if kills >= 3:  # the restart intensity: a fresh hog session
                            sid, kills = await new_session(client), 0
                        await trio.sleep(0.3)  # the restart in place

            async def cpu_hog(sid: str) -> None:
                while not done.is_set():
                    await client.post(f"/session/{sid}/prompt", json=text("spin 2"))

            async def probe() -> None:
                while not done.is_set():
                    t = time.monotonic()
                    await client.get("/health")
                    health.append(time.monotonic() - t)
                    await trio.sleep(0.05)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(memory_hog)
                for sid in spinners:
                    nursery.start_soon(cpu_hog, sid)
                nursery.start_soon(probe)
                await trio.sleep(1.0)
                for i in range(prompts):
                    t = time.monotonic()
                    r = await client.post(f"/session/{quiet}/prompt", json=text(f"ping {i}"))
                    r.raise_for_status()
                    rtts.append(time.monotonic() - t)
                done.set()
                nursery.cancel_scope.cancel()
        return {
            "p50_ms": 1000 * statistics.median(rtts),
            "p99_ms": 1000 * pct(rtts, 0.99),
            "health_worst_ms": 1000 * max(health),
            "hog_ooms": ooms,
        }
    finally:
        d.stop()


# ---- 2. time to agent_oom -----------------------------------------------------------------


async def time_to_oom(limits: str, runs: int) -> list[float]:
    mark = Path(tempfile.mkdtemp(prefix="bench-limits-")) / "mark"
    d = daemon(
        "--agent-limits",
        limits,
        "--agent-memory-max-mb",
        "64",
        env={"HOSTILE_MARK": f"52:{mark}"},
    )
    out: list[float] = []
    try:
        async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=120) as client:
            for _ in range(runs):
                # A fresh session per run: the restart intensity (3 a minute) would end one
                # that is killed every run.
                sid = await new_session(client)
                mark.unlink(missing_ok=True)
                got: list[float] = []

                async def watch(sid: str = sid, into: list[float] = got) -> None:
                    async with client.stream(
                        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
                    ) as stream:
                        await collect_until(stream, lambda e: e["type"] == "agent_oom")
                        into.append(time.monotonic())

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(watch)
                    await trio.sleep(0.2)
                    await client.post(f"/session/{sid}/prompt", json=text("alloc 400 5"))
                crossed = float(mark.read_text().split()[0])
                out.append(got[0] - crossed)
                await client.delete(f"/session/{sid}")
    finally:
        d.stop()
    return out


# ---- 3. watchdog cost ---------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def idle_cost(limits: str, idle_s: float) -> float:
    d = daemon("--agent-limits", limits, "--warm-agents", "32", "--agent-memory-max-mb", "256")
    try:
        async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=120) as client:
            for _ in range(1200):
                body = (await client.get("/daemon/status")).json()
                if body["runtime"]["agents"][0]["warm"] >= 32:
                    break
                await trio.sleep(0.1)
            await trio.sleep(2.0)
            before = cpu_s(d.proc.pid)
            await trio.sleep(idle_s)
            return (cpu_s(d.proc.pid) - before) / idle_s
    finally:
        d.stop()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--oom-runs", type=int, default=5)
    ap.add_argument("--idle-s", type=float, default=20.0)
    ns = ap.parse_args()
    print("1. quiet session beside a memory hog and 2 CPU hogs")
    for limits in ("auto", "off"):
        r = await neighbours(limits, ns.prompts)
        print(
            f"   limits {limits:5}: prompt p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
            f"/health worst {r['health_worst_ms']:.1f} ms, hog killed {r['hog_ooms']} times"
        )
    print("2. from 12 MiB below the 64 MiB cap to the agent_oom event")
    for limits in ("cgroup", "watchdog"):
        t = await time_to_oom(limits, ns.oom_runs)
        print(
            f"   {limits:8}: median {1000 * statistics.median(t):.1f} ms, "
            f"max {1000 * max(t):.1f} ms (n={len(t)})"
        )
    print(f"3. daemon CPU with 32 idle children over {ns.idle_s:.0f} s")
    off = await idle_cost("off", ns.idle_s)
    wd = await idle_cost("watchdog", ns.idle_s)
    print(
        f"   off {100 * off:.2f} % of a core, watchdog {100 * wd:.2f} %: "
        f"the watchdog costs {100 * (wd - off):.2f} % of a core"
    )


if __name__ == "__main__":
    trio.run(main)
