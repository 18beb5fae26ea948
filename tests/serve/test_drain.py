"""``POST /daemon/drain``: the pre-suspend step, against a real daemon and a hard kill.

Two sessions have turns running: one ends within the drain timeout, the other would run
for a minute. The drain answers when the first has finished and the second was cancelled,
the daemon refuses new work, and the journal is on disk: the daemon is then SIGKILLed (a
suspend that does not wait) and a new daemon on the same state directory restores the
session with its whole turn.
"""

from __future__ import annotations

import signal
from pathlib import Path

import httpx

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import spawn_daemon
from tests.support.sse import collect_until

THREAD = {"sessionScope": "thread"}
ASYNC = {**AUTH, "Prefer": "respond-async"}


def _prompt(text: str) -> dict[str, object]:
    return {"prompt": [{"type": "text", "text": text}]}


async def test_drain_then_a_hard_kill_loses_nothing(tmp_path: Path) -> None:
    dirs = {"workspace": tmp_path / "ws", "state_dir": tmp_path / "state"}
    daemon = spawn_daemon(env={"QWEN_SERVER_TOKEN": TOKEN}, **dirs)  # type: ignore[arg-type]
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=60) as client:
            short = (await client.post("/session", json=THREAD)).json()["sessionId"]
            long = (await client.post("/session", json=THREAD)).json()["sessionId"]
            r = await client.post(
                f"/session/{short}/prompt", json=_prompt("[sleep 2000] short turn"), headers=ASYNC
            )
            assert r.status_code == 202, r.text
            r = await client.post(
                f"/session/{long}/prompt", json=_prompt("[sleep 60000] long turn"), headers=ASYNC
            )
            assert r.status_code == 202, r.text
            bad = await client.post("/daemon/drain", json={"timeoutMs": -1})
            assert bad.status_code == 400 and bad.json()["code"] == "invalid_drain"
            assert (await client.get("/readyz")).status_code == 200  # a bad drain did nothing

            drained = await client.post("/daemon/drain", json={"timeoutMs": 6000})
            assert drained.status_code == 200, drained.text
            body = drained.json()
            assert body["drained"] is True and body["journalFlushed"] is True
            assert body["busyAtStart"] == 2
            assert body["sessions"] == 2 and body["movedSessions"] == 0  # files: they stay
            assert body["cancelledSessions"] == 1
            # Safe to suspend: nothing runs, nothing new is admitted.
            assert (await client.get("/readyz")).status_code == 503
            refused = await client.post("/session", json={})
            assert refused.status_code == 503 and refused.json()["code"] == "daemon_draining"
            refused = await client.post(f"/session/{short}/prompt", json=_prompt("more"))
            assert refused.status_code == 503
            # Idempotent: a second drain answers at once.
            again = await client.post("/daemon/drain", json={})
            assert again.status_code == 200 and again.json()["busyAtStart"] == 0
    finally:
        daemon.stop(signal.SIGKILL)

    daemon = spawn_daemon(env={"QWEN_SERVER_TOKEN": TOKEN}, **dirs)  # type: ignore[arg-type]
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=60) as client:
            loaded = await client.post(f"/session/{short}/load", json={})
            assert loaded.status_code == 200, loaded.text
            async with client.stream(
                "GET", f"/session/{short}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                events = await collect_until(stream, lambda e: e["type"] == "replay_complete")
            types = [e["type"] for e in events]
            assert "turn_complete" in types, types
            text = "".join(
                str(e.get("data", {}).get("update", {}).get("content", {}).get("text", ""))
                for e in events
                if e["type"] == "session_update"
            )
            assert "short turn" in text, events
    finally:
        daemon.stop()
