"""Any daemon answers any request (serve/cluster, serve/http/forward.py): two real daemons
on one PostgreSQL journal, the scripted agent, requests sent to the daemon that does not own
the session. Forwarded while the owner lives (the owner keeps its lease and serves the event
stream through the other daemon); taken over on the next request once the owner is killed
(a new lease epoch, the conversation goes on); a closed session is not revived by a request;
someone without a role on a session cannot take it over."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
import trio

from serve.http.forward import FORWARDED_BY
from tests.acpfront.helpers import Ws
from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until

TEXT = {"type": "text", "text": "hello"}


def lease(url: str, sid: str) -> tuple[str, int]:
    """(owner_id, epoch) of the session's lease (blocking)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT owner_id, epoch FROM session_leases WHERE session_id = %s", (sid,)
        ).fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


def journaled(url: str, sid: str, event_type: str) -> int:
    """How many ``event_type`` events of ``sid`` are committed (blocking)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM journal_events WHERE session_id = %s AND event_type = %s",
            (sid, event_type),
        ).fetchone()
    return int(row[0]) if row else 0


async def until_turn_of(
    client: httpx.AsyncClient, sid: str, prompt_id: str
) -> list[dict[str, Any]]:
    """The session's events from the start (``Last-Event-ID: 0``) to the ``turn_complete``
    of ``prompt_id``."""
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        return await collect_until(
            stream,
            lambda e: e.get("type") == "turn_complete" and e["data"].get("promptId") == prompt_id,
        )


def said(events: list[dict[str, Any]]) -> str:
    """The agent's message text in ``events``."""
    return "".join(
        e["data"]["update"]["content"]["text"]
        for e in events
        if e.get("type") == "session_update"
        and e["data"]["update"].get("sessionUpdate") == "agent_message_chunk"
    )


def daemon_id(d: DaemonProcess) -> str:
    return (d.state_dir / "daemon-id").read_text().strip()


@pytest.fixture
def pair(tmp_path: Path, pg_url: str) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    """Daemons A and B: one workspace, one journal database, one --shared-dir (the agents'
    places: the scripted agent's store), their own state directories."""
    ws, shared = tmp_path / "ws", tmp_path / "shared"
    ws.mkdir()
    shared.mkdir()
    started: list[DaemonProcess] = []
    for name in ("a", "b"):
        state = tmp_path / f"state-{name}"
        state.mkdir()
        started.append(
            spawn_daemon(
                ["--journal-url", pg_url, "--shared-dir", str(shared)],
                workspace=ws,
                state_dir=state,
                env={"QWEN_SERVER_TOKEN": TOKEN},
            )
        )
    try:
        yield started[0], started[1]
    finally:
        for d in started:
            d.stop()


async def prompt(client: httpx.AsyncClient, sid: str, cid: str, text: str) -> httpx.Response:
    return await client.post(
        f"/session/{sid}/prompt",
        json={"prompt": [{"type": "text", "text": text}]},
        headers={"X-Qwen-Client-Id": cid, "Prefer": "respond-async"},
    )


async def test_a_request_on_the_other_daemon_is_forwarded_to_the_owner(
    pair: tuple[DaemonProcess, DaemonProcess], pg_url: str
) -> None:
    a, b = pair
    async with (
        httpx.AsyncClient(base_url=a.url, headers=AUTH, timeout=30) as on_a,
        httpx.AsyncClient(base_url=b.url, headers=AUTH, timeout=30) as on_b,
    ):
        created = (await on_a.post("/session", json={})).json()
        sid, cid = created["sessionId"], created["clientId"]
        owner_before = await trio.to_thread.run_sync(lease, pg_url, sid)
        async with on_b.stream(
            "GET", f"/session/{sid}/events", headers={"Accept": "text/event-stream"}
        ) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            sent = await prompt(on_b, sid, cid, "[echo forwarded]")
            assert sent.status_code == 202, sent.text
            events = await collect_until(stream, lambda e: e.get("type") == "turn_complete")
        assert "forwarded" in said(events)
        # Served by A all along: B took no lease, A's epoch is unchanged.
        assert await trio.to_thread.run_sync(lease, pg_url, sid) == owner_before
        assert owner_before[0] == daemon_id(a)
        listed = (await on_b.get(f"/session/{sid}/pending-prompts")).status_code
        assert listed == 200


