#!/usr/bin/env python
"""Benchmark the durable event journal (medians; not a test).

    .venv/bin/python scripts/bench_journal.py [--rounds N] [--json] [--dir PATH]

Every figure publishes real events through an ``EventLog`` (envelope + SSE frame encoding,
~250-byte frames like streamed agent text chunks) into a ``SessionJournal`` with its
flusher task running, except where said:

* ``publish``: events/s of ``EventLog.publish`` without a sink, and with the journal's
  sink (no flusher: the hot-path cost alone), and the sink's cost per event.
* ``paced flood``: a publisher at a fixed rate (20k .. 200k events/s, 1 s each) that
  sleeps between chunks of 50, as a daemon relaying an agent does; reports the rate
  achieved, events dropped (should be 0) and fsyncs per second.
* ``unpaced flood``: 200k events published back to back (a checkpoint every 100): the
  trio thread never sleeps, the worst case for the writer thread's GIL share; reports
  durable events/s (events on disk / time until ``aclose()`` returned), drops, and how
  many 50 µs GIL hand-overs the journal made.
* ``appender``: the file layer alone (no trio, no EventLog): 5000-event batches, one
  fdatasync each; events/s and MB/s.
* ``read back``: ``Journal.load`` of a 16 MiB journal (scan, CRC check, frames
  materialised); events/s.

The journal directory is a temporary directory under ``--dir`` (default: the system's
temp dir); fsync cost depends on that file system.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from serve.events import EventLog  # noqa: E402
from serve.events.log import encode_envelope, sse_frame  # noqa: E402
from serve.journal import Journal, JournalLimits, JournalMeta  # noqa: E402
from serve.journal.store import Appender, scan  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog; streaming tokens. " * 2


def meta(sid: str) -> JournalMeta:
    return JournalMeta(session_id=sid, epoch="bench", workspace="/w", acp_session_id=sid)


def data(i: int) -> dict[str, Any]:
    return {
        "sessionId": "bench",
        "update": {"sessionUpdate": "agent_message_chunk", "content": {"text": TEXT, "i": i}},
    }


async def bench_publish(base: Path, n: int = 50_000) -> tuple[float, float]:
    log = EventLog("plain", ring_size=8000)
    t0 = time.perf_counter()
    for i in range(n):
        log.publish("session_update", data(i))
    plain = n / (time.perf_counter() - t0)
    journal = Journal(base, JournalLimits(max_buffer_bytes=1 << 30, flush_batch_bytes=1 << 30))
    writer = await journal.open_writer(meta("publish"))
    log = EventLog("publish", ring_size=8000, sink=writer.sink)
    t0 = time.perf_counter()
    for i in range(n):
        log.publish("session_update", data(i))
    sunk = n / (time.perf_counter() - t0)
    await writer.aclose()
    return plain, sunk


async def bench_paced(base: Path, rate: int, seconds: float = 1.0) -> dict[str, float]:
    journal = Journal(base)
    writer = await journal.open_writer(meta(f"paced-{rate}"))
    log = EventLog(writer.session_id, sink=writer.sink)
    total = int(rate * seconds)
    chunk = 50
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        t0 = trio.current_time()
        for k in range(0, total, chunk):
            for i in range(chunk):
                log.publish("session_update", data(k + i))
            target = t0 + (k + chunk) / rate
            if target > trio.current_time():
                await trio.sleep_until(target)
            else:
                await trio.lowlevel.checkpoint()
        elapsed = trio.current_time() - t0
        await writer.aclose()
    stats = writer.statistics()
    return {
        "achieved": total / elapsed,
        "dropped": stats["droppedEvents"],
        "fsyncs_per_s": stats["fsyncs"] / elapsed,
    }


async def bench_unpaced(base: Path, n: int = 200_000) -> dict[str, float]:
    journal = Journal(base, JournalLimits(max_session_bytes=1 << 30, segment_bytes=4 << 20))
    writer = await journal.open_writer(meta("unpaced"))
    log = EventLog(writer.session_id, sink=writer.sink)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        t0 = time.perf_counter()
        for i in range(n):
            log.publish("session_update", data(i))
            if i % 100 == 0:
                await trio.lowlevel.checkpoint()
        published = time.perf_counter() - t0
        await writer.aclose()
        elapsed = time.perf_counter() - t0
    stats = writer.statistics()
    return {
        "published_per_s": n / published,
        "durable_per_s": stats["eventsWritten"] / elapsed,
        "dropped": stats["droppedEvents"],
        "gil_naps": journal.gil_naps,
    }


def frames(n: int) -> list[tuple[int, str, bytes]]:
    return [
        (i, "session_update", sse_frame(i, "session_update", encode_envelope(i, "x", data(i))))
        for i in range(1, n + 1)
    ]


def bench_appender(base: Path, items: list[tuple[int, str, bytes]]) -> tuple[float, float]:
    directory = base / "appender"
    directory.mkdir()
    app = Appender(directory, scan(directory), max_bytes=1 << 30, segment_bytes=4 << 20)
    t0 = time.perf_counter()
    for k in range(0, len(items), 5000):
        app.append_items(items[k : k + 5000])
    elapsed = time.perf_counter() - t0
    app.close()
    return len(items) / elapsed, app.bytes_written / elapsed / 1e6


async def bench_read(base: Path, items: list[tuple[int, str, bytes]]) -> float:
    journal = Journal(base)  # default limits: 16 MiB per session
    writer = await journal.open_writer(meta("read"))
    for event_id, event_type, frame in items:
        writer.sink(event_id, event_type, frame)
        if event_id % 5000 == 0:
            await writer.flush()
    await writer.aclose()
    t0 = time.perf_counter()
    replay = journal.load("read")
    return replay.count / (time.perf_counter() - t0)


async def main(rounds: int, as_json: bool, parent: str | None) -> None:
    rates = (20_000, 50_000, 100_000, 200_000)
    plain: list[float] = []
    sunk: list[float] = []
    paced: dict[int, list[dict[str, float]]] = {r: [] for r in rates}
    unpaced: list[dict[str, float]] = []
    appender: list[tuple[float, float]] = []
    read: list[float] = []
    items = frames(100_000)
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(dir=parent) as tmp:
            base = Path(tmp)
            p, s = await bench_publish(base / "publish")
            plain.append(p)
            sunk.append(s)
            for rate in rates:
                paced[rate].append(await bench_paced(base / "paced", rate))
            unpaced.append(await bench_unpaced(base / "unpaced"))
            appender.append(bench_appender(base, items))
            read.append(await bench_read(base / "read", items))

    def med(values: list[dict[str, float]], key: str) -> float:
        return statistics.median(v[key] for v in values)

    results: dict[str, Any] = {
        "publish_plain_per_s": statistics.median(plain),
        "publish_with_sink_per_s": statistics.median(sunk),
        "sink_cost_ns": (1 / statistics.median(sunk) - 1 / statistics.median(plain)) * 1e9,
        "paced": {
            str(r): {k: med(paced[r], k) for k in ("achieved", "dropped", "fsyncs_per_s")}
            for r in rates
        },
        "unpaced": {
            k: med(unpaced, k) for k in ("published_per_s", "durable_per_s", "dropped", "gil_naps")
        },
        "appender_per_s": statistics.median(a[0] for a in appender),
        "appender_mb_per_s": statistics.median(a[1] for a in appender),
        "read_back_per_s": statistics.median(read),
    }
    if as_json:
        print(json.dumps(results, indent=2))
        return
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; medians of {rounds} rounds")
    print(f"  publish, no sink                 {results['publish_plain_per_s']:10,.0f} events/s")
    print(
        f"  publish, journal sink            {results['publish_with_sink_per_s']:10,.0f} events/s"
    )
    print(f"  sink cost                        {results['sink_cost_ns']:10,.0f} ns/event")
    for rate in rates:
        r = results["paced"][str(rate)]
        print(
            f"  paced flood {rate:>7,}/s            {r['achieved']:10,.0f} events/s  "
            f"dropped {r['dropped']:,.0f}  fsyncs {r['fsyncs_per_s']:,.0f}/s"
        )
    u = results["unpaced"]
    print(
        f"  unpaced flood (200k)             {u['durable_per_s']:10,.0f} durable events/s  "
        f"(published {u['published_per_s']:,.0f}/s, dropped {u['dropped']:,.0f}, "
        f"GIL hand-overs {u['gil_naps']:,.0f})"
    )
    print(
        f"  appender alone                   {results['appender_per_s']:10,.0f} events/s  "
        f"({results['appender_mb_per_s']:,.0f} MB/s)"
    )
    print(f"  read back (16 MiB journal)       {results['read_back_per_s']:10,.0f} events/s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--dir", default=None, help="parent of the temporary journal directory")
    args = parser.parse_args()
    trio.run(main, args.rounds, args.json, args.dir)
