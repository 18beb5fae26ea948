#!/usr/bin/env python
"""Benchmark the ACP layer against the scripted agent (medians; not a test).

    .venv/bin/python scripts/bench_acp.py [--rounds N] [--json]

Measures, each as the median of several runs:

* ``spawn+initialize``: start ``python -m acp.agents.scripted`` and finish ``initialize``.
* ``raw pipe echo``: one ~100-byte line to a Python child that echoes lines back, over trio
  pipes, no JSON: the floor for any round trip through a child's stdio.
* ``request round trip``: ``AgentConnection.request("_scripted/ping")`` (client encode, writer
  task, agent decode + dispatch + encode, reader decode, pending-table resolution).
* ``trivial prompt``: ``session/prompt`` "hi": one ``agent_message_chunk`` + the response.
* ``flood 10000 end to end``: ``[flood 10000]``; updates/s delivered to the handler (bounded
  by whichever of agent and client is slower; they run on separate cores).
* ``client decode``: 10000 pre-encoded ``session/update`` lines piped by ``cat`` into an
  AgentConnection; updates/s from first to last delivery: the client side alone.

Targets: client decode >= 50k updates/s; request round trip adds < 0.2 ms over the
raw pipe echo.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import msgspec
import trio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from acp import AgentConnection, BaseClientHandler  # noqa: E402
from acp.jsonrpc import encode_notification  # noqa: E402
from acp.schema import AgentMessageChunk, SessionNotification, TextContent  # noqa: E402

ECHO_CHILD = (
    "import sys\n"
    "out = sys.stdout.buffer\n"
    "for line in sys.stdin.buffer:\n"
    "    out.write(line)\n"
    "    out.flush()\n"
)


class Counter(BaseClientHandler):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self.target = 0
        self.done = trio.Event()

    def on_session_update(self, session_id: str, kind: str, update: msgspec.Raw) -> None:
        now = time.perf_counter()
        if self.count == 0:
            self.first = now
        self.count += 1
        self.last = now
        if self.target and self.count >= self.target:
            self.done.set()


def scripted_argv(state_dir: str) -> list[str]:
    return [sys.executable, "-m", "acp.agents.scripted", "--state-dir", state_dir]


async def bench_spawn(state: str, runs: int) -> list[float]:
    times = []
    async with trio.open_nursery() as nursery:
        for _ in range(runs):
            t0 = time.perf_counter()
            conn = await AgentConnection.spawn(nursery, scripted_argv(state), cwd=state)
            await conn.initialize()
            times.append(time.perf_counter() - t0)
            await conn.aclose()
    return times


async def bench_raw_echo(n: int) -> list[float]:
    line = (
        b'{"jsonrpc":"2.0","id":1,"method":"_scripted/ping","params":{"x":"' + b"y" * 40 + b'"}}\n'
    )
    times = []
    async with trio.open_nursery() as nursery:
        proc = await nursery.start(
            partial(
                trio.run_process,
                [sys.executable, "-c", ECHO_CHILD],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                check=False,
            )
        )
        buf = b""
        for _ in range(n):
            t0 = time.perf_counter()
            await proc.stdin.send_all(line)
            while b"\n" not in buf:
                buf += await proc.stdout.receive_some(65536)
            buf = buf.split(b"\n", 1)[1]
            times.append(time.perf_counter() - t0)
        await proc.stdin.aclose()
    return times


async def bench_requests(state: str, n: int) -> tuple[list[float], list[float]]:
    pings: list[float] = []
    prompts: list[float] = []
    async with trio.open_nursery() as nursery:
        conn = await AgentConnection.spawn(nursery, scripted_argv(state), cwd=state)
        await conn.initialize()
        sid = (await conn.new_session(state)).session_id
        params = {"x": "y" * 40}
        for _ in range(n):
            t0 = time.perf_counter()
            await conn.request("_scripted/ping", params)
            pings.append(time.perf_counter() - t0)
        prompt = [{"type": "text", "text": "hi"}]
        for _ in range(max(50, n // 10)):
            t0 = time.perf_counter()
            await conn.prompt(sid, prompt)
            prompts.append(time.perf_counter() - t0)
        await conn.aclose()
    return pings, prompts


async def bench_flood(state: str, n: int, runs: int) -> list[float]:
    rates = []
    async with trio.open_nursery() as nursery:
        handler = Counter()
        conn = await AgentConnection.spawn(
            nursery, scripted_argv(state), cwd=state, handler=handler
        )
        await conn.initialize()
        sid = (await conn.new_session(state)).session_id
        for _ in range(runs):
            handler.count = 0
            t0 = time.perf_counter()
            await conn.prompt(sid, [{"type": "text", "text": f"[flood {n}]"}])
            elapsed = time.perf_counter() - t0
            assert handler.count == n, handler.count
            rates.append(n / elapsed)
        await conn.aclose()
    return rates


def write_flood_file(path: str, n: int) -> None:
    with open(path, "wb") as f:
        for i in range(n):
            note = SessionNotification(
                session_id="sess_bench",
                update=AgentMessageChunk(content=TextContent(text=f"{i} chunk of text")),
            )
            f.write(encode_notification("session/update", note))


async def bench_decode(tmp: str, n: int, runs: int) -> list[float]:
    path = os.path.join(tmp, "flood.jsonl")
    await trio.to_thread.run_sync(write_flood_file, path, n)
    rates = []
    for _ in range(runs):
        handler = Counter()
        handler.target = n
        async with trio.open_nursery() as nursery:
            conn = await AgentConnection.spawn(nursery, ["cat", path], cwd=tmp, handler=handler)
            with trio.fail_after(60):
                await handler.done.wait()
            await conn.aclose()
        rates.append((n - 1) / (handler.last - handler.first))
    return rates


def ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


async def main(rounds: int, as_json: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state = os.path.join(tmp, "state")
        os.makedirs(state)
        spawn = await bench_spawn(state, 10)
        raw = await bench_raw_echo(rounds)
        pings, prompts = await bench_requests(state, rounds)
        flood = await bench_flood(state, 10_000, 5)
        decode = await bench_decode(tmp, 10_000, 5)
    results = {
        "spawn_initialize_ms": ms(spawn),
        "raw_pipe_echo_ms": ms(raw),
        "request_round_trip_ms": ms(pings),
        "request_overhead_over_raw_ms": ms(pings) - ms(raw),
        "trivial_prompt_round_trip_ms": ms(prompts),
        "flood_10000_end_to_end_updates_per_s": statistics.median(flood),
        "client_decode_updates_per_s": statistics.median(decode),
    }
    if as_json:
        print(json.dumps(results, indent=2))
        return
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; medians")
    print(f"  spawn + initialize (scripted)      {results['spawn_initialize_ms']:8.1f} ms")
    print(f"  raw pipe echo round trip           {results['raw_pipe_echo_ms'] * 1000:8.1f} us")
    print(f"  request round trip (_scripted/ping){results['request_round_trip_ms'] * 1000:8.1f} us")
    print(
        f"    overhead over raw pipe echo      "
        f"{results['request_overhead_over_raw_ms'] * 1000:8.1f} us  (target < 200 us)"
    )
    prompt_us = results["trivial_prompt_round_trip_ms"] * 1000
    print(f"  trivial prompt round trip          {prompt_us:8.1f} us")
    print(
        f"  flood 10000, end to end            "
        f"{results['flood_10000_end_to_end_updates_per_s']:8.0f} updates/s"
    )
    print(
        f"  client decode (cat -> handler)     "
        f"{results['client_decode_updates_per_s']:8.0f} updates/s  (target >= 50000)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000, help="round trips per measurement")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    trio.run(main, args.rounds, args.json)
