"""Issue 16: a misbehaving agent or client input in one session hurts nobody (real daemon,
the rogue agent of tests/support/rogue_agent.py)."""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until

ROGUE = f"{sys.executable} {Path(__file__).resolve().parents[1] / 'support' / 'rogue_agent.py'}"


@pytest.fixture(scope="module")
def rogue_daemon() -> Iterator[DaemonProcess]:
    d = spawn_daemon(
        [
            "--agent",
            ROGUE,
            "--max-agent-line-bytes",
            str(1 << 20),
            "--event-ring-bytes",
            str(1 << 20),
        ],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
async def rogue(rogue_daemon: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=rogue_daemon.url, timeout=60, headers=AUTH) as c:
        yield c


async def _session(client: httpx.AsyncClient) -> str:
    r = await client.post("/session", json={"sessionScope": "thread"})
    assert r.status_code == 200, r.text
    return str(r.json()["sessionId"])


async def _prompt(client: httpx.AsyncClient, sid: str, text: str) -> dict[str, Any]:
    r = await client.post(
        f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": text}]}
    )
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def _events(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    async with client.stream("GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}) as s:
        return await collect_until(s, lambda e: e["type"] == "replay_complete")


def _texts(events: list[dict[str, Any]]) -> list[str]:
    return [
        e["data"]["update"]["content"]["text"]
        for e in events
        if e["type"] == "session_update"
        and e["data"]["update"].get("sessionUpdate") == "agent_message_chunk"
    ]


# ---- item 10: deeply nested JSON --------------------------------------------------------


@pytest.mark.parametrize("depth", [200, 100_000])
async def test_deeply_nested_request_body_is_a_400(rogue: httpx.AsyncClient, depth: int) -> None:
    body = b'{"sessionScope":"thread","x":' + b"[" * depth + b"]" * depth + b"}"
    r = await rogue.post("/session", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json() == {"error": "Request body nests JSON deeper than 64 levels"}
    ok = b'{"sessionScope":"thread","x":' + b"[" * 60 + b"]" * 60 + b"}"
    r = await rogue.post("/session", content=ok, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text


async def test_deeply_nested_agent_line_is_dropped_and_the_turn_goes_on(
    rogue: httpx.AsyncClient,
) -> None:
    sid = await _session(rogue)
    result = await _prompt(rogue, sid, "say before; nested 100000; say after")
    assert result["stopReason"] == "end_turn"
    assert _texts(await _events(rogue, sid)) == ["before", "after"]
    again = await _prompt(rogue, sid, "say still alive")
    assert again["stopReason"] == "end_turn"


# ---- item 1: memory bounded in bytes ----------------------------------------------------


async def test_oversized_agent_line_is_dropped_visibly_and_the_turn_goes_on(
    rogue: httpx.AsyncClient, rogue_daemon: DaemonProcess
) -> None:
    sid = await _session(rogue)
    result = await _prompt(rogue, sid, "say a; line 3000000; say b")
    assert result["stopReason"] == "end_turn"
    events = await _events(rogue, sid)
    assert _texts(events) == ["a", "b"]
    dropped = [e for e in events if e["type"] == "agent_output_dropped"]
    assert len(dropped) == 1
    data = dropped[0]["data"]
    assert data["reason"] == "line_too_long" and data["maxBytes"] == 1 << 20
    assert data["sizeBytes"] >= 3_000_000 and data["sessionId"] == sid
    assert dropped[0]["promptId"]  # stamped with the running prompt
    assert "oversized lines" in rogue_daemon.stderr()


async def test_replay_ring_is_bounded_in_bytes(rogue: httpx.AsyncClient) -> None:
    sid = await _session(rogue)
    # 12 updates of 200 KB: more than the 1 MiB ring holds.
    assert (await _prompt(rogue, sid, "big 200000 12; say tail"))["stopReason"] == "end_turn"
    events = await _events(rogue, sid)
    resync = [e for e in events if e["type"] == "state_resync_required"]
    assert len(resync) == 1 and resync[0]["data"]["reason"] == "ring_evicted"
    earliest = resync[0]["data"]["earliestAvailableId"]
    replayed = [e for e in events if "id" in e]
    assert replayed[0]["id"] == earliest > 1
    big = [t for t in _texts(events) if t.startswith("x")]
    assert 1 <= len(big) <= 5  # what fits in 1 MiB, never the 12 (2.4 MB)
    assert sum(len(t) for t in big) <= 1 << 20
    assert _texts(events)[-1] == "tail"
    # Ids stay gap-free from the earliest kept one.
    ids = [e["id"] for e in replayed]
    assert ids == list(range(earliest, earliest + len(ids)))


# ---- item 8: a flood of invalid lines costs a few log lines ------------------------------


async def test_invalid_agent_lines_are_counted_and_logged_at_most_once_per_interval(
    rogue: httpx.AsyncClient, rogue_daemon: DaemonProcess
) -> None:
    before = rogue_daemon.stderr().count("invalid lines")
    sid = await _session(rogue)
    result = await _prompt(rogue, sid, "garbage 100000; say done")
    assert result["stopReason"] == "end_turn"
    assert _texts(await _events(rogue, sid)) == ["done"]
    assert (await rogue.delete(f"/session/{sid}")).status_code in (200, 204)
    deadline = time.monotonic() + 30
    while "(100000 in all)" not in rogue_daemon.stderr() and time.monotonic() < deadline:  # noqa: ASYNC110
        await trio.sleep(0.1)
    log = rogue_daemon.stderr()
    assert "(100000 in all)" in log  # the reader's final report counts every line
    assert log.count("invalid lines") - before <= 4  # not one line per garbage line
    assert len(log) < 200_000


async def test_a_blocked_stderr_never_blocks_the_event_loop(tmp_path: Path) -> None:
    """stderr is a pipe nobody reads: once it is full, every log write would block. The
    daemon keeps answering (records are queued, then dropped and counted)."""
    import os
    import subprocess

    from tests.support.daemon import ROOT

    (tmp_path / "ws").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "QWEN_SERVER_TOKEN"}
    env["QWEN_SERVER_TOKEN"] = TOKEN
    proc = subprocess.Popen(  # noqa: ASYNC220 (started once, read from this thread)
        [
            sys.executable,
            "-m",
            "serve",
            "--port",
            "0",
            "--workspace",
            str(tmp_path / "ws"),
            "--state-dir",
            str(tmp_path / "state"),
            "--access-log",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        url = proc.stdout.readline().decode().split()[3]
        # ~85 bytes of access log per request: 1500 of them overflow a 64 KiB pipe twice.
        async with httpx.AsyncClient(base_url=url, timeout=20, headers=AUTH) as client:
            for _ in range(1500):
                r = await client.get("/session/no-such-session-id-padding-padding/pending")
                assert r.status_code == 404
            assert (await client.get("/health")).status_code == 200
        assert proc.poll() is None
    finally:
        proc.terminate()
        if proc.stderr is not None:
            tail = proc.stderr.read()  # unblocks the writer thread; the daemon then exits
        proc.wait(20)
    assert tail.count(b"INFO serve.access: GET") == 1500  # queued meanwhile, none lost
