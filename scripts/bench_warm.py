#!/usr/bin/env python3
"""What an idle warm spare costs a live session: the prompt round trip
and ``GET /health`` p50 of one live session with the real ``qwen --acp`` behind a fake
model, acp-serve with its default warm spare, with ``--warm-agents 0``, and ``qwen serve``,
the modes interleaved run by run on the same workspace and model.

    .venv/bin/python scripts/bench_warm.py [--runs 5] [--prompts 40] [--settle-s 10]
        [--modes qwen,warm1,warm0] [--base-root DIR] [-- extra acp-serve flags]

``--churn-s S``: meanwhile another session arrives every S seconds and the one before it
is closed, so the pool keeps refilling (the refills' cost to the live session).
``base-warmN`` modes run the daemon of the source tree ``--base-root`` (before/after in
one run).

Per run and mode: a fresh daemon; one session created and prompted once; ``--settle-s``
(the refill that replaced the taken spare initializes and goes idle); then ``--prompts``
sequential prompts (``Prefer: respond-async`` POST to its ``turn_complete`` on the
session's SSE stream, as scripts/bench_density.py) and 500 ``/health`` requests, while the CPU
seconds of every process of the daemon's tree are counted (``/proc/<pid>/stat``): the
daemon itself, the live session's agent, the idle spare(s). Printed: per mode the median
over runs of each run's p50 (and p90, and the p50 of the first 10 prompts: with
``--settle-s 0`` those run while the refill starts), and the ratio to ``qwen`` (or to
``warm0`` without it).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_density import (  # noqa: E402
    AUTH,
    TOKEN,
    acp_serve_argv,
    free_port,
    prompt_once,
    qwen_serve_argv,
    start,
    stop,
    tree_pids,
)

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def agents_of(pid: int) -> list[int]:
    out = []
    for p in tree_pids(pid)[1:]:
        try:
            if "--acp" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace"):
                out.append(p)
        except OSError:
            pass
    return out


async def churn(client: httpx.AsyncClient, every_s: float) -> None:
    """Another session arrives every ``every_s`` (taking the spare: a refill starts) and the
    one before it is closed."""
    previous = None
    while True:
        await trio.sleep(every_s)
        r = await client.post("/session", json={"sessionScope": "thread"})
        if previous is not None:
            await client.delete(f"/session/{previous}")
        previous = r.json().get("sessionId") if r.status_code == 200 else None


async def measure(
    url: str, pid: int, prompts: int, settle_s: float, churn_s: float
) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=300) as client:
        r = await client.post("/session", json={"sessionScope": "thread"})
        r.raise_for_status()
        sid = r.json()["sessionId"]
        await prompt_once(client, sid, "hello")
        live = None  # the session's agent (acp-serve says which; qwen serve has one child)
        st = await client.get("/daemon/status", params={"detail": "full"})
        if st.status_code == 200:
            live = next(
                (s.get("agentPid") for s in st.json()["full"]["sessions"] if s["sessionId"] == sid),
                None,
            )
        await trio.sleep(settle_s)
        before = {p: cpu_s(p) for p in tree_pids(pid)}
        t_window = time.monotonic()
        rtts = []
        health = []
        async with trio.open_nursery() as nursery:
            if churn_s:
                other = httpx.AsyncClient(base_url=url, headers=AUTH, timeout=300)
                nursery.start_soon(churn, other, churn_s)
            for i in range(prompts):
                rtts.append(await prompt_once(client, sid, f"hi {i}"))
            for _ in range(500):
                t0 = time.perf_counter()
                (await client.get("/health")).raise_for_status()
                health.append((time.perf_counter() - t0) * 1000)
            nursery.cancel_scope.cancel()
        if churn_s:
            await other.aclose()
        window = time.monotonic() - t_window
        after = {p: cpu_s(p) for p in tree_pids(pid)}
    agents = agents_of(pid)
    # The live agent (else the one that worked the most); the others are spares/refills.
    used = {p: after.get(p, 0.0) - before.get(p, 0.0) for p in agents}
    if live not in used:
        live = max(used, key=lambda p: used[p]) if used else None
    spares = sum(v for p, v in used.items() if p != live)
    daemon = after.get(pid, 0.0) - before.get(pid, 0.0)
    return {
        "prompt_p50_ms": statistics.median(rtts),
        "prompt_p90_ms": sorted(rtts)[int(0.9 * (len(rtts) - 1))],
        "first10_p50_ms": statistics.median(rtts[:10]),
        "health_p50_ms": statistics.median(health),
        "daemon_cpu_pct": 100 * daemon / window,
        "live_agent_cpu_pct": 100 * used.get(live, 0.0) / window if live else 0.0,
        "spare_cpu_pct": 100 * spares / window,
        "agents": float(len(agents)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--settle-s", type=float, default=10.0)
    parser.add_argument(
        "--churn-s",
        type=float,
        default=0.0,
        help="another session arrives this often while the live one is measured (refills)",
    )
    parser.add_argument("--modes", default="qwen,warm1,warm0")
    parser.add_argument(
        "--base-root",
        default=str(ROOT),
        help="source tree of the base-warmN modes (e.g. `git archive main` unpacked)",
    )
    parser.add_argument("extra", nargs="*", help="extra acp-serve flags (after --)")
    args = parser.parse_args()

    from tests.support.fake_openai import FakeOpenAI
    from tests.support.node import ensure_qwen, qwen_acp_argv, qwen_env

    cli = ensure_qwen()
    tmp = Path(tempfile.mkdtemp(prefix="bench-warm-"))
    workspace = tmp / "ws"
    workspace.mkdir()
    modes = args.modes.split(",")
    results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    with FakeOpenAI(workdir=str(workspace)) as model:
        env = qwen_env(tmp / "home", model.env())
        env["QWEN_SERVER_TOKEN"] = TOKEN
        for run in range(args.runs):
            for mode in modes:
                port = free_port()
                if mode == "qwen":
                    argv, cwd = qwen_serve_argv(cli, workspace, port), workspace
                else:
                    # "base-warmN": the daemon of another source tree (--base-root).
                    warm = mode.removeprefix("base-").removeprefix("warm")
                    agent = shlex.join(qwen_acp_argv(cli))
                    extra = ["--warm-agents", warm, *args.extra]
                    argv = acp_serve_argv(
                        workspace, tmp / f"state-{mode}-{run}", port, agent, extra
                    )
                    cwd = Path(args.base_root) if mode.startswith("base-") else ROOT
                proc = start(argv, env, port, cwd, tmp / f"{mode}-{run}.log")
                try:
                    time.sleep(3.0)  # the warm spare (or qwen's own child) starts
                    got = trio.run(
                        measure,
                        f"http://127.0.0.1:{port}",
                        proc.pid,
                        args.prompts,
                        args.settle_s,
                        args.churn_s,
                    )
                    results[mode].append(got)
                finally:
                    stop(proc)
            print(f"run {run + 1}/{args.runs} done", file=sys.stderr)

    ref = "qwen" if "qwen" in modes else ("warm0" if "warm0" in modes else None)
    keys = list(next(iter(results.values()))[0]) if results else []
    print(f"\nmedian of {args.runs} runs, {args.prompts} prompts each; ratio = mode / {ref}")
    header = f"{'metric':<22}" + "".join(f"{m:>10}" for m in modes)
    header += "".join(f"{m + '/' + (ref or '')[:1]:>10}" for m in modes if ref and m != ref)
    print(header)
    for key in keys:
        meds = {m: statistics.median(r[key] for r in results[m]) for m in modes if results[m]}
        line = f"{key:<22}" + "".join(f"{meds[m]:>10.2f}" for m in modes)
        if ref:
            for m in modes:
                if m != ref:
                    line += f"{(meds[m] / meds[ref] if meds[ref] else float('nan')):>10.2f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
