#!/usr/bin/env python3
"""Session density: create latency, first-prompt latency and process-tree RSS with the real
``qwen --acp`` behind a fake model, acp-serve's agent-pool modes side by side with
``qwen serve`` measured in the same run.

    .venv/bin/python scripts/bench_density.py [--sessions 32] [--gap-s 1.5]
        [--modes qwen,packed,m8,iso,burst] [--iso-sessions N] [--settle-s 8] [--runs 1]
        [--acp-flags "--warm-agents-max 1"]

``--runs R`` repeats every mode R times (the modes interleaved) and prints the median of
each figure over the runs; ``--acp-flags`` are added to every acp-serve mode but the
``base-<mode>`` ones, which run ``<mode>`` with the daemon of the source tree ``--base-root``
(e.g. ``git archive main`` unpacked: before/after in one run).

Modes (each a fresh daemon on the same workspace and fake model):

* ``qwen``   — ``qwen serve`` 0.24.4 (one warm child per workspace, sessions multiplexed on it);
* ``packed`` — acp-serve ``--sessions-per-agent 1024`` (all sessions on one child, like
  the reference), ``--warm-agents 1``;
* ``m8``     — acp-serve ``--sessions-per-agent 8 --warm-agents 1``;
* ``iso``    — acp-serve isolation (``--sessions-per-agent 1 --warm-agents 1``), sessions
  arriving ``--gap-s`` apart so the pool refills between them;
* ``burst``  — isolation again, all creates back to back (bounded by how fast qwen spawns).

``iso:W`` / ``burst:W`` run isolation with ``--warm-agents W`` (default ``--warm``).

Per mode: after start-up and ``--settle-s`` (warm children initialize) the idle tree RSS;
then ``--sessions`` sessions arrive (``--gap-s`` apart except ``burst``); each is created
(``POST /session``, ``sessionScope: thread``) and prompted once (time from the prompt POST
to its ``turn_complete`` on the SSE stream); then the tree RSS with every session live.
``iso`` runs with ``--agent-idle-release-ms`` set to end ``--release-after-s`` after the
last arrival, and measures the tree again once the released children are gone ("released";
the ratio is against qwen serve's tree with the same sessions, which it never releases).
Printed: create p50 (first and the rest), first-prompt p50, tree RSS idle and loaded, RSS
per extra session, and each figure's ratio to ``qwen`` from the same run. Process-tree RSS
is summed over the daemon and all its descendants (VmRSS).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOKEN = "bench-density-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_pids(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(children.get(p, []))
    return out


def tree_rss_mib(pid: int) -> float:
    return sum(_rss_kib(p) for p in tree_pids(pid)) / 1024


@dataclass
class Result:
    mode: str
    create_ms: list[float] = field(default_factory=list)
    prompt_ms: list[float] = field(default_factory=list)
    idle_rss: float = float("nan")
    loaded_rss: float = float("nan")
    released_rss: float = float("nan")
    agents: int = 0
    errors: list[str] = field(default_factory=list)

    def median(self, values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    @property
    def first_create(self) -> float:
        return self.create_ms[0] if self.create_ms else float("nan")

    @property
    def rest_create(self) -> float:
        return self.median(self.create_ms[1:])

    @property
    def create_p50(self) -> float:
        return self.median(self.create_ms)

    @property
    def prompt_p50(self) -> float:
        return self.median(self.prompt_ms)

    @property
    def per_session(self) -> float:
        n = len(self.create_ms)
        return (self.loaded_rss - self.idle_rss) / n if n else float("nan")


def start(
    argv: list[str], env: dict[str, str], port: int, cwd: Path, log: Path
) -> subprocess.Popen[str]:
    with open(log, "w") as err:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=err,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"http://127.0.0.1:{port}/health", headers=AUTH, timeout=2)
            if r.status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    stop(proc)
    raise RuntimeError("server did not answer /health in time")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # Whatever is left of the group (qwen relaunches itself).
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def prompt_once(client: httpx.AsyncClient, sid: str, text: str) -> float:
    """Time from the prompt POST to its terminal event on the session's SSE stream."""
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Accept": "text/event-stream"}
    ) as stream:
        t0 = time.perf_counter()
        response = await client.post(
            f"/session/{sid}/prompt",
            json={"prompt": [{"type": "text", "text": text}]},
            headers={"Prefer": "respond-async"},
        )
        if response.status_code not in (200, 202):
            raise RuntimeError(f"prompt: {response.status_code} {response.text[:200]}")
        prompt_id = response.json().get("promptId")
        buffer = ""
        async for chunk in stream.aiter_text():
            buffer += chunk
            while "\n\n" in buffer:
                block, buffer = buffer.split("\n\n", 1)
                data = "\n".join(
                    line[5:].strip() for line in block.split("\n") if line.startswith("data:")
                )
                if not data:
                    continue
                import json

                event = json.loads(data)
                if event.get("type") in ("turn_complete", "turn_error") and (
                    prompt_id is None or event.get("data", {}).get("promptId") in (None, prompt_id)
                ):
                    if event["type"] == "turn_error":
                        raise RuntimeError(f"turn_error: {event['data']}")
                    return (time.perf_counter() - t0) * 1000
    raise RuntimeError("event stream ended before the turn did")


