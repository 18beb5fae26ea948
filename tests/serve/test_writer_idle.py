"""--writer-idle-timeout-ms cuts a stuck SSE reader; the session keeps streaming to others."""

from __future__ import annotations

import socket
import time

import httpx
import trio

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import spawn_daemon


async def test_stuck_reader_is_cut_and_does_not_slow_the_others() -> None:
    daemon = spawn_daemon(["--writer-idle-timeout-ms", "500"], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            caps = (await client.get("/capabilities")).json()
            assert "writer_idle_timeout" in caps["features"]
            sid = (await client.post("/session", json={})).json()["sessionId"]
            # A reader that subscribes, then never reads again.
            stuck = socket.create_connection(("127.0.0.1", daemon.port))
            stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stuck.sendall(
                f"GET /session/{sid}/events HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\n"
                f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
            )
            await trio.sleep(0.3)
            assert (await client.get("/health", params={"deep": "1"})).json()[
                "connectedClients"
            ] == 1
            started = time.monotonic()
            r = await client.post(
                f"/session/{sid}/prompt",
                json={"prompt": [{"type": "text", "text": "[flood 30000]"}]},
            )
            assert r.status_code == 200 and r.json()["stopReason"] == "end_turn"
            # The flood finished promptly although one reader was stuck...
            assert time.monotonic() - started < 20
            # ...and the stuck connection was cut by the daemon.
            deadline = time.monotonic() + 10
            while (await client.get("/health", params={"deep": "1"})).json()["connectedClients"]:
                assert time.monotonic() < deadline, "stuck SSE reader was never cut"
                await trio.sleep(0.1)
            # The socket itself is not checked: when the log evicts the stuck reader before
            # TCP_USER_TIMEOUT fires, the daemon has ended the stream and the kernel keeps
            # the unread bytes of the orphaned socket (a reset or an EOF comes later or not
            # at all while the peer never reads; see the closing note of issue 16).
            stuck.close()
    finally:
        daemon.stop()
