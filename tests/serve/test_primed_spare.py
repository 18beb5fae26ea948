"""A spare's primed session (serve/agents/primed.py): a child spawned ahead of need opens
its first ``session/new`` right after ``initialize``, and the next create that would send
the same request adopts it instead of opening another.

Real daemon, real scripted-agent children; the scripted agent's store (one file per
session it opened, in ``<state dir>/scripted``) shows which sessions the agent opened.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from serve.agents.primed import PrimedSession
from tests.conftest import AUTH, TOKEN
from tests.serve.test_agent_pool import pool_until
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until

MCP_SERVER = Path(__file__).resolve().parents[1] / "support" / "mcp_server.py"
PACKING_AGENT = Path(__file__).resolve().parents[1] / "support" / "packing_agent.py"
ISOLATION = ["--sessions-per-agent", "1", "--warm-agents", "1", "--warm-agents-max", "1"]


def opened(store: Path) -> set[str]:
    """The sessions the scripted agents opened (their store's files)."""
    folder = store / "sessions"
    return {p.stem for p in folder.glob("*.json")} if folder.is_dir() else set()


def held(store: Path, session_id: str) -> bool:
    """Does a live agent process still serve ``session_id`` (its shared lease lock)?"""
    fd = os.open(store / "sessions" / f"{session_id}.lease", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@pytest.fixture
def primed_daemon() -> Iterator[DaemonProcess]:
    d = spawn_daemon(ISOLATION, env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        yield d
    finally:
        d.stop()


def primed_warm(pool: dict[str, Any]) -> bool:
    return any(c["state"] == "warm" and c["primed"] for c in pool["children"])


async def test_a_create_adopts_the_spares_primed_session(primed_daemon: DaemonProcess) -> None:
    store = primed_daemon.state_dir / "scripted"
    async with httpx.AsyncClient(base_url=primed_daemon.url, headers=AUTH, timeout=30) as client:
        await pool_until(client, primed_warm)
        (prime,) = opened(store)  # the spare opened one session, ahead of any create
        created = await client.post("/session", json={"sessionScope": "thread"})
        assert created.status_code == 200, created.text
        sid = created.json()["sessionId"]
        assert sid == prime
        # The create sent no session/new of its own: still the one session.
        assert opened(store) == {prime}
        # What the agent said about the session before anyone held it reaches its clients.
        async with client.stream(
            "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
        ) as stream:
            with trio.fail_after(20):
                events = await collect_until(stream, lambda e: e["type"] == "replay_complete")
        updates = [e["data"]["update"] for e in events if e["type"] == "session_update"]
        (commands,) = [u for u in updates if u["sessionUpdate"] == "available_commands_update"]
        names = [c["name"] for c in commands["availableCommands"]]
        assert "echo" in names
        # And the session works: a prompt runs to its end on the adopted session.
        sent = await client.post(
            f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "hi"}]}
        )
        assert sent.status_code == 200, sent.text
        async with client.stream(
            "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
        ) as stream:
            with trio.fail_after(20):
                done = await collect_until(
                    stream, lambda e: e["type"] in ("turn_complete", "turn_error")
                )
        assert done[-1]["type"] == "turn_complete"
        # The refill behind it is primed again for the next create.
        await pool_until(client, primed_warm)
        assert len(opened(store)) == 2


async def test_a_create_the_prime_does_not_fit_opens_its_own_session(tmp_path: Path) -> None:
    """A session that wants MCP servers cannot use a prime opened without them: it opens its
    own, and the prime is closed (the scripted agent can close sessions)."""
    ws = tmp_path / "ws"
    (ws / ".qwen").mkdir(parents=True)
    mcp = str(MCP_SERVER)
    servers = {"tools": {"command": sys.executable, "args": [mcp, "--name", "tools"]}}
    (ws / ".qwen" / "settings.json").write_text(json.dumps({"mcpServers": servers}))
    d = spawn_daemon(ISOLATION, workspace=ws, env={"QWEN_SERVER_TOKEN": TOKEN})
    store = d.state_dir / "scripted"
    try:
        async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30) as client:
            await pool_until(client, primed_warm)
            (prime,) = opened(store)
            created = await client.post("/session", json={"sessionScope": "thread"})
            assert created.status_code == 200, created.text
            sid = created.json()["sessionId"]
            assert sid != prime
            assert {prime, sid} <= opened(store)
            # The prime was closed at the agent (it let go of it), the session's is held.
            assert not held(store, prime)
            assert held(store, sid)
            sent = await client.post(
                f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "hi"}]}
            )
            assert sent.status_code == 200, sent.text
            assert sent.json()["stopReason"] == "end_turn"
    finally:
        d.stop()


