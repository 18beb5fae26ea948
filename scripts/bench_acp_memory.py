#!/usr/bin/env python3
"""Daemon RSS with many loaded, non-reading /acp connections and one large prompt.

Starts a real daemon (scripted agent) on 127.0.0.1, makes one session over REST, then opens
``--connections`` /acp connections (each from its own 127.0.0.N address, the per-address
connection cap being 32) that ``session/load`` it and then never read their session
streams. One prompt carrying ``--mib`` MiB (an embedded resource) is sent over REST; the
daemon's VmRSS is printed before the prompt and once the turn has ended (the session's
events, the prompt's echo included, are then queued for every connection). Bounded: every
wait is guarded.

    .venv/bin/python scripts/bench_acp_memory.py --connections 64 --mib 7
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.acpfront.helpers import AcpHttp  # noqa: E402
from tests.conftest import AUTH, TOKEN  # noqa: E402  (the helpers send this token)
from tests.support.daemon import spawn_daemon  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def run(url: str, pid: int, cwd: str, connections: int, mib: int) -> None:
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=120) as rest:
        r = await rest.post("/session", json={"sessionScope": "thread"})
        sid = r.json()["sessionId"]
        clients = []
        async with trio.open_nursery() as nursery:
            for n in range(connections):
                transport = httpx.AsyncHTTPTransport(local_address=f"127.0.0.{10 + n}")
                client = httpx.AsyncClient(
                    base_url=url, headers=AUTH, timeout=120, transport=transport
                )
                clients.append(client)
                acp = AcpHttp(client, nursery)
                await acp.initialize({"protocolVersion": 1})
                async with acp.stream() as conn:
                    rid = await acp.request(
                        "session/load", {"sessionId": sid, "cwd": cwd, "mcpServers": []}
                    )
                    reply = await conn.reply(rid)
                    assert "result" in reply.message, reply
            await trio.sleep(1)
            before = rss_mib(pid)
            # The large part as an embedded resource: the session echoes it to every
            # client (user_message_chunk), the agent answers the short text only.
            big = {"uri": "file:///big.txt", "mimeType": "text/plain", "text": "x" * (mib << 20)}
            prompt = [{"type": "text", "text": "hi"}, {"type": "resource", "resource": big}]
            r = await rest.post(f"/session/{sid}/prompt", json={"prompt": prompt})
            assert r.status_code == 200, r.text[:200]
            await trio.sleep(2)
            after = rss_mib(pid)
            print(
                f"connections={connections} prompt={mib} MiB: daemon RSS {before:.0f} MiB "
                f"before, {after:.0f} MiB after (+{after - before:.0f} MiB)"
            )
            nursery.cancel_scope.cancel()
        for client in clients:
            await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--mib", type=int, default=7)
    args = parser.parse_args()
    d = spawn_daemon(
        ["--max-body-bytes", str((args.mib + 2) * 1024 * 1024)],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        trio.run(run, d.url, d.proc.pid, str(d.workspace.resolve()), args.connections, args.mib)
    finally:
        d.stop()


if __name__ == "__main__":
    main()