async def test_a_killed_owners_session_is_taken_over_on_the_next_request(
    pair: tuple[DaemonProcess, DaemonProcess], pg_url: str
) -> None:
    a, b = pair
    async with (
        httpx.AsyncClient(base_url=a.url, headers=AUTH, timeout=30) as on_a,
        httpx.AsyncClient(base_url=b.url, headers=AUTH, timeout=30) as on_b,
    ):
        created = (await on_a.post("/session", json={})).json()
        sid, cid = created["sessionId"], created["clientId"]
        first = await prompt(on_a, sid, cid, "[echo before]")
        assert first.status_code == 202, first.text
        # From the start (the turn may be over before the stream opens: a live-only stream
        # would then wait for ever).
        async with on_a.stream(
            "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
        ) as stream:
            await collect_until(stream, lambda e: e.get("type") == "turn_complete")
        _, epoch_a = await trio.to_thread.run_sync(lease, pg_url, sid)
        # Killed once its turn is committed (a crash loses at most the last 50 ms batch).
        with trio.fail_after(10):
            while not await trio.to_thread.run_sync(journaled, pg_url, sid, "turn_complete"):  # noqa: ASYNC110 (the database)
                await trio.sleep(0.02)

        os.kill(a.proc.pid, signal.SIGKILL)
        a.proc.wait(10)
        t0 = time.monotonic()
        answered = await prompt(on_b, sid, cid, "[echo after]")
        took = time.monotonic() - t0
        assert answered.status_code == 202, answered.text
        assert took < 10  # the lease's TTL is 20 s: the liveness lock told B at once
        owner, epoch_b = await trio.to_thread.run_sync(lease, pg_url, sid)
        assert owner == daemon_id(b) and epoch_b > epoch_a
        events = await until_turn_of(on_b, sid, answered.json()["promptId"])
        ids = [e["id"] for e in events if "id" in e]
        assert ids == sorted(set(ids))  # strictly increasing
        chunks = said(events)
        assert "before" in chunks and "after" in chunks  # one conversation, both turns


async def test_a_closed_session_is_not_revived_by_a_request_on_another_daemon(
    pair: tuple[DaemonProcess, DaemonProcess],
) -> None:
    a, b = pair
    async with (
        httpx.AsyncClient(base_url=a.url, headers=AUTH, timeout=30) as on_a,
        httpx.AsyncClient(base_url=b.url, headers=AUTH, timeout=30) as on_b,
    ):
        created = (await on_a.post("/session", json={})).json()
        sid, cid = created["sessionId"], created["clientId"]
        closed = await on_a.delete(f"/session/{sid}", headers={"X-Qwen-Client-Id": cid})
        assert closed.status_code == 204, closed.text
        answered = await prompt(on_b, sid, cid, "[echo zombie]")
        assert answered.status_code == 404, answered.text
        assert answered.json()["code"] == "session_not_found"
        assert f"POST /session/{sid}/load" in answered.json()["error"]  # on purpose only


async def acp_load(d: DaemonProcess, sid: str) -> dict[str, object]:
    """``session/load`` of ``sid`` over ``/acp`` (WebSocket) on ``d``: the reply."""
    ws = await Ws.connect(d.port, headers=AUTH)
    try:
        await ws.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
        await ws.until(lambda m: m.get("id") == 1)
        params = {"sessionId": sid, "cwd": str(d.workspace), "mcpServers": []}
        await ws.send({"jsonrpc": "2.0", "id": 2, "method": "session/load", "params": params})
        reply: dict[str, object] = (await ws.until(lambda m: m.get("id") == 2))[-1]
    finally:
        await ws.abort()
    return reply


