#!/usr/bin/env python3
"""The files journal beside the PostgreSQL one (``--journal-url``), on this machine.

    .venv/bin/python scripts/bench_journal_pg.py [--runs 3] [--prompts 40] [--sessions 12]
        [--events 50000] [--journal-url postgresql://...]

Rows (per backend, the median over ``--runs`` runs, the backends interleaved run by run; a
fresh daemon and a fresh database per run):

* prompt round trip: ``POST /session/:id/prompt`` (the scripted agent; 200 when the turn
  ends) p50 / p95 over ``--prompts`` sequential prompts on one session, after 3 warm-ups;
* load from the journal: after a restart, ``POST /session/:id/load`` p50 over
  ``--sessions`` sessions (each answered two prompts in the first life; the load is served
  from the journal without an agent);
* durable events/s: ``--events`` events published as fast as the loop goes into one
  session's writer (in this process), then ``flush``: the events written (not those the
  sink shed when the backend fell ``max_buffer_bytes`` behind) divided by the time, and
  the share shed.

Without ``--journal-url`` a PostgreSQL server is started for the run (as the tests do,
``tests/support/postgres.py``: initdb in a temporary directory, fsync on) and stopped.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serve.events import EventLog  # noqa: E402
from serve.journal import Journal, JournalMeta  # noqa: E402
from serve.journal.pg import PgJournal  # noqa: E402
from tests.support.daemon import spawn_daemon  # noqa: E402
from tests.support.postgres import running_postgres  # noqa: E402

TOKEN = "bench-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PROMPT = {"prompt": [{"type": "text", "text": "hello there"}]}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def daemon_rows(args: list[str], prompts: int, sessions: int) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-journal-"))
    env = {"QWEN_SERVER_TOKEN": TOKEN}
    kw = {"workspace": tmp / "ws", "state_dir": tmp / "state", "env": env}
    d = spawn_daemon(args, **kw)  # type: ignore[arg-type]
    try:
        with httpx.Client(base_url=d.url, headers=AUTH, timeout=60) as c:
            sid = c.post("/session", json={}).json()["sessionId"]
            for _ in range(3):
                c.post(f"/session/{sid}/prompt", json=PROMPT).raise_for_status()
            rtts = []
            for _ in range(prompts):
                t0 = time.perf_counter()
                c.post(f"/session/{sid}/prompt", json=PROMPT).raise_for_status()
                rtts.append((time.perf_counter() - t0) * 1000)
            sids = []
            for _ in range(sessions):
                s = c.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
                for _ in range(2):
                    c.post(f"/session/{s}/prompt", json=PROMPT).raise_for_status()
                sids.append(s)
    finally:
        d.stop()
    d = spawn_daemon(args, **kw)  # type: ignore[arg-type]
    try:
        with httpx.Client(base_url=d.url, headers=AUTH, timeout=60) as c:
            loads = []
            for s in sids:
                t0 = time.perf_counter()
                c.post(f"/session/{s}/load", json={}).raise_for_status()
                loads.append((time.perf_counter() - t0) * 1000)
    finally:
        d.stop()
    return {
        "prompt p50 ms": statistics.median(rtts),
        "prompt p95 ms": pct(rtts, 0.95),
        "load p50 ms": statistics.median(loads),
    }


async def events_per_s(target: str, events: int) -> tuple[float, float]:
    journal: Journal | PgJournal = (
        PgJournal(target) if target.startswith("postgresql://") else Journal(target)
    )
    meta = JournalMeta(session_id="bench", epoch="e", workspace="/w", acp_session_id="a")
    writer = await journal.open_writer(meta, fresh=True)
    log = EventLog("bench", sink=writer.sink)
    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for i in range(events):
            log.publish("session_update", {"n": i, "text": "chunk of an agent message"})
            if i % 100 == 0:
                await trio.lowlevel.checkpoint()
        await writer.flush()
        elapsed = time.perf_counter() - t0
        written = writer.statistics()["eventsWritten"]
        await writer.aclose()
    if isinstance(journal, PgJournal):
        await journal.aclose()
    return written / elapsed, 100 * (events - written) / events


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--journal-url", default=None)
    ns = ap.parse_args()

    results: dict[str, dict[str, list[float]]] = {"files": {}, "postgresql": {}}

    def run_all(new_url: object) -> None:
        for run in range(ns.runs):
            for backend in ("files", "postgresql"):
                url = new_url() if backend == "postgresql" else None  # type: ignore[operator]
                args = ["--journal-url", url] if url else []
                rows = daemon_rows(args, ns.prompts, ns.sessions)
                target = url or tempfile.mkdtemp(prefix="bench-journal-ev-")
                rate, shed = trio.run(events_per_s, target, ns.events)
                rows["durable events/s"], rows["flood shed %"] = rate, shed
                for key, value in rows.items():
                    results[backend].setdefault(key, []).append(value)
                print(f"run {run + 1} {backend}: {rows}", file=sys.stderr)

    if ns.journal_url:
        run_all(lambda: ns.journal_url)
    else:
        with running_postgres() as server:
            run_all(server.new_database)
    keys = list(results["files"])
    print("| row | files | PostgreSQL |")
    print("|---|---:|---:|")
    for key in keys:
        f = statistics.median(results["files"][key])
        p = statistics.median(results["postgresql"][key])
        print(f"| {key} | {f:,.1f} | {p:,.1f} |")


if __name__ == "__main__":
    main()
