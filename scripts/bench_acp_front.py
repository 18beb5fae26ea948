#!/usr/bin/env python3
"""Prompt round trip on one session: REST vs ACP over HTTP+SSE vs ACP over WebSocket.

Starts a real daemon (scripted agent) on 127.0.0.1, makes one session per transport, then
runs ``--n`` short prompts back to back on each and prints the median and p90 round trip
(request sent → the turn's reply received) and the ratio to REST. Bounded: ``--n`` prompts
per transport (default 200), every wait guarded.

    .venv/bin/python scripts/bench_acp_front.py --n 200
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.acpfront.helpers import AcpHttp, Ws  # noqa: E402
from tests.conftest import AUTH, TOKEN  # noqa: E402  (the helpers send this token)
from tests.support.daemon import spawn_daemon  # noqa: E402

PROMPT = [{"type": "text", "text": "hi"}]


def _summary(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.9) - 1]


async def bench(url: str, port: int, cwd: str, n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=30) as client:
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
        rest = []
        for _ in range(n):
            start = time.perf_counter()
            r = await client.post(f"/session/{sid}/prompt", json={"prompt": PROMPT})
            assert r.status_code == 200, r.text
            rest.append(time.perf_counter() - start)
        out["rest"] = rest

        async with trio.open_nursery() as nursery:
            acp = AcpHttp(client, nursery)
            await acp.initialize({"protocolVersion": 1})
            async with acp.stream() as conn:
                sid = (await acp.new_session(cwd, conn))["sessionId"]
                async with acp.stream(sid) as sess:
                    http = []
                    for _ in range(n):
                        start = time.perf_counter()
                        rid = await acp.request(
                            "session/prompt", {"sessionId": sid, "prompt": PROMPT}
                        )
                        await sess.reply(rid)
                        http.append(time.perf_counter() - start)
                    out["acp-http"] = http
            await client.delete("/acp", headers=acp.headers())
            nursery.cancel_scope.cancel()

    ws = await Ws.connect(port, headers=AUTH)
    await ws.send(
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}
    )
    await ws.recv()
    await ws.send({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": cwd}})
    sid = (await ws.until(lambda m: m.get("id") == 2))[-1]["result"]["sessionId"]
    samples = []
    for i in range(n):
        rid = 100 + i
        start = time.perf_counter()
        await ws.send(
            {
                "jsonrpc": "2.0",
                "id": rid,
                "method": "session/prompt",
                "params": {"sessionId": sid, "prompt": PROMPT},
            }
        )
        await ws.until(lambda m, rid=rid: m.get("id") == rid and "method" not in m)
        samples.append(time.perf_counter() - start)
    out["acp-ws"] = samples
    await ws.abort()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="prompts per transport")
    args = parser.parse_args()
    d = spawn_daemon(env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        results = trio.run(bench, d.url, d.port, str(d.workspace.resolve()), args.n)
    finally:
        d.stop()
    base = statistics.median(results["rest"])
    report = {}
    for name, samples in results.items():
        median, p90 = _summary(samples)
        report[name] = {
            "median_ms": round(median * 1000, 3),
            "p90_ms": round(p90 * 1000, 3),
            "ratio_to_rest": round(median / base, 3),
        }
        print(
            f"{name:9s} median {median * 1000:7.3f} ms   p90 {p90 * 1000:7.3f} ms   "
            f"x{median / base:.2f} of REST"
        )
    print(json.dumps({"n": args.n, **report}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
