#!/usr/bin/env python3
"""Every headline figure in one run: acp-serve beside ``qwen serve`` 0.24.4 and a bare
hypercorn-trio app, the modes interleaved run by run, with ratios.

    .venv/bin/python scripts/bench_round.py [--runs 3]
        [--sections small,prompt,packed,iso,pattern,turn[,journal]] [--prompts 30]
        [--sessions 12] [--turn-prompts 300] [--journal-prompts 100] [--flood-events 40000]
        [--no-failover-frozen] [--base-root DIR] [--markdown]

Both daemons run the real ``qwen --acp`` (``node <cli.js> --acp``) against the fake model
of ``tests/support/fake_openai.py``, on the same workspace. Sections (each interleaves its
modes run by run; per mode a fresh process):

* ``small`` — ``bare`` (this script's ``--bare-app``: hypercorn-trio with a plain ASGI
  callable that answers the same ``/health`` and ``/capabilities`` bytes as acp-serve: the
  floor of the card's stack), ``acp`` (default flags: one warm spare) and ``qwen``.
  ``GET /health`` and ``GET /capabilities`` p50 over 2,000 sequential keep-alive requests
  (a raw-socket client with pre-built requests), ``/capabilities`` and ``/health``
  throughput with ``wrk -t1 -c32`` (``/capabilities`` falls back to a trio client when
  ``wrk`` is missing), the server's CPU per request during each wrk run
  (``/proc/<pid>/stat``; steadier than wall time on a busy machine), and the idle RSS of
  the daemon process. The server's main process runs pinned to the last core and the
  clients (this script, ``wrk``) to the first (``--no-pin``: not): unpinned, sequential
  latencies came out bimodal (0.30 or 0.40 ms for the same server, run to run), by
  where the scheduler put the two ends.
* ``prompt`` — ``qwen``, ``warm1`` (acp-serve defaults) and ``warm0`` (``--warm-agents
  0``): one live session, ``--prompts`` prompt round trips after ``--settle-s`` (as
  ``scripts/bench_warm.py``), then SIGTERM to exit with that idle session.
* ``packed`` — ``qwen``, ``packed`` (``--sessions-per-agent --sessions``) and
  ``packedspare`` (the same with ``--packed-spare``: a spare child once the child is full,
  the default before ``serve/agents/warm.py``): ``--sessions`` sessions ``--gap-s`` apart,
  each prompted once (as ``scripts/bench_density.py``): create p50 and process-tree RSS
  with all of them live.
* ``iso`` — ``qwen`` and ``iso`` (``--sessions-per-agent 1``): the same arrivals.
* ``pattern`` — ``qwen``, ``packed`` and ``iso``: the patterns users make, each on a fresh
  daemon: ``interleaved`` (``--sessions`` times a create, then its prompt at once, then
  the next create: a user starting sessions one after another) and ``burst``
  (``--sessions`` creates back to back, then one prompt each): create p50 of each.
* ``turn`` — the daemon's own cost per turn (``scripts/bench_turn.py``): ``scripted`` and
  ``qwen`` (``qwen --acp``) driven directly over stdio beside acp-serve (blocking ``POST
  /session/:id/prompt``) and, for ``qwen --acp``, ``qwen serve`` (time to
  ``turn_complete`` on SSE, as acp-serve's ``acp-sse``), ``--turn-prompts`` prompts
  interleaved one by one; the cost is acp-serve minus direct (p50 and p99).

* ``journal`` (opt-in: not in the default ``--sections``) — the files journal beside the
  PostgreSQL one (``--journal-url`` on a PostgreSQL server this script starts for the
  section, ``tests/support/postgres.py``, and stops), the scripted agent: prompt round trip
  to ``turn_complete`` on SSE (p50, p99; ``--journal-prompts``, every daemon's prompts
  interleaved one by one, with ``qwen --acp`` behind each journal beside ``qwen serve``),
  ``POST /session/:id/load`` served from the journal after a restart (p50, ``--sessions``
  sessions), events/s of a ``[flood --flood-events]`` turn (to the end of the turn, and
  journaled), and the failover time of two daemons on one database (the owner SIGKILLed,
  and SIGSTOPped unless ``--no-failover-frozen``): ``scripts/bench_round_journal.py``.
  Printed as its own table: files, PostgreSQL, PG/files, ``qwen serve``, PG/qwen.

``base-<mode>`` (``--base-modes acp,warm1,...``) adds the same mode run by the daemon of
the source tree ``--base-root`` (e.g. ``git archive main`` unpacked): before/after in one
run. Printed: per row the median over runs of each mode, and ratios to ``qwen`` and (for
the two small GETs) to ``bare``; ``--markdown`` prints the table for docs/performance.md.
The load average is printed at the start and the end: read small differences as noise.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench_round_journal  # noqa: E402
from bench_density import (  # noqa: E402
    AUTH,
    TOKEN,
    Result,
    acp_serve_argv,
    drive,
    free_port,
    prompt_once,
    qwen_serve_argv,
    start,
    stop,
    tree_rss_mib,
)
from bench_serve import Server, latencies, rss_mib, throughput  # noqa: E402
from bench_turn import measure as measure_turns  # noqa: E402
from bench_warm import cpu_s  # noqa: E402
from bench_warm import measure as measure_prompts  # noqa: E402

Figures = dict[str, float]


# ---- the bare hypercorn-trio app -------------------------------------------------------------


def serve_bare(port: int, caps_file: Path) -> None:
    """hypercorn-trio serving a plain ASGI callable: the stack's floor."""
    import hypercorn.config
    import hypercorn.trio

    health = b'{"status":"ok"}'
    caps = caps_file.read_bytes()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = health if scope["path"] == "/health" else caps
        head = [
            (b"content-type", b"application/json; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": body})

    config = hypercorn.config.Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.include_server_header = False
    trio.run(hypercorn.trio.serve, app, config)  # type: ignore[arg-type]


