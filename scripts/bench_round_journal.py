"""The ``journal`` section of ``scripts/bench_round.py``: the files journal beside the
PostgreSQL one (``--journal-url``) and the failover time of two daemons on one database.

Modes (the journal on in every acp-serve daemon; a fresh database per daemon on the
PostgreSQL server ``bench_round.py`` starts for the section,
:func:`tests.support.postgres.running_postgres`: ``initdb`` in a temporary directory,
127.0.0.1 and a unix socket there, ``fsync`` on):

* ``files`` and ``pg`` — a fresh daemon with the default agent (the scripted one):
  ``flood``: one turn ``[flood --flood-events]`` (blocking POST), the events published
  divided by the time to the end of the turn, and the events the journal wrote divided by
  the time until it is done with the turn (every event the log published written or shed,
  nothing buffered: ``GET /daemon/status?detail=full``), and the share shed (the writer
  fell ``max_buffer_bytes`` behind); ``load``: ``--sessions`` sessions prompted twice each,
  the daemon stopped (SIGTERM) and started again on the same state directory (database),
  then ``POST /session/:id/load`` of each (p50: served from the journal, no agent).
* ``rtt`` — five daemons at once (:data:`RTT_DAEMONS`): the scripted agent and ``qwen
  --acp`` behind each journal, and ``qwen serve`` (which runs ``qwen --acp`` itself: it has
  no row with the scripted agent, no journal to load from, no flood). One session each;
  ``--journal-prompts`` prompts per daemon, each timed from the POST (``Prefer:
  respond-async``) to its ``turn_complete`` on the session's SSE stream (p50, p99), after 5
  warm-ups, the daemons taking turns prompt by prompt.
* ``failover`` — two daemons (A, B) on one database, one ``--shared-dir`` and one
  workspace, each with its own ``--state-dir``. A session is made on A and prompted once;
  once A's journal has the turn, A is SIGKILLed (its process group), and B is asked
  ``POST /session/:id/prompt`` (blocking) again every 50 ms until it answers 200: the
  time from the kill to that answer (B takes the session over on the first request). The
  same with A frozen (SIGSTOP) instead: B forwards to A, which cannot answer, until A's
  lease expires (``--journal-lease-ms``, 20 s); then A gets SIGCONT and is stopped. Needs
  the cluster core (``--advertise-url`` in ``python -m serve --help`` and
  ``serve/cluster/``): without it the rows say so. Without ``--shared-dir`` the scripted
  agent's store (what the failover needs shared) is linked into both state directories.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from bench_density import AUTH, acp_serve_argv, free_port, qwen_serve_argv, start, stop
from bench_turn import Http, pct

Figures = dict[str, float]

ROOT = Path(__file__).resolve().parents[1]
MODES = ["files", "pg", "rtt", "failover"]
#: Bound on a wait for the journal to catch up or for a failover, in seconds.
WAIT_S = 90.0
#: How often the failover client asks again (and the status is polled), in seconds.
RETRY_S = 0.05
NEEDS_CORE = "n/a (needs the cluster core)"


def prompt_body(text: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": text}]}


def daemon_argv(
    ctx: Any, state: Path, port: int, url: str | None, workspace: Path, agent: str | None
) -> list[str]:
    """acp-serve with the journal on (``url``: on PostgreSQL); ``agent`` None: the default
    agent (the scripted one, its store under the state or shared directory)."""
    argv = acp_serve_argv(workspace, state, port, agent or "", [])
    argv.remove("--no-journal")
    if agent is None:
        at = argv.index("--agent")
        del argv[at : at + 2]
    return argv + (["--journal-url", url] if url else [])


def round_trips(ports: dict[str, int], prompts: int) -> Figures:
    """Per daemon (name -> port), one session, prompts timed to ``turn_complete`` on SSE,
    one daemon after the other prompt by prompt (the machine's load falls on all alike):
    ``rtt_p50_ms@<name>`` and ``rtt_p99_ms@<name>``, or without ``@`` for one daemon."""
    clients: dict[str, Http] = {}
    try:
        for name, port in ports.items():
            clients[name] = Http(port)
        for i in range(5):
            for client in clients.values():
                client.prompt_sse(f"warm {i}")
        times: dict[str, list[float]] = {name: [] for name in clients}
        for i in range(prompts):
            for name, client in clients.items():
                times[name].append(client.prompt_sse(f"hi {i}"))
    finally:
        for client in clients.values():
            client.close()
    out: Figures = {}
    for name, values in times.items():
        at = f"@{name}" if len(ports) > 1 else ""
        out[f"rtt_p50_ms{at}"] = statistics.median(values)
        out[f"rtt_p99_ms{at}"] = pct(values, 0.99)
    return out


def session_status(client: httpx.Client, sid: str) -> dict[str, Any]:
    body = client.get("/daemon/status", params={"detail": "full"}).json()
    for entry in body["full"]["sessions"]:
        if entry.get("sessionId") == sid:
            return dict(entry)
    raise RuntimeError(f"{sid} is not live")


def journal_caught_up(client: httpx.Client, sid: str) -> dict[str, Any]:
    """Wait (bounded) until the session's journal has done with every event its log
    published; its stats."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        entry = session_status(client, sid)
        stats = entry.get("journal")
        published = entry["eventLog"]["published"]
        # Every event written or shed (a shed tail is never written: the journal restarts
        # after the gap with the next event), nothing in flight.
        done = stats and stats["eventsWritten"] + stats["droppedEvents"] >= published
        if done and not stats["bufferedBytes"]:
            return dict(stats)
        time.sleep(RETRY_S)
    raise RuntimeError(f"the journal of {sid} did not catch up in {WAIT_S:.0f} s")


def flood(client: httpx.Client, events: int) -> Figures:
    sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
    client.post(f"/session/{sid}/prompt", json=prompt_body("warm")).raise_for_status()
    before = journal_caught_up(client, sid)
    published0 = session_status(client, sid)["eventLog"]["published"]
    t0 = time.perf_counter()
    client.post(f"/session/{sid}/prompt", json=prompt_body(f"[flood {events}]")).raise_for_status()
    turn_s = time.perf_counter() - t0
    after = journal_caught_up(client, sid)
    journal_s = time.perf_counter() - t0
    published = session_status(client, sid)["eventLog"]["published"] - published0
    written = after["eventsWritten"] - before["eventsWritten"]
    shed = after["droppedEvents"] - before["droppedEvents"]
    return {
        "flood_turn_eps": published / turn_s,
        "flood_journal_eps": written / journal_s,
        "flood_shed_pct": 100 * shed / max(published, 1),
    }


def run_backend(mode: str, ctx: Any) -> Figures:
    url = ctx.pg.new_database() if mode == "pg" else None
    state = ctx.tmp / f"state-journal-{mode}-{time.monotonic_ns()}"
    port = free_port()
    argv = daemon_argv(ctx, state, port, url, ctx.workspace, None)
    log = ctx.tmp / f"journal-{mode}-{port}.log"
    proc = start(argv, ctx.env, port, ROOT, log)
    out: Figures = {}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=300) as c:
            out |= flood(c, ctx.args.flood_events)
            sids = []
            for _ in range(ctx.args.sessions):
                made = c.post("/session", json={"sessionScope": "thread"})
                sid = made.json()["sessionId"]
                for i in range(2):
                    c.post(f"/session/{sid}/prompt", json=prompt_body(f"hi {i}")).raise_for_status()
                sids.append(sid)
    finally:
        stop(proc)
    port = free_port()
    argv = daemon_argv(ctx, state, port, url, ctx.workspace, None)
    proc = start(argv, ctx.env, port, ROOT, ctx.tmp / f"journal-{mode}-load-{port}.log")
    try:
        loads = []
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=300) as c:
            for sid in sids:
                t0 = time.perf_counter()
                c.post(f"/session/{sid}/load", json={}).raise_for_status()
                loads.append((time.perf_counter() - t0) * 1000)
        out["load_p50_ms"] = statistics.median(loads)
    finally:
        stop(proc)
    return out