async def test_acp_load_is_refused_for_a_live_owners_session_and_takes_a_dead_ones_over(
    pair: tuple[DaemonProcess, DaemonProcess], pg_url: str
) -> None:
    """The /acp front is not forwarded: on the other daemon a ``session/load`` of a session
    whose owner lives is refused (it would make two owners); once the owner is dead the same
    load takes the session over."""
    a, b = pair
    async with httpx.AsyncClient(base_url=a.url, headers=AUTH, timeout=30) as on_a:
        sid = (await on_a.post("/session", json={})).json()["sessionId"]
    refused = await acp_load(b, sid)
    error = refused.get("error")
    assert isinstance(error, dict), refused
    # /acp answers a failed open with its retryable 503 (serve/api/__init__.py, point 4);
    # the message says why.
    assert error["data"]["httpStatus"] == 503 and error["data"]["retryable"], refused
    assert "is owned by another daemon" in error["message"], refused
    assert (await trio.to_thread.run_sync(lease, pg_url, sid))[0] == daemon_id(a)

    os.kill(a.proc.pid, signal.SIGKILL)
    a.proc.wait(10)
    loaded = await acp_load(b, sid)
    assert "result" in loaded, loaded
    assert (await trio.to_thread.run_sync(lease, pg_url, sid))[0] == daemon_id(b)


async def test_a_workspace_list_is_the_clusters(
    pair: tuple[DaemonProcess, DaemonProcess],
) -> None:
    """Any daemon lists the sessions of every daemon (each once, live before persisted);
    a list another daemon forwarded is the daemon's own (no second fan-out)."""
    a, b = pair
    async with (
        httpx.AsyncClient(base_url=a.url, headers=AUTH, timeout=30) as on_a,
        httpx.AsyncClient(base_url=b.url, headers=AUTH, timeout=30) as on_b,
    ):
        made_a = (await on_a.post("/session", json={"sessionScope": "thread"})).json()
        made_b = (await on_b.post("/session", json={"sessionScope": "thread"})).json()
        both = {made_a["sessionId"], made_b["sessionId"]}
        path = "/workspace/" + quote(str(a.workspace), safe="") + "/sessions"
        for client in (on_a, on_b):
            for query in ("", "?include=persisted"):
                r = await client.get(path + query)
                assert r.status_code == 200, r.text
                entries = r.json()["sessions"]
                ids = [e["sessionId"] for e in entries]
                assert set(ids) == both and len(ids) == 2, entries
                assert all(e["activeWorkState"] != "persisted" for e in entries), entries
        own = await on_a.get(path, headers={FORWARDED_BY: "someone"})
        assert [e["sessionId"] for e in own.json()["sessions"]] == [made_a["sessionId"]]


async def test_a_vote_by_request_id_reaches_the_daemon_whose_session_asked(
    pair: tuple[DaemonProcess, DaemonProcess],
) -> None:
    """``POST /permission/:requestId`` carries no session: sent to the daemon that does not
    own the session, it is passed to the one that knows the request; an unknown id is 404."""
    a, b = pair
    allow = {"outcome": {"outcome": "selected", "optionId": "allow"}}
    async with (
        httpx.AsyncClient(base_url=a.url, headers=AUTH, timeout=30) as on_a,
        httpx.AsyncClient(base_url=b.url, headers=AUTH, timeout=30) as on_b,
    ):
        created = (await on_a.post("/session", json={})).json()
        sid, cid = created["sessionId"], created["clientId"]
        async with on_a.stream(
            "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
        ) as stream:
            sent = await prompt(on_a, sid, cid, "[write voted.txt yes]")
            assert sent.status_code == 202, sent.text
            asked = await collect_until(stream, lambda e: e.get("type") == "permission_request")
            rid = asked[-1]["data"]["requestId"]
            assert (await on_b.post("/permission/unknown-id", json=allow)).status_code == 404
            voted = await on_b.post(f"/permission/{rid}", json=allow)
            assert voted.status_code == 200, voted.text
        target = a.workspace / "voted.txt"
        with trio.fail_after(20):  # the allowed write lands
            while not (target.exists() and target.read_text() == "yes"):  # noqa: ASYNC110 (the agent's write)
                await trio.sleep(0.05)