async def drive(url: str, result: Result, sessions: int, gap_s: float) -> None:
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=300) as client:
        t_start = time.monotonic()
        for i in range(sessions):
            if gap_s:
                await trio.sleep(max(0.0, t_start + i * gap_s - time.monotonic()))
            t0 = time.perf_counter()
            created = await client.post("/session", json={"sessionScope": "thread"})
            elapsed = (time.perf_counter() - t0) * 1000
            if created.status_code != 200:
                result.errors.append(f"create {i}: {created.status_code} {created.text[:160]}")
                continue
            result.create_ms.append(elapsed)
            sid = created.json()["sessionId"]
            try:
                result.prompt_ms.append(await prompt_once(client, sid, f"hello {i}"))
            except Exception as exc:  # reported, the run goes on
                result.errors.append(f"prompt {i}: {exc}")


def acp_serve_argv(workspace: Path, state: Path, port: int, agent: str, extra: list[str]):
    return [
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
        "--agent",
        agent,
        "--initialize-timeout-ms",
        "120000",
        "--max-sessions",
        "0",
        *extra,
    ]


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
        "--max-sessions",
        "0",
    ]


def agent_count(pid: int) -> int:
    count = 0
    for p in tree_pids(pid)[1:]:
        try:
            cmdline = Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        count += "--acp" in cmdline
    return count