#: The daemons of the ``rtt`` mode: name -> (journal, agent: None the scripted one, "qwen"
#: ``qwen --acp``); ``qwen`` is ``qwen serve``.
RTT_DAEMONS: dict[str, tuple[str, str | None]] = {
    "files": ("files", None),
    "pg": ("pg", None),
    "files+qwen": ("files", "qwen"),
    "pg+qwen": ("pg", "qwen"),
    "qwen": ("", "qwen"),
}


def run_rtt(ctx: Any) -> Figures:
    """The prompt round trips of every daemon of :data:`RTT_DAEMONS`, interleaved."""
    procs: list[subprocess.Popen[str]] = []
    ports: dict[str, int] = {}
    try:
        for name, (journal, agent) in RTT_DAEMONS.items():
            port = free_port()
            log = ctx.tmp / f"journal-rtt-{name}-{port}.log"
            if name == "qwen":
                argv = qwen_serve_argv(ctx.cli, ctx.workspace, port)
                procs.append(start(argv, ctx.env, port, ctx.workspace, log))
            else:
                url = ctx.pg.new_database() if journal == "pg" else None
                state = ctx.tmp / f"state-journal-rtt-{name}-{time.monotonic_ns()}"
                command = ctx.agent if agent else None
                argv = daemon_argv(ctx, state, port, url, ctx.workspace, command)
                procs.append(start(argv, ctx.env, port, ROOT, log))
            ports[name] = port
        return round_trips(ports, ctx.args.journal_prompts)
    finally:
        for proc in procs:
            stop(proc)