# ---- measurements ----------------------------------------------------------------------------


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def wrk_rps(url: str, seconds: int, pid: int) -> tuple[float, float]:
    """``wrk -t1 -c32`` on ``url``: (requests/s, server CPU µs per request)."""
    before = cpu_s(pid)
    out = subprocess.run(
        ["wrk", "-t1", "-c32", f"-d{seconds}s", "-H", f"Authorization: Bearer {TOKEN}", url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    used = cpu_s(pid) - before
    rps = float(re.search(r"Requests/sec:\s*([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    return rps, 1e6 * used / max(total, 1)


async def small_gets(server: Server) -> Figures:
    await latencies(server, "/health", 300)  # warm up
    out = {
        "health_p50_ms": statistics.median(await latencies(server, "/health", 2000)),
        "caps_p50_ms": statistics.median(await latencies(server, "/capabilities", 2000)),
    }
    return out


def run_small(mode: str, ctx: Context) -> Figures:
    port = free_port()
    log = ctx.tmp / f"{mode}-{port}.log"
    if mode == "bare":
        argv = [sys.executable, __file__, "--bare-app", str(port), str(ctx.caps_file)]
        cwd = ROOT
    elif mode == "qwen":
        argv, cwd = qwen_serve_argv(ctx.cli, ctx.workspace, port), ctx.workspace
    else:
        argv, cwd = ctx.acp_argv(mode, port, [])
    proc = start(argv, ctx.env, port, cwd, log)
    cpus = sorted(os.sched_getaffinity(0))
    pinned = len(cpus) >= 2 and not ctx.args.no_pin
    try:
        time.sleep(ctx.args.settle_s)  # the spare (or qwen's own child) starts and idles
        if pinned:  # the server on one core, the clients on another: no placement luck
            os.sched_setaffinity(proc.pid, {cpus[-1]})
            os.sched_setaffinity(0, {cpus[0]})
        url = f"http://127.0.0.1:{port}"
        server = Server(mode, proc, url, "127.0.0.1", port, 0.0)  # type: ignore[arg-type]
        if mode != "bare" and not ctx.caps_file.exists():
            body = httpx.get(f"{url}/capabilities", headers=AUTH).content
            ctx.caps_file.write_bytes(body)
        out = {"idle_rss_mib": rss_mib(proc.pid)} if mode != "bare" else {}
        out |= trio.run(small_gets, server)
        if shutil.which("wrk"):
            rps, cpu_us = wrk_rps(f"{url}/capabilities", ctx.args.wrk_s, proc.pid)
            out["caps_rps_32"], out["caps_cpu_us"] = rps, cpu_us
            rps, cpu_us = wrk_rps(f"{url}/health", ctx.args.wrk_s, proc.pid)
            out["health_rps_32"], out["health_cpu_us"] = rps, cpu_us
        else:
            out["caps_rps_32"] = trio.run(throughput, server, "/capabilities", 32, 5.0)
        return out
    finally:
        os.sched_setaffinity(0, set(cpus))
        stop(proc)


def stop_timed(proc: subprocess.Popen[str]) -> float:
    """SIGTERM to the daemon's exit, in ms."""
    t0 = time.perf_counter()
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        pass
    elapsed = (time.perf_counter() - t0) * 1000
    stop(proc)
    return elapsed


def run_prompt(mode: str, ctx: Context) -> Figures:
    port = free_port()
    if mode == "qwen":
        argv, cwd = qwen_serve_argv(ctx.cli, ctx.workspace, port), ctx.workspace
    else:
        warm = mode.removeprefix("base-").removeprefix("warm")
        argv, cwd = ctx.acp_argv(mode, port, ["--warm-agents", warm])
    proc = start(argv, ctx.env, port, cwd, ctx.tmp / f"{mode}-{port}.log")
    try:
        time.sleep(3.0)
        got = trio.run(
            measure_prompts, f"http://127.0.0.1:{port}", proc.pid, ctx.args.prompts, 8.0, 0.0
        )
        out = {k: got[k] for k in ("prompt_p50_ms", "prompt_p90_ms", "spare_cpu_pct")}
        out["daemon_cpu_pct"] = got["daemon_cpu_pct"]
        out["sigterm_exit_ms"] = stop_timed(proc)
        return out
    finally:
        stop(proc)


def run_sessions(mode: str, ctx: Context, per_agent: int) -> Figures:
    port = free_port()
    if mode == "qwen":
        argv, cwd = qwen_serve_argv(ctx.cli, ctx.workspace, port), ctx.workspace
    else:
        flags = ["--sessions-per-agent", str(per_agent)]
        if mode.endswith("spare"):  # a spare child once the child is full (warm.py)
            flags += ["--packed-spare"]
        argv, cwd = ctx.acp_argv(mode, port, flags)
    proc = start(argv, ctx.env, port, cwd, ctx.tmp / f"{mode}-{port}.log")
    result = Result(mode)
    try:
        time.sleep(ctx.args.settle_s)
        result.idle_rss = tree_rss_mib(proc.pid)
        trio.run(drive, f"http://127.0.0.1:{port}", result, ctx.args.sessions, ctx.args.gap_s)
        time.sleep(2.0)
        result.loaded_rss = tree_rss_mib(proc.pid)
    finally:
        stop(proc)
    for err in result.errors[:3]:
        print(f"  {mode}: {err}", file=sys.stderr)
    return {
        "create_p50_ms": result.create_p50,
        "first_prompt_p50_ms": result.prompt_p50,
        "tree_rss_loaded_mib": result.loaded_rss,
    }


async def drive_pattern(url: str, sessions: int, interleaved: bool) -> Figures:
    """``interleaved``: create, its prompt at once, the next create...; else every create
    back to back, then a prompt each."""
    creates: list[float] = []
    prompts: list[float] = []
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=300) as client:
        made: list[str] = []
        for i in range(sessions):
            t0 = time.perf_counter()
            created = await client.post("/session", json={"sessionScope": "thread"})
            creates.append((time.perf_counter() - t0) * 1000)
            if created.status_code != 200:
                raise RuntimeError(f"create {i}: {created.status_code} {created.text[:160]}")
            made.append(created.json()["sessionId"])
            if interleaved:
                prompts.append(await prompt_once(client, made[-1], f"hello {i}"))
        if not interleaved:
            for i, sid in enumerate(made):
                prompts.append(await prompt_once(client, sid, f"hello {i}"))
    return {
        "create_p50_ms": statistics.median(creates),
        "prompt_p50_ms": statistics.median(prompts),
    }


def run_pattern(mode: str, ctx: Context) -> Figures:
    out: Figures = {}
    for pattern in ("inter", "burst"):
        port = free_port()
        if mode == "qwen":
            argv, cwd = qwen_serve_argv(ctx.cli, ctx.workspace, port), ctx.workspace
        else:
            per_agent = ctx.args.sessions if mode.removeprefix("base-") == "packed" else 1
            argv, cwd = ctx.acp_argv(mode, port, ["--sessions-per-agent", str(per_agent)])
        proc = start(argv, ctx.env, port, cwd, ctx.tmp / f"{mode}-{pattern}-{port}.log")
        try:
            time.sleep(ctx.args.settle_s)
            got = trio.run(
                drive_pattern, f"http://127.0.0.1:{port}", ctx.args.sessions, pattern == "inter"
            )
        finally:
            stop(proc)
        out |= {f"{pattern}_{k}": v for k, v in got.items()}
    return out


def run_turn(mode: str, ctx: Context) -> Figures:
    flags = ["--warm-agents", "0"]  # (a spare's start would fall among the prompts)
    return measure_turns(
        mode, ctx.env, ctx.workspace, ctx.tmp, ctx.args.turn_prompts, flags, ctx.cli
    )


class Context:
    def __init__(self, args: argparse.Namespace, tmp: Path, env: dict[str, str], cli: Path):
        from tests.support.node import qwen_acp_argv

        self.args = args
        self.tmp = tmp
        self.env = env
        self.cli = cli
        self.workspace = tmp / "ws"
        self.caps_file = tmp / "capabilities.json"
        self.agent = shlex.join(qwen_acp_argv(cli))
        self.pg: Any = None  # the PostgreSQL server of the journal section

    def acp_argv(self, mode: str, port: int, flags: list[str]) -> tuple[list[str], Path]:
        state = self.tmp / f"state-{mode}-{time.monotonic_ns()}"
        argv = acp_serve_argv(self.workspace, state, port, self.agent, flags)
        cwd = Path(self.args.base_root) if mode.startswith("base-") else ROOT
        return argv, cwd


SECTIONS: dict[str, list[str]] = {
    "small": ["bare", "acp", "qwen"],
    "prompt": ["qwen", "warm1", "warm0"],
    "packed": ["qwen", "packed", "packedspare"],
    "iso": ["qwen", "iso"],
    "pattern": ["qwen", "packed", "iso"],
    "turn": ["scripted", "qwen"],
    "journal": bench_round_journal.MODES,
}

#: (label, section, key, the acp-serve mode, format): one printed row each.
ROWS: list[tuple[str, str, str, str, str]] = [
    ("GET /health p50 (ms)", "small", "health_p50_ms", "acp", "{:.3f}"),
    ("GET /capabilities p50 (ms)", "small", "caps_p50_ms", "acp", "{:.3f}"),
    ("/capabilities req/s, wrk 32 conns", "small", "caps_rps_32", "acp", "{:.0f}"),
    ("/capabilities server CPU µs/req", "small", "caps_cpu_us", "acp", "{:.0f}"),
    ("/health req/s, wrk 32 conns", "small", "health_rps_32", "acp", "{:.0f}"),
    ("/health server CPU µs/req", "small", "health_cpu_us", "acp", "{:.0f}"),
    ("idle RSS, daemon process (MiB)", "small", "idle_rss_mib", "acp", "{:.1f}"),
    ("prompt p50, default (one spare) (ms)", "prompt", "prompt_p50_ms", "warm1", "{:.1f}"),
    ("prompt p50, --warm-agents 0 (ms)", "prompt", "prompt_p50_ms", "warm0", "{:.1f}"),
    ("prompt p90, default (ms)", "prompt", "prompt_p90_ms", "warm1", "{:.1f}"),
    ("spare CPU, % of a core", "prompt", "spare_cpu_pct", "warm1", "{:.2f}"),
    ("SIGTERM -> exit, idle session (ms)", "prompt", "sigterm_exit_ms", "warm1", "{:.0f}"),
    ("packed sessions: create p50 (ms)", "packed", "create_p50_ms", "packed", "{:.0f}"),
    ("packed sessions: tree RSS (MiB)", "packed", "tree_rss_loaded_mib", "packed", "{:.0f}"),
    ("packed: first prompt p50 (ms)", "packed", "first_prompt_p50_ms", "packed", "{:.0f}"),
    ("packed, --packed-spare: tree RSS", "packed", "tree_rss_loaded_mib", "packedspare", "{:.0f}"),
    ("isolated create p50 (ms)", "iso", "create_p50_ms", "iso", "{:.0f}"),
    (
        "packed, create->prompt->create: create p50",
        "pattern",
        "inter_create_p50_ms",
        "packed",
        "{:.1f}",
    ),
    (
        "packed, create->prompt->create: prompt p50",
        "pattern",
        "inter_prompt_p50_ms",
        "packed",
        "{:.1f}",
    ),
    ("packed, burst of creates: create p50", "pattern", "burst_create_p50_ms", "packed", "{:.1f}"),
    (
        "isolated, create->prompt->create: create p50",
        "pattern",
        "inter_create_p50_ms",
        "iso",
        "{:.1f}",
    ),
    (
        "isolated, create->prompt->create: prompt p50",
        "pattern",
        "inter_prompt_p50_ms",
        "iso",
        "{:.1f}",
    ),
    ("isolated, burst of creates: create p50", "pattern", "burst_create_p50_ms", "iso", "{:.1f}"),
    ("scripted agent over stdio: turn p50 (ms)", "turn", "direct_p50_ms", "scripted", "{:.2f}"),
    ("scripted, behind acp-serve: turn p50", "turn", "acp_p50_ms", "scripted", "{:.2f}"),
    ("scripted: daemon cost per turn p50", "turn", "cost_p50_ms", "scripted", "{:.2f}"),
    ("scripted: daemon cost per turn p99", "turn", "cost_p99_ms", "scripted", "{:.2f}"),
    ("scripted: daemon CPU per turn (ms)", "turn", "daemon_cpu_ms", "scripted", "{:.2f}"),
    ("qwen --acp over stdio: turn p50 (ms)", "turn", "direct_p50_ms", "qwen", "{:.2f}"),
    ("qwen --acp, behind acp-serve: turn p50", "turn", "acp_p50_ms", "qwen", "{:.2f}"),
    ("qwen --acp: daemon cost per turn p50", "turn", "cost_p50_ms", "qwen", "{:.2f}"),
    ("qwen --acp: daemon cost per turn p99", "turn", "cost_p99_ms", "qwen", "{:.2f}"),
    ("qwen --acp: daemon CPU per turn (ms)", "turn", "daemon_cpu_ms", "qwen", "{:.2f}"),
    ("qwen --acp: turn p50 to turn_complete on SSE", "turn", "acp-sse_p50_ms", "qwen", "{:.2f}"),
]

#: Rows whose ``qwen serve`` figure is another key of the same run (the turn section runs
#: every kind of client in one go); other ``turn`` rows have none.
REF_KEYS: dict[str, str] = {"acp-sse_p50_ms": "qwen_p50_ms"}


def run_mode(section: str, mode: str, ctx: Context) -> Figures:
    plain = mode.removeprefix("base-")
    if section == "small":
        return run_small(mode, ctx)
    if section == "prompt":
        return run_prompt(mode, ctx)
    if section == "pattern":
        return run_pattern(mode, ctx)
    if section == "turn":
        return run_turn(plain, ctx)
    if section == "journal":
        return bench_round_journal.run_journal(plain, ctx)
    per_agent = ctx.args.sessions if plain.startswith("packed") else 1
    return run_sessions(mode, ctx, per_agent)


def report(results: dict[tuple[str, str], list[Figures]], args: argparse.Namespace) -> None:
    def med(section: str, mode: str, key: str) -> float:
        values = [r[key] for r in results.get((section, mode), []) if key in r]
        return float(statistics.median(values)) if values else float("nan")

    base = args.base_modes.split(",") if args.base_modes else []
    head = ["metric", "qwen serve", "bare app", "acp-serve", "acp/qwen", "acp/bare"]
    if base:
        head[4:4] = ["before", "before/qwen"]
    lines = [head]
    for label, section, key, mode, fmt in ROWS:
        if section not in args.sections:
            continue
        ours, ref = med(section, mode, key), med(section, "qwen", key)
        if section == "turn":
            ref = med(section, mode, REF_KEYS[key]) if key in REF_KEYS else float("nan")
        bare = med(section, "bare", key) if section == "small" else float("nan")
        row = [label, fmt.format(ref), fmt.format(bare), fmt.format(ours)]
        if base:
            before = med(section, f"base-{mode}", key)
            row += [fmt.format(before), f"{before / ref:.2f}" if ref else "-"]
        row.append(f"{ours / ref:.2f}" if ref == ref and ref else "-")
        row.append(f"{ours / bare:.2f}" if bare == bare and bare else "-")
        lines.append([c if c != "nan" else "-" for c in row])
    if len(lines) > 1:
        print_table(lines, args.markdown)
    if "journal" in args.sections:
        print()
        print_table(bench_round_journal.report(results), args.markdown)


def print_table(lines: list[list[str]], markdown: bool) -> None:
    """``lines``: the head, then the rows; aligned, or as a markdown table."""
    head = lines[0]
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in lines[1:]:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    for row in lines:
        print(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--bare-app":
        serve_bare(int(sys.argv[2]), Path(sys.argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sections", default="small,prompt,packed,iso,pattern,turn")
    parser.add_argument("--prompts", type=int, default=30)
    parser.add_argument("--turn-prompts", type=int, default=300, help="turn: prompts per kind")
    parser.add_argument("--sessions", type=int, default=12)
    parser.add_argument("--gap-s", type=float, default=1.5)
    parser.add_argument("--settle-s", type=float, default=6.0)
    parser.add_argument("--wrk-s", type=int, default=5)
    parser.add_argument(
        "--journal-prompts", type=int, default=100, help="journal: prompt round trips per daemon"
    )
    parser.add_argument(
        "--flood-events", type=int, default=40_000, help="journal: events of the flood turn"
    )
    parser.add_argument(
        "--no-failover-frozen",
        dest="failover_frozen",
        action="store_false",
        help="journal: only the SIGKILLed owner's failover (the frozen one waits out a lease)",
    )
    parser.add_argument("--base-root", default=str(ROOT))
    parser.add_argument("--base-modes", default="", help="e.g. acp,warm1,packed")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument(
        "--no-pin", action="store_true", help="small: do not pin server and clients to cores"
    )
    args = parser.parse_args()
    args.sections = args.sections.split(",")

    from tests.support.fake_openai import FakeOpenAI
    from tests.support.node import ensure_qwen, qwen_env

    cli = ensure_qwen()
    tmp = Path(tempfile.mkdtemp(prefix="bench-round-"))
    (tmp / "ws").mkdir()
    print(f"load average at start: {loadavg()}", file=sys.stderr)
    results: dict[tuple[str, str], list[Figures]] = {}
    base = [m for m in args.base_modes.split(",") if m]
    with FakeOpenAI(workdir=str(tmp / "ws")) as model, contextlib.ExitStack() as stack:
        env = qwen_env(tmp / "home", model.env())
        env["QWEN_SERVER_TOKEN"] = TOKEN
        ctx = Context(args, tmp, env, cli)
        if "journal" in args.sections:
            from tests.support.postgres import running_postgres, skip_reason

            if (why := skip_reason()) is not None:
                raise SystemExit(f"the journal section needs PostgreSQL: {why}")
            ctx.pg = stack.enter_context(running_postgres())
        for run in range(args.runs):
            for section in args.sections:
                modes = SECTIONS[section]
                modes = modes + [f"base-{m}" for m in base if m in modes]
                if run % 2:  # A,B,A,B: every other run in the reverse order
                    modes = modes[::-1]
                if section == "small" and not ctx.caps_file.exists():
                    modes = sorted(modes, key=lambda m: m == "bare")  # the bytes come first
                for mode in modes:
                    t0 = time.monotonic()
                    got = run_mode(section, mode, ctx)
                    results.setdefault((section, mode), []).append(got)
                    took = time.monotonic() - t0
                    shown = ", ".join(f"{k} {v:.3g}" for k, v in got.items())
                    print(
                        f"run {run + 1} {section}/{mode} ({took:.0f} s): {shown}", file=sys.stderr
                    )
    print(f"load average at the end: {loadavg()}", file=sys.stderr)
    print(f"\nmedian of {args.runs} run(s); load average now {loadavg()}")
    report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
