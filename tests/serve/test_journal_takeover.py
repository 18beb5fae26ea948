"""A session restored after its daemon died mid-turn (serve/sessions/recovery.py), on the
files journal and on PostgreSQL: the dead daemon's turn ends with one ``turn_error {code:
"owner_lost"}``, journaled, found again by every later restore; a prompt re-sent with a
``promptId`` on record answers its first admission and never runs again; and the session's
budget (limits and spending) comes back with it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until

ASYNC = {"Prefer": "respond-async"}
ENV = {"QWEN_SERVER_TOKEN": TOKEN}


def _prompt(text: str, prompt_id: str) -> dict[str, object]:
    return {"prompt": [{"type": "text", "text": text}], "promptId": prompt_id}


def _daemon(tmp_path: Path, journal_args: list[str], *more: str) -> DaemonProcess:
    return spawn_daemon(
        [*journal_args, *more], workspace=tmp_path / "ws", state_dir=tmp_path / "state", env=ENV
    )


def _commands(tmp_path: Path, via: str) -> tuple[list[str], list[str]]:
    """The agent flags of the first life and of the next ones. ``via`` agent: the same
    scripted agent and store behind two command lines, so the second life's load goes
    through the agent (a journal made behind another command: serve/sessions/journal_load.py)."""
    if via == "journal":
        return [], []
    agent = f"{sys.executable} -m acp.agents.scripted --state-dir"
    store = tmp_path / "ws" / ".agent-store"  # where the agent may write
    return ["--agent", f"{agent} {store}"], ["--agent", f"{agent}={store}"]


async def _journaled(client: httpx.AsyncClient, sid: str, event_id: int) -> None:
    """Until the session's journal holds ``event_id`` (/daemon/status ``journal.lastId``)."""
    with trio.fail_after(20):
        while True:
            body = (await client.get("/daemon/status", params={"detail": "full"})).json()
            row = next(s for s in body["full"]["sessions"] if s["sessionId"] == sid)
            if ((row.get("journal") or {}).get("lastId") or 0) >= event_id:
                return
            await trio.sleep(0.02)


async def _kill(daemon: DaemonProcess) -> None:
    os.kill(daemon.proc.pid, signal.SIGKILL)
    await trio.to_thread.run_sync(daemon.proc.wait, 10)


