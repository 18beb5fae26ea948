"""A daemon on the PostgreSQL journal (``--journal-url``) SIGKILLed mid-stream: after the
restart the session loads from the database with a gap-free run of ids, a new epoch (the
crash may have lost ids a client saw), and goes on. The files journal's equivalent is
tests/serve/test_journal_restart.py (a torn tail)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import psycopg
import trio

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import spawn_daemon
from tests.support.sse import collect_until


def committed(url: str, sid: str) -> int:
    """The session's events committed so far (blocking)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM journal_events WHERE session_id = %s", (sid,)
        ).fetchone()
    return int(row[0]) if row else 0


async def test_sigkill_mid_stream_then_restart_loads_a_gap_free_prefix(
    tmp_path: Path, pg_url: str
) -> None:
    args = ["--journal-url", pg_url]
    kw = {"workspace": tmp_path / "ws", "state_dir": tmp_path / "state"}
    env = {"QWEN_SERVER_TOKEN": TOKEN}
    daemon = spawn_daemon(args, env=env, **kw)  # type: ignore[arg-type]
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            started = await client.post(
                f"/session/{sid}/prompt",
                json={"prompt": [{"type": "text", "text": "[flood 200000]"}]},
                headers={"Prefer": "respond-async"},
            )
            assert started.status_code == 202, started.text
            epoch = started.json()["eventEpoch"]
            with trio.fail_after(30):  # mid-stream: batches committed, the turn far from done
                while await trio.to_thread.run_sync(committed, pg_url, sid) < 2000:  # noqa: ASYNC110 (another process)
                    await trio.sleep(0.02)
            os.kill(daemon.proc.pid, signal.SIGKILL)
            daemon.proc.wait(10)
    finally:
        daemon.stop()

    with psycopg.connect(pg_url) as conn:
        row = conn.execute(
            "SELECT min(event_id), max(event_id), count(*) FROM journal_events"
            " WHERE session_id = %s",
            (sid,),
        ).fetchone()
    assert row is not None
    first, last, count = row
    assert first == 1 and count == last  # a gap-free prefix of the ids
    assert last >= 2000

    again = spawn_daemon(args, env=env, **kw)  # type: ignore[arg-type]
    try:
        async with httpx.AsyncClient(base_url=again.url, headers=AUTH, timeout=30) as client:
            loaded = await client.post(f"/session/{sid}/load", json={})
            assert loaded.status_code == 200, loaded.text
            body = loaded.json()
            assert body["eventEpoch"] != epoch  # not closed cleanly: a new epoch
            async with client.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                replayed = await collect_until(stream, lambda e: e["type"] == "replay_complete")
            ids = [e["id"] for e in replayed if "id" in e]
            assert ids == list(range(ids[0], ids[-1] + 1)) and ids[-1] == body["lastEventId"]
            assert ids[-1] >= last
            answered = await client.post(
                f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "after"}]}
            )
            assert answered.status_code == 200, answered.text
            async with client.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": str(ids[-1])}
            ) as stream:
                turn = await collect_until(stream, lambda e: e["type"] == "turn_complete")
            assert turn[0]["id"] == ids[-1] + 1
    finally:
        assert again.stop() == 0