def run_mode(
    mode: str, cli: Path, tmp: Path, env: dict[str, str], args: argparse.Namespace
) -> Result:
    from tests.support.node import qwen_acp_argv

    workspace = tmp / "ws"
    port = free_port()
    n = args.sessions
    gap = args.gap_s
    release_ms = 0
    warm_n = 0
    if mode == "qwen":
        argv = qwen_serve_argv(cli, workspace, port)
        cwd = workspace
    else:
        agent = shlex.join(qwen_acp_argv(cli))
        # "base-iso" ...: the same mode run by the daemon of another tree (--base-root).
        kind, _, warm = mode.removeprefix("base-").partition(":")
        warm = warm or str(args.warm)
        warm_n = int(warm)
        extra = {
            # One child for the whole workspace: it never fills, nothing is spawned ahead.
            "packed": ["--sessions-per-agent", "1024", "--warm-agents", "1"],
            "m8": ["--sessions-per-agent", "8", "--warm-agents", "1"],
            "iso": ["--sessions-per-agent", "1", "--warm-agents", warm],
            "burst": ["--sessions-per-agent", "1", "--warm-agents", warm],
        }[kind]
        if kind in ("iso", "burst"):
            n = args.iso_sessions or n
        # Idle release only in iso, after every session arrived and was prompted.
        release_ms = int((n * gap + args.release_after_s) * 1000) if kind == "iso" else 0
        extra += ["--agent-idle-release-ms", str(release_ms)]
        if kind == "burst":
            gap = 0.0
        if not mode.startswith("base-"):
            extra += shlex.split(args.acp_flags)
        argv = acp_serve_argv(
            workspace, tmp / f"state-{mode}-{time.monotonic_ns()}", port, agent, extra
        )
        cwd = Path(args.base_root) if mode.startswith("base-") else ROOT
    result = Result(mode)
    proc = start(argv, env, port, cwd, tmp / f"{mode.replace(':', '-')}.log")
    try:
        time.sleep(args.settle_s)
        result.idle_rss = tree_rss_mib(proc.pid)
        t_run = time.monotonic()
        trio.run(drive, f"http://127.0.0.1:{port}", result, n, gap)
        time.sleep(2.0)  # let refills settle before measuring
        result.loaded_rss = tree_rss_mib(proc.pid)
        result.agents = agent_count(proc.pid)
        if release_ms:
            # The last session arrived by n * gap and is released release_ms after its prompt.
            time.sleep(max(0.0, t_run + n * gap + release_ms / 1000 + 5.0 - time.monotonic()))
            for _ in range(60):  # until the released children are reaped
                if agent_count(proc.pid) <= warm_n:
                    break
                time.sleep(1.0)
            result.released_rss = tree_rss_mib(proc.pid)
    finally:
        stop(proc)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--iso-sessions", type=int, default=0, help="sessions in iso/burst")
    parser.add_argument("--gap-s", type=float, default=1.5)
    parser.add_argument("--warm", type=int, default=1, help="--warm-agents in iso/burst")
    parser.add_argument("--settle-s", type=float, default=8.0)
    parser.add_argument("--modes", default="qwen,packed,m8,iso,burst")
    parser.add_argument("--runs", type=int, default=1, help="repetitions (medians printed)")
    parser.add_argument("--acp-flags", default="", help="extra flags for every acp-serve mode")
    parser.add_argument(
        "--base-root", default=str(ROOT), help="source tree of the base-<mode> modes (before)"
    )
    parser.add_argument(
        "--release-after-s",
        type=float,
        default=15.0,
        help="iso: --agent-idle-release-ms = sessions * gap + this (after the last prompt)",
    )
    args = parser.parse_args()

    from tests.support.fake_openai import FakeOpenAI
    from tests.support.node import ensure_qwen, qwen_env

    cli = ensure_qwen()
    tmp = Path(tempfile.mkdtemp(prefix="bench-density-"))
    (tmp / "ws").mkdir()
    runs: dict[str, list[Result]] = {}
    with FakeOpenAI(workdir=str(tmp / "ws")) as model:
        env = qwen_env(tmp / "home", model.env())
        env["QWEN_SERVER_TOKEN"] = TOKEN
        for run in range(args.runs):
            for mode in args.modes.split(","):
                t0 = time.monotonic()
                r = run_mode(mode, cli, tmp, env, args)
                runs.setdefault(mode, []).append(r)
                print(
                    f"run {run + 1} {mode}: {len(r.create_ms)} sessions, {len(r.errors)} "
                    f"errors, create p50 {r.create_p50:.0f} ms, {time.monotonic() - t0:.0f} s",
                    file=sys.stderr,
                )
                for err in r.errors[:5]:
                    print(f"  {err}", file=sys.stderr)

    results = {mode: rs[0] for mode, rs in runs.items()}
    ref = results.get("qwen")
    rows = [
        ("sessions created", lambda r: float(len(r.create_ms)), "{:.0f}"),
        ("create first (ms)", lambda r: r.first_create, "{:.0f}"),
        ("create rest p50 (ms)", lambda r: r.rest_create, "{:.0f}"),
        ("create p50 (ms)", lambda r: r.create_p50, "{:.0f}"),
        ("first prompt p50 (ms)", lambda r: r.prompt_p50, "{:.0f}"),
        ("tree RSS idle (MiB)", lambda r: r.idle_rss, "{:.0f}"),
        ("tree RSS loaded (MiB)", lambda r: r.loaded_rss, "{:.0f}"),
        ("tree RSS released (MiB)", lambda r: r.released_rss, "{:.0f}"),
        ("RSS per session (MiB)", lambda r: r.per_session, "{:.1f}"),
        ("agent processes", lambda r: float(r.agents), "{:.0f}"),
    ]
    modes = list(results)
    print(
        f"\nsessions={args.sessions} gap_s={args.gap_s} (burst: 0); median of {args.runs} "
        "run(s); ratio = mode / qwen serve"
    )
    header = f"{'metric':<24}" + "".join(f"{m:>10}" for m in modes)
    header += "".join(f"{m + '/q':>10}" for m in modes if m != "qwen" and ref)
    print(header)
    for name, one, fmt in rows:

        def get(r: Result, one: Any = one) -> float:
            return float(statistics.median(one(x) for x in runs[r.mode]))

        line = f"{name:<24}" + "".join(f"{fmt.format(get(results[m])):>10}" for m in modes)
        if ref is not None:
            for m in modes:
                if m == "qwen":
                    continue
                a, b = get(results[m]), get(ref)
                line += f"{(a / b if b else float('nan')):>10.2f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