async def _history(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        events = await collect_until(stream, lambda e: e["type"] == "replay_complete")
    return [e for e in events if "id" in e]


def _all_of(*wanted: tuple[str, str]) -> Any:
    """A stop condition: true once an event of each ``(type, promptId)`` was seen."""
    missing = set(wanted)

    def stop(event: dict[str, Any]) -> bool:
        missing.discard((event["type"], event.get("promptId")))
        return not missing

    return stop


def _terminals(events: list[dict[str, Any]], prompt_id: str) -> list[dict[str, Any]]:
    return [
        e
        for e in events
        if e["type"] in ("turn_complete", "turn_error") and e.get("promptId") == prompt_id
    ]


@pytest.mark.parametrize("via", ["journal", "agent"])
async def test_a_turn_cut_by_a_crash_ends_once_and_its_prompt_never_runs_again(
    tmp_path: Path, journal_args: list[str], via: str
) -> None:
    """``via``: the load is answered from the journal (lazily), or through the agent."""
    first_command, next_command = _commands(tmp_path, via)
    daemon = _daemon(tmp_path, journal_args, *first_command)
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            done = await client.post(f"/session/{sid}/prompt", json=_prompt("first", "p-done"))
            assert done.status_code == 200 and done.json()["stopReason"] == "end_turn"
            cut = await client.post(
                f"/session/{sid}/prompt", json=_prompt("[sleep 60000] cut", "p-cut"), headers=ASYNC
            )
            assert cut.status_code == 202, cut.text
            first_admission = cut.json()
            queued = await client.post(
                f"/session/{sid}/prompt", json=_prompt("waits", "p-queued"), headers=ASYNC
            )
            assert queued.status_code == 202, queued.text
            async with client.stream(
                "GET",
                f"/session/{sid}/events",
                headers={"Last-Event-ID": str(first_admission["lastEventId"])},
            ) as stream:
                # The turn began (its echo) and the second prompt waits behind it.
                seen = await collect_until(
                    stream,
                    _all_of(("session_update", "p-cut"), ("pending_prompt_added", "p-queued")),
                )
            await _journaled(client, sid, seen[-1]["id"])
            await _kill(daemon)  # mid-turn: no terminal for p-cut or p-queued on record
    finally:
        daemon.stop()

    again = _daemon(tmp_path, journal_args, *next_command)
    try:
        async with httpx.AsyncClient(base_url=again.url, headers=AUTH, timeout=30) as client:
            loaded = await client.post(f"/session/{sid}/load", json={})
            assert loaded.status_code == 200, loaded.text
            epoch = loaded.json()["eventEpoch"]
            assert epoch != first_admission["eventEpoch"]  # not closed cleanly
            events = await _history(client, sid)
            ids = [e["id"] for e in events]
            assert ids == list(range(1, ids[-1] + 1))
            assert loaded.json()["lastEventId"] == ids[-1]
            # The dead daemon's turns end, first the one that ran, then the one that waited,
            # each with one terminal that says why; they are the log's last events.
            tail = events[-3:]
            assert [(e["type"], e.get("promptId")) for e in tail] == [
                ("turn_error", "p-cut"),
                ("turn_error", "p-queued"),
                ("pending_prompt_completed", "p-queued"),
            ]
            for terminal in tail[:2]:
                data = terminal["data"]
                assert data["code"] == "owner_lost" and data["errorKind"] == "owner_lost"
                assert "daemon running this turn stopped" in data["message"]
                assert data["sessionId"] == sid and data["promptId"] == terminal["promptId"]
            assert tail[2]["data"]["state"] == "removed"  # it never ran
            assert len(_terminals(events, "p-cut")) == 1
            assert len(_terminals(events, "p-done")) == 1

            # Re-sent prompt ids answer their first admission and run nothing.
            blocking = await client.post(
                f"/session/{sid}/prompt", json=_prompt("[sleep 60000] cut", "p-cut")
            )
            assert blocking.status_code == 503, blocking.text  # retryable: as a new prompt
            assert blocking.json()["code"] == "owner_lost"
            assert blocking.json()["promptId"] == "p-cut"
            admitted = await client.post(
                f"/session/{sid}/prompt", json=_prompt("[sleep 60000] cut", "p-cut"), headers=ASYNC
            )
            assert admitted.status_code == 202, admitted.text
            assert admitted.json() == {
                "promptId": "p-cut",
                "lastEventId": first_admission["lastEventId"],
                "eventEpoch": epoch,
            }
            replay = await client.post(f"/session/{sid}/prompt", json=_prompt("first", "p-done"))
            assert replay.status_code == 200, replay.text
            assert replay.json() == {"stopReason": "end_turn", "promptId": "p-done"}
            status = (await client.get("/daemon/status", params={"detail": "full"})).json()
            row = next(s for s in status["full"]["sessions"] if s["sessionId"] == sid)
            if via == "journal":
                assert row["agentPid"] is None  # no agent was bound to run anything
            assert (await _history(client, sid))[-1]["id"] == ids[-1]  # nothing published

            # The session goes on: a new prompt runs, its ids continue.
            after = await client.post(f"/session/{sid}/prompt", json=_prompt("after", "p-after"))
            assert after.status_code == 200, after.text
            now = await _history(client, sid)
            assert now[len(events)]["id"] == ids[-1] + 1
            assert _terminals(now, "p-after")[0]["type"] == "turn_complete"
            await _journaled(client, sid, now[-1]["id"])
            await _kill(again)  # not clean again: the restore reads the terminals on record
    finally:
        again.stop()

    third = _daemon(tmp_path, journal_args, *next_command)
    try:
        async with httpx.AsyncClient(base_url=third.url, headers=AUTH, timeout=30) as client:
            loaded = await client.post(f"/session/{sid}/resume", json={})
            assert loaded.status_code == 200, loaded.text
            events = await _history(client, sid)
            assert len(_terminals(events, "p-cut")) == 1  # published once
            assert len(_terminals(events, "p-queued")) == 1
            assert "owner_lost" not in str(_terminals(events, "p-after"))
            assert events[-1]["id"] == now[-1]["id"]  # nothing new on record
            again_cut = await client.post(
                f"/session/{sid}/prompt", json=_prompt("[sleep 60000] cut", "p-cut"), headers=ASYNC
            )
            assert again_cut.json()["lastEventId"] == first_admission["lastEventId"]
    finally:
        assert third.stop() == 0


def _saved_budget(tmp_path: Path, journal_args: list[str], sid: str) -> dict[str, Any] | None:
    """The budget the session keeps in its journal meta (``session.budget``), as stored."""
    if journal_args:
        with psycopg.connect(journal_args[1]) as conn:
            row = conn.execute(
                "SELECT meta -> 'attrs' ->> 'session.budget' FROM journal_sessions"
                " WHERE session_id = %s",
                (sid,),
            ).fetchone()
        raw = row[0] if row else None
    else:
        meta = tmp_path / "state" / "journal" / sid / "meta.json"
        raw = json.loads(meta.read_text())["meta"]["attrs"].get("session.budget")
    return json.loads(raw) if raw else None


async def test_a_spent_budget_stays_spent_after_a_crash_and_a_restore(
    tmp_path: Path, journal_args: list[str]
) -> None:
    daemon = _daemon(tmp_path, journal_args)
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            raised = await client.patch(f"/session/{sid}/budget", json={"maxTokens": 1000})
            assert raised.status_code == 200, raised.text
            spent = await client.post(f"/session/{sid}/prompt", json=_prompt("[usage 85] hi", "a"))
            assert spent.status_code == 200, spent.text
            before = (await client.get(f"/session/{sid}/budget")).json()
            assert before["usage"]["totalTokens"] == 90  # 3 + 85 in, "echo: hi" out
            lowered = await client.patch(f"/session/{sid}/budget", json={"maxTokens": 90})
            assert lowered.json()["exhausted"] == "tokens"
            refused = await client.post(f"/session/{sid}/prompt", json=_prompt("more", "b"))
            assert refused.status_code == 402 and refused.json()["code"] == "budget_exhausted"
            with trio.fail_after(20):  # until the meta write landed (off the turn's path)
                while True:
                    saved = await trio.to_thread.run_sync(
                        _saved_budget, tmp_path, journal_args, sid
                    )
                    if saved is not None and (saved.get("limits") or {}).get("max_tokens") == 90:
                        break
                    await trio.sleep(0.02)
            assert saved["tokens"] == 90
            await _kill(daemon)
    finally:
        daemon.stop()

    # The restoring daemon's default is far larger: the session's own limit wins, and what
    # it spent is still spent.
    again = _daemon(tmp_path, journal_args, "--session-token-budget", "100000")
    try:
        async with httpx.AsyncClient(base_url=again.url, headers=AUTH, timeout=30) as client:
            loaded = await client.post(f"/session/{sid}/load", json={})
            assert loaded.status_code == 200, loaded.text
            after = (await client.get(f"/session/{sid}/budget")).json()
            assert after["usage"] == {**before["usage"], "inTurnEstimate": 0}
            assert after["budget"]["maxTokens"] == 90 and after["exhausted"] == "tokens"
            refused = await client.post(f"/session/{sid}/prompt", json=_prompt("more", "c"))
            assert refused.status_code == 402 and refused.json()["code"] == "budget_exhausted"
            raised = await client.patch(f"/session/{sid}/budget", json={"maxTokens": 1000})
            assert raised.json()["exhausted"] is None
            runs = await client.post(f"/session/{sid}/prompt", json=_prompt("[usage 10] go", "d"))
            assert runs.status_code == 200, runs.text
            total = (await client.get(f"/session/{sid}/budget")).json()["usage"]["totalTokens"]
            assert total > 90 + 10  # counted on from what was spent
    finally:
        assert again.stop() == 0


def _received(methods_log: Path, method: str) -> bool:
    """Whether the scripted agent logged a request of ``method`` (ACP_SCRIPTED_METHODS_LOG)."""
    return methods_log.exists() and f'"{method}"'.encode() in methods_log.read_bytes()


def _journaled_frames(url: str, sid: str) -> list[bytes]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT frame FROM journal_events WHERE session_id = %s ORDER BY event_id", (sid,)
        ).fetchall()
    return [bytes(row[0]) for row in rows]


