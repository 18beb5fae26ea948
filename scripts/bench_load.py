#!/usr/bin/env python3
"""Benchmark loading a long conversation: ``POST /session/:id/load`` of a session with a
400-turn history (about 1,760 events), after a daemon restart and again after a DELETE;
the load's latency (median, p95), the time until its history is replayed to the client
(``GET /session/:id/events`` from the start until ``replay_complete``), and how many agent
processes the daemon runs once the load answered.

    .venv/bin/python scripts/bench_load.py [--turns 400] [--restarts 4] [--loads 5]
                                           [--no-qwen] [--eager]

Rows: acp-serve with the scripted agent; when node and ``@qwen-code/qwen-code`` are
installed (``scripts/install-node-deps``), acp-serve with the real ``qwen --acp`` and the
reference ``qwen serve`` (both against the fake model server, as ``tests/support/node.py``
runs them), each building its own conversation through its own agent. ``--eager`` also
measures acp-serve loading through its agent (the journal's ``agent.*`` attributes removed
before each load, as a journal written before loads were answered from it). Every daemon
runs with ``--warm-agents 0`` (acp-serve), so an agent process after the load is one the load
spawned.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

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

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def descendants(pid: int) -> list[int]:
    """Live descendants of ``pid`` (not zombies)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    out: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def agent_processes(server: Server) -> int:
    """Agent children: direct children of the daemon (qwen serve's node relaunch, if any,
    is one process tree per agent: count the daemon's children)."""
    mine = descendants(server.proc.pid)
    parents = {}
    for pid in mine:
        try:
            parents[pid] = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
    return sum(1 for parent in parents.values() if parent == server.proc.pid)


def cpu_ms(pid: int) -> float:
    """CPU time (user + system) of ``pid`` itself so far, ms (10 ms ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


class Turns:
    """Reads a session's SSE stream in a thread and counts ended turns and the last id."""

    def __init__(self, server: Server, sid: str) -> None:
        self.server, self.sid = server, sid
        self.ended = 0
        self.last_id = 0
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with (
            httpx.Client(base_url=self.server.url, headers=AUTH, timeout=None) as client,
            client.stream("GET", f"/session/{self.sid}/events") as stream,
        ):
            for line in stream.iter_lines():
                if line.startswith("id: "):
                    with self.cond:
                        self.last_id = max(self.last_id, int(line[4:]))
                elif line.startswith("event: ") and line[7:] in ("turn_complete", "turn_error"):
                    with self.cond:
                        self.ended += 1
                        self.cond.notify_all()

    def wait_for(self, ended: int, timeout_s: float = 300) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.ended >= ended, timeout_s):
                raise RuntimeError(f"turn {ended} did not end in {timeout_s} s")


def prompt_text(turn: int, scripted: bool) -> str:
    """The scripted agent's turns are 4 or 5 events (a plan on 2 of 5): 4.4 a turn,
    as a real agent's; a real agent gets a plain question."""
    if scripted:
        plan = "[plan a|b] " if turn % 5 < 2 else ""
        return f"[think step {turn}] {plan}answer {turn}"
    return f"Say the number {turn}."


def build(server: Server, turns: int, scripted: bool) -> tuple[str, int]:
    """A session with ``turns`` answered prompts; its id and last event id."""
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=300) as client:
        made = client.post("/session", json={"sessionScope": "thread"})
        made.raise_for_status()
        sid = made.json()["sessionId"]
        reader = Turns(server, sid)
        time.sleep(0.2)  # the stream is open before the first turn
        for turn in range(1, turns + 1):
            body = {"prompt": [{"type": "text", "text": prompt_text(turn, scripted)}]}
            r = client.post(
                f"/session/{sid}/prompt", json=body, headers={"Prefer": "respond-async"}
            )
            if r.status_code not in (200, 202):
                raise RuntimeError(f"prompt {turn}: {r.status_code} {r.text[:200]}")
            reader.wait_for(turn)
        time.sleep(0.2)
        return sid, reader.last_id