def test_a_prime_fits_only_the_request_it_stands_for() -> None:
    from acp.schema import SessionSetup

    primed = PrimedSession("/ws", SessionSetup(session_id="s"))
    assert primed.fits("/ws", [], ())
    assert not primed.fits("/other", [], ())
    assert not primed.fits("/ws", [{"name": "tools"}], ())
    assert not primed.fits("/ws", [], ("/extra",))


def primed_shared(pool: dict[str, Any]) -> bool:
    return any(c["primed"] and c["sessions"] for c in pool["children"])


async def test_packed_creates_each_adopt_a_prime_the_pool_opened_ahead() -> None:
    """``--sessions-per-agent 4``: the create that adopts a packed child's prime makes the
    pool open the next one, so every create while the child has room adopts a session the
    agent opened before the create was sent; a full child keeps no prime."""
    d = spawn_daemon(["--sessions-per-agent", "4"], env={"QWEN_SERVER_TOKEN": TOKEN})
    store = d.state_dir / "scripted"
    try:
        async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30) as client:
            await pool_until(client, primed_warm)
            for n in range(4):
                before = opened(store)
                created = await client.post("/session", json={"sessionScope": "thread"})
                assert created.status_code == 200, created.text
                sid = created.json()["sessionId"]
                assert sid in before, (n, sid, before)  # opened ahead, adopted
                if n < 3:  # room left: the next prime is opened
                    await pool_until(client, primed_shared)
            # Full: no prime waits (the last adoption opened none), one child, 4 sessions.
            pool = (await client.get("/daemon/status")).json()["runtime"]["agents"][0]
            [child] = pool["children"]
            assert (child["state"], child["sessions"], child["primed"]) == ("full", 4, False)
            assert len(opened(store)) == 4
            reply = await client.post(
                f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "hi"}]}
            )
            assert reply.status_code == 200 and reply.json()["stopReason"] == "end_turn"
    finally:
        d.stop()


async def test_a_create_while_the_next_prime_is_in_flight_waits_for_it(tmp_path: Path) -> None:
    """Packed, creates back to back while the agent answers ``session/new`` slowly (as a
    ``qwen --acp`` busy with a turn does): each create takes the prime the previous one set
    off instead of sending a ``session/new`` of its own behind it, so four creates into a
    four-slot child cost the agent four ``session/new`` in all, and every session works."""
    state = tmp_path / "agent"
    agent = f"{sys.executable} {PACKING_AGENT} --state-dir {state} --slow-new 300"
    d = spawn_daemon(
        ["--sessions-per-agent", "4", "--agent", agent],
        env={"QWEN_SERVER_TOKEN": TOKEN, "HOME": str(tmp_path)},
    )
    try:
        async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30) as client:
            await pool_until(client, primed_warm)
            sids = []
            for _ in range(4):
                created = await client.post("/session", json={"sessionScope": "thread"})
                assert created.status_code == 200, created.text
                sids.append(created.json()["sessionId"])
            assert len(set(sids)) == 4
            requests = (state / "new-requests").read_text().split()
            assert len(requests) == 4, requests  # the spare's prime, then one per create
            pool = (await client.get("/daemon/status")).json()["runtime"]["agents"][0]
            [child] = pool["children"]
            assert (child["state"], child["sessions"], child["primed"]) == ("full", 4, False)
            for sid in sids:
                reply = await client.post(
                    f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "hi"}]}
                )
                assert reply.status_code == 200 and reply.json()["stopReason"] == "end_turn"
    finally:
        d.stop()