async def test_in_a_cluster_the_agent_gets_a_turn_only_once_its_start_is_on_record(
    tmp_path: Path, pg_url: str
) -> None:
    """A daemon frozen the moment its agent received a prompt has already committed the
    turn's first event: whoever restores the session knows that promptId."""
    methods_log = tmp_path / "agent-log" / "methods.jsonl"
    methods_log.parent.mkdir()
    daemon = spawn_daemon(
        ["--journal-url", pg_url, "--agent-allow-write", str(methods_log.parent)],
        workspace=tmp_path / "ws",
        state_dir=tmp_path / "state",
        env={**ENV, "ACP_SCRIPTED_METHODS_LOG": str(methods_log)},
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            started = await client.post(
                f"/session/{sid}/prompt",
                json=_prompt("[sleep 60000] started", "p-started"),
                headers=ASYNC,
            )
            assert started.status_code == 202, started.text
            with trio.fail_after(20):
                while not _received(methods_log, "session/prompt"):  # noqa: ASYNC110 (another process)
                    await trio.sleep(0.002)
            os.kill(daemon.proc.pid, signal.SIGSTOP)  # nothing more is written from here
            frames = await trio.to_thread.run_sync(_journaled_frames, pg_url, sid)
            assert any(b'"promptId":"p-started"' in frame for frame in frames)
    finally:
        os.kill(daemon.proc.pid, signal.SIGKILL)
        daemon.proc.wait(10)
