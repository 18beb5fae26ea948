"""``POST /daemon/drain`` in a cluster (two daemons on one PostgreSQL journal): the drained
daemon's sessions move instead of ending (serve/api/handover.py). No final event is
published, its lease is released at once, and the other daemon loads the session with its
history and its event epoch, and runs its next prompt. (On the files journal a drain moves
nothing: tests/serve/test_drain.py.)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import spawn_daemon
from tests.support.sse import collect_until, iter_events

ENV = {"QWEN_SERVER_TOKEN": TOKEN}
FINAL = ("session_closed", "session_died")


def _prompt(text: str) -> dict[str, object]:
    return {"prompt": [{"type": "text", "text": text}]}


def _lease_released(url: str, sid: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT expires_at <= now() FROM session_leases WHERE session_id = %s", (sid,)
        ).fetchone()
    return bool(row and row[0])


async def test_a_drained_daemon_hands_its_sessions_to_another(tmp_path: Path, pg_url: str) -> None:
    # One workspace and one agent store for both (the shared volume of a cluster).
    store = tmp_path / "ws" / ".agent-store"
    agent = f"{sys.executable} -m acp.agents.scripted --state-dir {store}"
    args = ["--journal-url", pg_url, "--agent", agent]
    first = spawn_daemon(args, workspace=tmp_path / "ws", state_dir=tmp_path / "a", env=ENV)
    second = spawn_daemon(args, workspace=tmp_path / "ws", state_dir=tmp_path / "b", env=ENV)
    try:
        async with (
            httpx.AsyncClient(base_url=first.url, headers=AUTH, timeout=30) as a,
            httpx.AsyncClient(base_url=second.url, headers=AUTH, timeout=30) as b,
        ):
            created = (await a.post("/session", json={})).json()
            sid = created["sessionId"]
            said = await a.post(f"/session/{sid}/prompt", json=_prompt("before the drain"))
            assert said.status_code == 200, said.text
            streamed: list[dict[str, Any]] = []

            async def watch(task_status: trio.TaskStatus[None]) -> None:
                async with a.stream(
                    "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
                ) as stream:
                    epoch = stream.headers["x-qwen-event-epoch"]
                    streamed.append({"epoch": epoch})
                    task_status.started()
                    async for event in iter_events(stream):  # until the daemon ends it
                        if "comment" not in event:
                            streamed.append(event)

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    await nursery.start(watch)
                    drained = await a.post("/daemon/drain", json={})
                    assert drained.status_code == 200, drained.text
                    body = drained.json()
                    assert body["movedSessions"] == 1 and body["sessions"] == 0
            # The stream on the drained daemon ended with no final event.
            types = [e.get("type") for e in streamed[1:]]
            assert "turn_complete" in types and not set(FINAL) & set(types)
            assert await trio.to_thread.run_sync(_lease_released, pg_url, sid)

            loaded = await b.post(f"/session/{sid}/load", json={})
            assert loaded.status_code == 200, loaded.text
            assert loaded.json()["eventEpoch"] == streamed[0]["epoch"]  # closed cleanly
            async with b.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                history = await collect_until(stream, lambda e: e["type"] == "replay_complete")
            events = [e for e in history if "id" in e]
            seen = [e["id"] for e in streamed[1:] if "id" in e]
            assert [e["id"] for e in events] == seen  # all of it, as the first daemon's client saw
            assert not {e["type"] for e in events} & set(FINAL)
            again = await b.post(f"/session/{sid}/prompt", json=_prompt("after the drain"))
            assert again.status_code == 200, again.text  # its agent found the session
    finally:
        first.stop()
        second.stop()


async def test_a_stopped_daemon_of_a_cluster_hands_its_idle_sessions_over(
    tmp_path: Path, pg_url: str
) -> None:
    """SIGTERM (a rolling update) moves the idle sessions too: no ``session_died``."""
    store = tmp_path / "ws" / ".agent-store"
    agent = f"{sys.executable} -m acp.agents.scripted --state-dir {store}"
    args = ["--journal-url", pg_url, "--agent", agent]
    first = spawn_daemon(args, workspace=tmp_path / "ws", state_dir=tmp_path / "a", env=ENV)
    try:
        async with httpx.AsyncClient(base_url=first.url, headers=AUTH, timeout=30) as a:
            sid = (await a.post("/session", json={})).json()["sessionId"]
            said = await a.post(f"/session/{sid}/prompt", json=_prompt("before the update"))
            assert said.status_code == 200, said.text
    finally:
        assert first.stop() == 0
    assert "sessions handed over: 1 (ended: 0)" in first.stderr()
    assert await trio.to_thread.run_sync(_lease_released, pg_url, sid)
    second = spawn_daemon(args, workspace=tmp_path / "ws", state_dir=tmp_path / "b", env=ENV)
    try:
        async with httpx.AsyncClient(base_url=second.url, headers=AUTH, timeout=30) as b:
            loaded = await b.post(f"/session/{sid}/load", json={})
            assert loaded.status_code == 200, loaded.text
            async with b.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                history = await collect_until(stream, lambda e: e["type"] == "replay_complete")
            types = [e["type"] for e in history if "id" in e]
            assert types[-1] == "turn_complete" and not set(FINAL) & set(types)
    finally:
        assert second.stop() == 0
