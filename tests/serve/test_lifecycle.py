"""Graceful drain on SIGTERM, /readyz transitions, no process left behind."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import httpx
import trio

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import spawn_daemon
from tests.support.sse import iter_events


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def test_drain_lets_the_running_prompt_finish_then_exits_cleanly() -> None:
    daemon = spawn_daemon(env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            assert (await client.get("/readyz")).json() == {"status": "ready"}
            sid = (await client.post("/session", json={})).json()["sessionId"]
            agents = _children(daemon.proc.pid)
            assert agents
            r = await client.post(
                f"/session/{sid}/prompt",
                json={"prompt": [{"type": "text", "text": "[sleep 1500] finished"}]},
                headers={"Prefer": "respond-async"},
            )
            prompt_id = r.json()["promptId"]
            events: list[dict[str, Any]] = []
            # The stream's subscription is made before its response starts: it sees the
            # turn's end.
            async with client.stream("GET", f"/session/{sid}/events") as stream:
                daemon.proc.send_signal(signal.SIGTERM)
                async with httpx.AsyncClient(
                    base_url=daemon.url, headers=AUTH, timeout=10
                ) as other:
                    with trio.fail_after(10):  # until the daemon has begun to drain
                        while (await other.get("/readyz")).status_code != 503:  # noqa: ASYNC110
                            await trio.sleep(0.02)
                    refused = await other.post("/session", json={"sessionScope": "thread"})
                    assert refused.status_code == 503
                    assert refused.json()["code"] == "daemon_draining"
                    assert refused.headers["retry-after"]
                    prompt = await other.post(
                        f"/session/{sid}/prompt",
                        json={"prompt": [{"type": "text", "text": "late"}]},
                    )
                    assert prompt.status_code == 503
                    ready = await other.get("/readyz")
                    assert ready.status_code == 503 and ready.json()["reason"] == "draining"
                async for event in iter_events(stream):
                    if "comment" not in event:
                        events.append(event)
        types = [e["type"] for e in events]
        complete = next(e for e in events if e["type"] == "turn_complete")
        assert complete["promptId"] == prompt_id
        assert complete["data"]["stopReason"] == "end_turn"
        assert types[-1] == "session_died"
        assert events[-1]["data"]["reason"] == "daemon_shutdown"
        assert daemon.proc.wait(10) == 0
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in agents):
            assert time.monotonic() < deadline, "agent process survived the daemon"
            await trio.sleep(0.05)
    finally:
        daemon.stop()


async def test_drain_timeout_cancels_what_is_still_running() -> None:
    daemon = spawn_daemon(["--drain-timeout-ms", "300"], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            await client.post(
                f"/session/{sid}/prompt",
                json={"prompt": [{"type": "text", "text": "[sleep 60000]"}]},
                headers={"Prefer": "respond-async"},
            )
            async with client.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                started = time.monotonic()
                daemon.proc.send_signal(signal.SIGTERM)
                events = [e async for e in iter_events(stream) if "comment" not in e]
        terminal = [e for e in events if e["type"] in ("turn_complete", "turn_error")]
        assert len(terminal) == 1
        assert terminal[0]["type"] == "turn_error"
        assert terminal[0]["data"]["code"] == "daemon_shutdown"
        assert events[-1]["type"] == "session_died"
        assert daemon.proc.wait(10) == 0
        assert time.monotonic() - started < 6
    finally:
        daemon.stop()


async def test_readyz_reports_capacity() -> None:
    daemon = spawn_daemon(["--max-sessions", "1"], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            assert (await client.get("/readyz")).status_code == 200
            await client.post("/session", json={})
            r = await client.get("/readyz")
            assert r.status_code == 503
            assert r.json() == {"status": "not_ready", "reason": "session_capacity_exhausted"}
            full = await client.post("/session", json={"sessionScope": "thread"})
            assert full.status_code == 503 and full.json()["code"] == "session_limit_exceeded"
            assert full.json()["limit"] == 1 and full.headers["retry-after"] == "5"
    finally:
        daemon.stop()


async def test_agents_that_cannot_start_fail_the_create_cleanly() -> None:
    """Missing binary, an agent that exits at once, one that never answers initialize."""
    cases = [
        ("/nonexistent/agent", 503, "acp_channel_unavailable"),
        ("false", 503, "acp_channel_unavailable"),
        ("sleep 1000", 504, "init_timeout"),
    ]
    for agent, status, code in cases:
        daemon = spawn_daemon(
            ["--agent", agent, "--initialize-timeout-ms", "1000"],
            env={"QWEN_SERVER_TOKEN": TOKEN},
        )
        try:
            async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
                r = await client.post("/session", json={})
                assert r.status_code == status, (agent, r.text)
                body = r.json()
                assert body["code"] == code and body["retryable"] is True
                assert r.headers["retry-after"] == "5"
                if code == "init_timeout":
                    assert body["errorKind"] == "init_timeout"
                    assert body["sideEffectPossible"] is False
                    assert body["timeoutMs"] == 1000
                deep = (await client.get("/health", params={"deep": "1"})).json()
                assert deep["sessions"] == 0  # the slot was cleared
                agents = _children(daemon.proc.pid)
            assert daemon.stop() == 0
            assert not any(_alive(p) for p in agents)
        finally:
            daemon.stop()


async def test_a_failed_spawn_fails_every_coalesced_caller_and_clears_the_slot() -> None:
    daemon = spawn_daemon(["--agent", "false"], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            results: list[httpx.Response] = []

            async def create() -> None:
                results.append(await client.post("/session", json={}))

            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(create)
            assert [r.status_code for r in results] == [503] * 5
            assert {r.json()["code"] for r in results} == {"acp_channel_unavailable"}
            # The slot was cleared: the next call starts afresh (and fails afresh).
            again = await client.post("/session", json={})
            assert again.status_code == 503
            assert (await client.get("/health", params={"deep": "1"})).json()["sessions"] == 0
    finally:
        daemon.stop()


async def test_a_second_signal_forces_the_exit() -> None:
    daemon = spawn_daemon(["--drain-timeout-ms", "60000"], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            agents = _children(daemon.proc.pid)
            await client.post(
                f"/session/{sid}/prompt",
                json={"prompt": [{"type": "text", "text": "[sleep 60000]"}]},
                headers={"Prefer": "respond-async"},
            )
        daemon.proc.send_signal(signal.SIGTERM)
        await trio.sleep(0.5)
        assert daemon.proc.poll() is None  # draining: waiting for the 60 s prompt
        daemon.proc.send_signal(signal.SIGTERM)
        # Forced: it does not wait for the prompt (wait raises if it is still running).
        await trio.to_thread.run_sync(daemon.proc.wait, 10)
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in agents):
            assert time.monotonic() < deadline, "agent survived a forced exit"
            await trio.sleep(0.05)
    finally:
        daemon.stop()
