"""A hung agent against the control plane of a real daemon: print what happened.

    .venv/bin/python scripts/repro_control_plane.py [--cancel-grace-ms N]

1. A hung agent (``[hang]``): four ``set_model`` calls it never answers, then a prompt and a
   ``DELETE``: status and seconds of each answer.
2. A hung agent's prompt, then ``POST /cancel``: seconds until its terminal event (or none
   within the wait).
3. ``DELETE`` a session whose agent hangs, then load it at once: the load's status, how many
   live sessions with that id, and whether the loaded one journals.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.daemon import spawn_daemon
from tests.support.sse import iter_events

TOKEN = "repro-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def _hung_session(client: httpx.AsyncClient) -> str:
    sid: str = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
    r = await client.post(
        f"/session/{sid}/prompt",
        json={"prompt": [{"type": "text", "text": "[hang]"}]},
        headers={"Prefer": "respond-async"},
    )
    assert r.status_code == 202, r.text
    await trio.sleep(0.5)
    return sid


async def control_behind_set_model(client: httpx.AsyncClient) -> None:
    sid = await _hung_session(client)
    t0 = time.monotonic()
    results: dict[str, tuple[int, float]] = {}

    async def call(name: str, method: str, path: str, kw: dict[str, Any]) -> None:
        r = await client.request(method, path, **kw)
        results[name] = (r.status_code, round(time.monotonic() - t0, 2))

    async with trio.open_nursery() as n:
        for i in range(4):
            n.start_soon(
                call,
                f"set_model{i}",
                "POST",
                f"/session/{sid}/model",
                {"json": {"modelId": "scripted-slow"}},
            )
        await trio.sleep(0.3)
        n.start_soon(
            call,
            "prompt",
            "POST",
            f"/session/{sid}/prompt",
            {
                "json": {"prompt": [{"type": "text", "text": "hi"}]},
                "headers": {"Prefer": "respond-async"},
            },
        )
        await trio.sleep(0.3)
        n.start_soon(call, "delete", "DELETE", f"/session/{sid}", {})
    for name, (status, secs) in sorted(results.items()):
        print(f"  {name:10s} status {status} after {secs:6.2f} s")


async def cancel_hung(client: httpx.AsyncClient, wait_s: float) -> None:
    sid = await _hung_session(client)
    t0 = time.monotonic()
    r = await client.post(f"/session/{sid}/cancel")
    print(f"  cancel     status {r.status_code} after {time.monotonic() - t0:6.2f} s")
    terminal = None
    with trio.move_on_after(wait_s):
        async with client.stream(
            "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
        ) as stream:
            async for event in iter_events(stream):
                if event["type"] in ("turn_complete", "turn_error"):
                    terminal = event
                    break
    if terminal is None:
        print(f"  no terminal event within {wait_s:g} s (prompt still running)")
    else:
        data = terminal["data"]
        what = data.get("code") or data.get("stopReason")
        print(f"  {terminal['type']} {what} after {time.monotonic() - t0:6.2f} s")
    await client.delete(f"/session/{sid}")


async def reload_while_closing(client: httpx.AsyncClient) -> None:
    sid = await _hung_session(client)
    t0 = time.monotonic()
    d = await client.delete(f"/session/{sid}")
    r = await client.post(f"/session/{sid}/load", json={})
    secs = time.monotonic() - t0
    print(f"  delete {d.status_code}, load status {r.status_code} after {secs:6.2f} s")
    await trio.sleep(0.2)
    status = (await client.get("/daemon/status", params={"detail": "full"})).json()
    same = [s for s in status.get("full", {}).get("sessions", []) if s.get("sessionId") == sid]
    print(
        f"  live sessions with that id: {len(same)}; journaling: {[('journal' in s) for s in same]}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cancel-grace-ms", type=int, default=None)
    parser.add_argument("--cancel-wait-s", type=float, default=20.0)
    args = parser.parse_args()
    extra = [] if args.cancel_grace_ms is None else ["--cancel-grace-ms", str(args.cancel_grace_ms)]
    daemon = spawn_daemon(extra, env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=120) as client:
            print("1. prompt and DELETE behind four unanswered set_model:")
            await control_behind_set_model(client)
            print("2. cancel of a hung agent's prompt:")
            await cancel_hung(client, args.cancel_wait_s)
            print("3. load while the previous incarnation is closing:")
            await reload_while_closing(client)
    finally:
        daemon.stop()


if __name__ == "__main__":
    trio.run(main)
