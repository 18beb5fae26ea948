#!/usr/bin/env python3
"""A reader that stops reading: how long until its --max-connections slot
is free for a new reader, and until its socket is gone on the daemon's side.

    .venv/bin/python scripts/bench_stuck_reader.py [--flood]

The daemon runs with ``--max-connections 1``; the stuck reader subscribes with
``?maxQueued=16`` and a 4 KiB receive buffer, then never reads. The turn is one 3 MB update
(blocked on the socket: freed by the writer idle timeout) or, with ``--flood``, 30000 small
ones (the stream is evicted while its write is blocked). Prints None for what did not
happen within 90 s.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.daemon import spawn_daemon  # noqa: E402


def main() -> int:
    flood = "--flood" in sys.argv[1:]
    daemon = spawn_daemon(["--max-connections", "1"])
    try:
        client = httpx.Client(base_url=daemon.url, timeout=60)
        sid = client.post("/session", json={}).json()["sessionId"]
        stuck = socket.create_connection(("127.0.0.1", daemon.port))
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.sendall(
            f"GET /session/{sid}/events?maxQueued=16 HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{daemon.port}\r\n\r\n".encode()
        )
        time.sleep(0.5)
        local = stuck.getsockname()[1]
        text = "[flood 30000]" if flood else "x" * 3_000_000
        client.post(f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": text}]})
        t0 = time.monotonic()
        slot: float | None = None
        gone: float | None = None
        while time.monotonic() - t0 < 90 and (slot is None or gone is None):
            if slot is None:
                with client.stream("GET", f"/session/{sid}/events") as response:
                    if response.status_code == 200:
                        slot = time.monotonic() - t0
            filt = f"( sport = :{daemon.port} and dport = :{local} )"
            out = subprocess.run(
                ["ss", "-tnH", "state", "established", filt], capture_output=True, text=True
            ).stdout
            if gone is None and not out.strip():
                gone = time.monotonic() - t0
            time.sleep(0.5)
        stuck.close()
        print(f"slot free after {slot} s; daemon-side socket gone after {gone} s")
    finally:
        daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