def replay_ms(server: Server, sid: str, t0: float, timeout_s: float = 30) -> tuple[float, int]:
    """From ``t0`` until the stream from the start reached ``replay_complete``; and how many
    events it replayed (nan when the daemon sends no ``replay_complete``)."""
    count = 0
    with (
        httpx.Client(base_url=server.url, headers=AUTH, timeout=timeout_s) as client,
        client.stream("GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}) as stream,
    ):
        for line in stream.iter_lines():
            if line.startswith("id: "):
                count += 1
            elif line == "event: replay_complete":
                return (time.perf_counter() - t0) * 1000, count
            if time.perf_counter() - t0 > timeout_s:
                break
    return float("nan"), count


def strip_attrs(state: Path, sid: str) -> None:
    """Remove the journal meta's ``agent.*`` attributes (the eager path's journal)."""
    for meta_path in (state / "journal").glob("*/meta.json"):
        meta = json.loads(meta_path.read_text())
        if meta["meta"]["session_id"] == sid:
            meta["meta"]["attrs"] = {}
            meta_path.write_text(json.dumps(meta))


class Row:
    def __init__(self, name: str) -> None:
        self.name = name
        self.load: list[float] = []
        self.first: list[float] = []
        self.replay: list[float] = []
        self.cpu: list[float] = []
        self.agents: list[int] = []
        self.events = 0
        self.replayed = 0


def measure(
    row: Row,
    make: Callable[[int], Server],
    *,
    turns: int,
    restarts: int,
    loads: int,
    scripted: bool,
    before_load: Callable[[str], None] | None = None,
) -> None:
    server = make(0)
    try:
        sid, row.events = build(server, turns, scripted)
    finally:
        server.stop()
    for life in range(1, restarts + 1):
        server = make(life)
        try:
            with httpx.Client(base_url=server.url, headers=AUTH, timeout=300) as client:
                for k in range(loads):
                    if before_load is not None:
                        before_load(sid)
                    c0 = cpu_ms(server.proc.pid)
                    t0 = time.perf_counter()
                    r = client.post(f"/session/{sid}/load", json={})
                    elapsed = (time.perf_counter() - t0) * 1000
                    row.cpu.append(cpu_ms(server.proc.pid) - c0)
                    if r.status_code != 200:
                        raise RuntimeError(f"load: {r.status_code} {r.text[:300]}")
                    row.load.append(elapsed)
                    if k == 0:
                        row.first.append(elapsed)
                    row.agents.append(agent_processes(server))
                    ms, row.replayed = replay_ms(server, sid, t0)
                    row.replay.append(ms)
                    if k < loads - 1:
                        client.delete(f"/session/{sid}")
                        time.sleep(0.3)  # (the closed session's agent, if any, is gone)
        finally:
            server.stop()
        print(f"  {row.name}: life {life}/{restarts} done", file=sys.stderr)


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)] if ordered else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--restarts", type=int, default=4, help="daemon lives measured")
    parser.add_argument("--loads", type=int, default=5, help="loads per life (DELETE between)")
    parser.add_argument("--no-qwen", action="store_true", help="skip the node rows")
    parser.add_argument("--eager", action="store_true", help="also load through the agent")
    args = parser.parse_args()

    from tests.support.fake_openai import FakeOpenAI
    from tests.support.node import qwen_acp_argv, qwen_cli, qwen_env

    tmp = Path(tempfile.mkdtemp(prefix="bench-load-"))
    workspace = tmp / "ws"
    workspace.mkdir()
    cli = None if args.no_qwen or not shutil.which("node") else qwen_cli()
    rows: list[Row] = []
    with FakeOpenAI(workdir=str(workspace)) as model:
        env = qwen_env(tmp / "home", model.env())
        env["QWEN_SERVER_TOKEN"] = TOKEN

        def acp_serve(state: Path, agent: str | None) -> Callable[[int], Server]:
            def make(_: int) -> Server:
                port = free_port()
                argv = acp_serve_argv(workspace, state, port, agent)
                argv.remove("--no-journal")
                argv += ["--warm-agents", "0", "--initialize-timeout-ms", "60000"]
                return start("acp-serve", argv, env, port, ROOT)

            return make

        plan: list[tuple[str, Callable[[int], Server], bool, Callable[[str], None] | None]] = []
        state = tmp / "state-scripted"
        plan.append(("acp-serve, scripted agent", acp_serve(state, None), True, None))
        if args.eager:
            eager_state = tmp / "state-scripted-eager"
            plan.append(
                (
                    "acp-serve, scripted, through the agent",
                    acp_serve(eager_state, None),
                    True,
                    lambda sid: strip_attrs(eager_state, sid),
                )
            )
        if cli is not None:
            agent = " ".join(qwen_acp_argv(cli))
            plan.append(
                ("acp-serve, qwen --acp", acp_serve(tmp / "state-qwen", agent), False, None)
            )

            def reference(_: int) -> Server:
                port = free_port()
                return start("qwen-serve", qwen_serve_argv(cli, workspace, port), env, port, tmp)

            plan.append(("qwen serve", reference, False, None))
        for name, make, scripted, before in plan:
            row = Row(name)
            try:
                measure(
                    row,
                    make,
                    turns=args.turns,
                    restarts=args.restarts,
                    loads=args.loads,
                    scripted=scripted,
                    before_load=before,
                )
            except (RuntimeError, OSError, httpx.HTTPError) as exc:
                print(f"  {name}: failed: {exc}", file=sys.stderr)
            rows.append(row)
    n = args.restarts * args.loads
    print(
        f"load of a {args.turns}-turn session: {args.restarts} daemon lives x {args.loads} loads"
        f" ({n} loads; ms)"
    )
    head = (
        f"{'':<40}{'events':>7}{'load p50':>10}{'p95':>8}{'1st p50':>9}"
        f"{'+replay p50':>12}{'replayed':>9}{'agents':>8}{'cpu p50':>9}"
    )
    print(head)
    for row in rows:
        if not row.load:
            print(f"{row.name:<40}  (no figures)")
            continue
        replays = [v for v in row.replay if v == v]
        replay = f"{statistics.median(replays):>12.1f}" if replays else f"{'-':>12}"
        print(
            f"{row.name:<40}{row.events:>7}{statistics.median(row.load):>10.1f}"
            f"{p95(row.load):>8.1f}{statistics.median(row.first):>9.1f}{replay}"
            f"{row.replayed:>9}{max(row.agents):>8}{statistics.median(row.cpu):>9.0f}"
        )
    print(
        "1st: the first load after a restart; +replay: until the stream from the start reached"
        " replay_complete; agents: the most agent processes the daemon ran right after a load"
        " answered; cpu: the daemon process's own CPU per load (10 ms ticks; its agent"
        " children's not counted)"
    )
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
