"""Events survive a daemon restart: load the session, reconnect with Last-Event-ID."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import psycopg

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import spawn_daemon
from tests.support.sse import collect_until


async def _first_life(
    tmp_path: Path, args: list[str] | None = None
) -> tuple[str, str, list[dict[str, Any]]]:
    daemon = spawn_daemon(
        args or [],
        workspace=tmp_path / "ws",
        state_dir=tmp_path / "state",
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            for word in ("one", "two [think t] [plan a|b]", "three"):
                r = await client.post(
                    f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": word}]}
                )
                assert r.status_code == 200
            async with client.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                epoch = stream.headers["x-qwen-event-epoch"]
                events = await collect_until(stream, lambda e: e["type"] == "replay_complete")
    finally:
        assert daemon.stop() == 0
    return sid, epoch, [e for e in events if "id" in e]


async def test_client_gets_exactly_the_missed_events_after_a_daemon_restart(
    tmp_path: Path, journal_args: list[str]
) -> None:
    """On the files journal and on PostgreSQL (``--journal-url``)."""
    sid, epoch, before = await _first_life(tmp_path, journal_args)
    seen_up_to = before[3]["id"]  # the client had read only the first four events
    daemon = spawn_daemon(
        journal_args,
        workspace=tmp_path / "ws",
        state_dir=tmp_path / "state",
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            loaded = await client.post(f"/session/{sid}/load", json={})
            assert loaded.status_code == 200, loaded.text
            body = loaded.json()
            assert body["sessionId"] == sid and body["eventEpoch"] == epoch
            assert body["lastEventId"] >= before[-1]["id"]
            async with client.stream(
                "GET",
                f"/session/{sid}/events",
                headers={"Last-Event-ID": str(seen_up_to), "X-Qwen-Event-Epoch": epoch},
            ) as stream:
                replayed = await collect_until(stream, lambda e: e["type"] == "replay_complete")
            assert "state_resync_required" not in [e["type"] for e in replayed]
            missed = [e for e in replayed if "id" in e]
            # Same ids, same content, nothing before the cursor, nothing twice.
            assert missed[: len(before) - 4] == before[4:]
            # Then the shutdown marker of the first life (journaled too; on PostgreSQL, a
            # cluster, the stopping daemon handed the idle session over: no marker), and no
            # replay of the agent's own history on top of it.
            tail_types = [e["type"] for e in missed[len(before) - 4 :]]
            assert tail_types == ([] if journal_args else ["session_died"])
            # The session works and ids continue.
            r = await client.post(
                f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "four"}]}
            )
            assert r.status_code == 200
            async with client.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": str(missed[-1]["id"])}
            ) as stream:
                fresh = await collect_until(stream, lambda e: e["type"] == "turn_complete")
            assert fresh[0]["id"] == missed[-1]["id"] + 1
    finally:
        daemon.stop()
    if journal_args:  # the events and the lease are in the database, not in files
        assert not (tmp_path / "state" / "journal").exists()
        with psycopg.connect(journal_args[1]) as conn:
            row = conn.execute(
                "SELECT min(event_id), max(event_id), count(*) FROM journal_events"
                " WHERE session_id = %s",
                (sid,),
            ).fetchone()
            assert row is not None and row[0] == 1 and row[1] >= fresh[-1]["id"]
            assert row[2] == row[1]  # gap-free
            leases = conn.execute("SELECT epoch, owner_address FROM session_leases").fetchall()
            assert len(leases) == 1 and leases[0][0] >= 2  # two lives: two acquisitions
            assert leases[0][1] == daemon.url  # how to reach the owner


async def test_a_torn_journal_tail_is_cut_and_the_epoch_changes(tmp_path: Path) -> None:
    sid, epoch, before = await _first_life(tmp_path)
    segments = sorted((tmp_path / "state" / "journal").rglob("*.seg"))
    assert segments
    last = segments[-1]
    last.write_bytes(last.read_bytes()[:-7])  # tear the last record
    daemon = spawn_daemon(
        workspace=tmp_path / "ws", state_dir=tmp_path / "state", env={"QWEN_SERVER_TOKEN": TOKEN}
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            loaded = await client.post(f"/session/{sid}/load", json={})
            assert loaded.status_code == 200, loaded.text
            assert loaded.json()["eventEpoch"] != epoch  # not clean: ids may have diverged
            async with client.stream(
                "GET",
                f"/session/{sid}/events",
                headers={"Last-Event-ID": "2", "X-Qwen-Event-Epoch": epoch},
            ) as stream:
                replayed = await collect_until(stream, lambda e: e["type"] == "replay_complete")
            assert replayed[0]["type"] == "state_resync_required"
            assert replayed[0]["data"]["reason"] == "epoch_reset"
            ids = [e["id"] for e in replayed if "id" in e]
            assert ids == list(range(1, len(ids) + 1))
            assert ids[-1] == before[-1]["id"]  # the torn record (session_died) was cut
    finally:
        daemon.stop()
