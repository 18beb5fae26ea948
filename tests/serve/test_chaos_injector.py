"""--chaos-kill-rate: the in-daemon fault injector kills agents; the crash path follows."""

from __future__ import annotations

import httpx

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import spawn_daemon
from tests.support.sse import collect_until


async def test_injected_kills_are_restarted_and_reported() -> None:
    daemon = spawn_daemon(["--chaos-kill-rate", "300"], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            async with client.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                events = await collect_until(
                    stream, lambda e: e["type"] in ("session_restarted", "session_died")
                )
            assert events[-1]["type"] in ("session_restarted", "session_died")
            assert events[-1]["data"].get("signal", events[-1]["data"].get("signalCode")) == (
                "SIGKILL"
            )
            status = (await client.get("/daemon/status")).json()
            chaos = status["runtime"]["chaos"]
            assert chaos["killsPerMinute"] == 300 and chaos["kills"] >= 1
            assert chaos["recent"][0]["sessionId"] == sid
            # The daemon itself is unharmed.
            assert (await client.get("/health")).json() == {"status": "ok"}
    finally:
        assert daemon.stop() == 0