_help: str | None = None


def daemon_help() -> str:
    """``python -m serve --help`` of this tree (once)."""
    global _help
    if _help is None:
        _help = subprocess.run(
            [sys.executable, "-m", "serve", "--help"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    return _help


def has_cluster_core() -> bool:
    """This tree's daemon forwards and takes over sessions (``serve/cluster/``)."""
    return "--advertise-url" in daemon_help() and (ROOT / "serve" / "cluster").is_dir()


def shared_flags(state: Path, shared: Path) -> list[str]:
    """``--shared-dir`` where the daemon has it; else the scripted agent's store (all the
    failover needs shared) linked into the state directory."""
    if "--shared-dir" in daemon_help():
        return ["--shared-dir", str(shared)]
    (shared / "scripted").mkdir(exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    (state / "scripted").symlink_to(shared / "scripted")
    return []


def failover_once(ctx: Any, sig: int) -> float:
    """ms from ``sig`` to owner A's process group until B answers a prompt for A's session."""
    tag = f"{sig}-{time.monotonic_ns()}"
    url = ctx.pg.new_database()
    shared = ctx.tmp / f"shared-{tag}"
    workspace = ctx.tmp / f"ws-cluster-{tag}"
    shared.mkdir()
    workspace.mkdir()
    procs: list[subprocess.Popen[str]] = []
    ports = []
    try:
        for name in ("a", "b"):
            port = free_port()
            state = ctx.tmp / f"state-{name}-{tag}"
            argv = daemon_argv(ctx, state, port, url, workspace, None)
            argv += shared_flags(state, shared)
            procs.append(start(argv, ctx.env, port, ROOT, ctx.tmp / f"failover-{name}-{tag}.log"))
            ports.append(port)
        owner, other = (f"http://127.0.0.1:{p}" for p in ports)
        with httpx.Client(base_url=owner, headers=AUTH, timeout=60) as a:
            sid = a.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
            a.post(f"/session/{sid}/prompt", json=prompt_body("before")).raise_for_status()
            journal_caught_up(a, sid)
        with httpx.Client(base_url=other, headers=AUTH, timeout=WAIT_S) as b:
            b.get("/health").raise_for_status()
            seen: list[int] = []
            t0 = time.perf_counter()
            os.killpg(procs[0].pid, sig)
            while time.perf_counter() - t0 < WAIT_S:
                try:
                    got = b.post(f"/session/{sid}/prompt", json=prompt_body("after"))
                except httpx.HTTPError:
                    got = None
                if got is not None and got.status_code == 200:
                    took = (time.perf_counter() - t0) * 1000
                    before = f"statuses {seen} (0: no answer), then" if seen else "at once"
                    print(
                        f"  failover ({signal.Signals(sig).name}): B {before} 200", file=sys.stderr
                    )
                    return took
                code = got.status_code if got is not None else 0
                if not seen or seen[-1] != code:
                    seen.append(code)
                time.sleep(RETRY_S)
        raise RuntimeError(f"B did not answer in {WAIT_S:.0f} s (statuses {seen})")
    finally:
        if sig == signal.SIGSTOP and procs:
            os.killpg(procs[0].pid, signal.SIGCONT)
        for proc in procs:
            stop(proc)


def run_failover(ctx: Any) -> Figures:
    if not has_cluster_core():
        return {}
    out = {"failover_kill_ms": failover_once(ctx, signal.SIGKILL)}
    if ctx.args.failover_frozen:
        out["failover_stop_ms"] = failover_once(ctx, signal.SIGSTOP)
    return out


def run_journal(mode: str, ctx: Any) -> Figures:
    if mode == "rtt":
        return run_rtt(ctx)
    if mode == "failover":
        return run_failover(ctx)
    return run_backend(mode, ctx)


#: (label, key, format): the ``rtt`` mode's rows, ``<key>@files`` and ``@pg``, and for
#: ``qwen --acp`` ``<key>@files+qwen``, ``@pg+qwen`` and ``@qwen`` (``qwen serve``).
RTT_ROWS: list[tuple[str, str, str]] = [
    ("prompt round trip p50, scripted agent (ms)", "rtt_p50_ms", "{:.2f}"),
    ("prompt round trip p99, scripted agent (ms)", "rtt_p99_ms", "{:.2f}"),
    ("prompt round trip p50, qwen --acp (ms)", "rtt_p50_ms", "{:.2f}"),
    ("prompt round trip p99, qwen --acp (ms)", "rtt_p99_ms", "{:.2f}"),
]
#: (label, key, format): the ``files`` and ``pg`` modes' rows (``qwen serve``: none).
ROWS: list[tuple[str, str, str]] = [
    ("load served from the journal p50 (ms)", "load_p50_ms", "{:.1f}"),
    ("flood: events/s to the end of the turn", "flood_turn_eps", "{:,.0f}"),
    ("flood: events/s journaled", "flood_journal_eps", "{:,.0f}"),
    ("flood: events shed by the journal (%)", "flood_shed_pct", "{:.1f}"),
]
#: The ``failover`` mode's rows: one figure, PostgreSQL only.
FAILOVER_ROWS: list[tuple[str, str, str]] = [
    ("failover, owner SIGKILLed: B answers (ms)", "failover_kill_ms", "{:.0f}"),
    ("failover, owner SIGSTOPped: B answers (ms)", "failover_stop_ms", "{:.0f}"),
]


def report(results: dict[tuple[str, str], list[Figures]]) -> list[list[str]]:
    """The section's table: head and rows (medians over the runs)."""

    def med(mode: str, key: str) -> float:
        values = [r[key] for r in results.get(("journal", mode), []) if key in r]
        return float(statistics.median(values)) if values else float("nan")

    def row(label: str, fmt: str, files: float, pg: float, ref: float, no_ref: str) -> list[str]:
        def shown(value: float) -> str:
            return fmt.format(value) if value == value else "-"

        def ratio(a: float, b: float) -> str:
            return f"{a / b:.2f}" if a == a and b == b and b else "-"

        ref_cell = shown(ref) if ref == ref else no_ref
        return [label, shown(files), shown(pg), ratio(pg, files), ref_cell, ratio(pg, ref)]

    nan = float("nan")
    lines = [["metric", "files", "PostgreSQL", "PG/files", "qwen serve", "PG/qwen"]]
    for n, (label, key, fmt) in enumerate(RTT_ROWS):
        agent = "+qwen" if n >= 2 else ""  # qwen serve runs qwen --acp, not the scripted agent
        files, pg = med("rtt", f"{key}@files{agent}"), med("rtt", f"{key}@pg{agent}")
        ref = med("rtt", f"{key}@qwen") if agent else nan
        lines.append(row(label, fmt, files, pg, ref, "-"))
    for label, key, fmt in ROWS:
        lines.append(row(label, fmt, med("files", key), med("pg", key), nan, "n/a"))
    for label, key, fmt in FAILOVER_ROWS:
        pg = med("failover", key)
        if pg == pg:
            lines.append([label, "n/a", fmt.format(pg), "-", "n/a", "-"])
        else:
            missing = "n/a (not run)" if has_cluster_core() else NEEDS_CORE
            lines.append([label, "n/a", missing, "-", "n/a", "-"])
    return lines
