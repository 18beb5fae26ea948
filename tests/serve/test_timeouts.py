"""Prompt deadlines and idle-session reaping, against the real daemon."""

from __future__ import annotations

import httpx
import trio

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import spawn_daemon
from tests.support.sse import collect_until


async def test_prompt_deadline_ends_the_turn_and_unblocks_the_queue() -> None:
    daemon = spawn_daemon(["--prompt-deadline-ms", "2000"], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            assert (
                "prompt_absolute_deadline" in (await client.get("/capabilities")).json()["features"]
            )
            sid = (await client.post("/session", json={})).json()["sessionId"]
            # A long sleep with a shorter per-request deadline: the deadline ends the turn.
            wedged = await client.post(
                f"/session/{sid}/prompt",
                json={"prompt": [{"type": "text", "text": "[sleep 60000]"}], "deadlineMs": 500},
                headers={"Prefer": "respond-async"},
            )
            after = await client.post(
                f"/session/{sid}/prompt",
                json={"prompt": [{"type": "text", "text": "next"}]},
                headers={"Prefer": "respond-async"},
            )
            async with client.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                done: list[dict] = []
                await collect_until(
                    stream,
                    lambda e: (
                        e["type"] in ("turn_complete", "turn_error")
                        and done.append(e) is None
                        and len(done) == 2
                    ),
                )
        assert done[0]["promptId"] == wedged.json()["promptId"]
        assert done[0]["type"] == "turn_error"
        assert done[0]["data"]["code"] == "prompt_deadline_exceeded"
        assert done[1]["promptId"] == after.json()["promptId"]
        assert done[1]["type"] == "turn_complete"
    finally:
        daemon.stop()


async def test_idle_sessions_are_reaped_unless_kept_alive() -> None:
    daemon = spawn_daemon(
        ["--session-idle-timeout-ms", "1500", "--session-reap-interval-ms", "100"],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            idle = (await client.post("/session", json={"sessionScope": "thread"})).json()
            kept = (await client.post("/session", json={"sessionScope": "thread"})).json()
            watched = (await client.post("/session", json={"sessionScope": "thread"})).json()
            async with client.stream("GET", f"/session/{watched['sessionId']}/events"):
                # Heartbeats keep one alive while the untouched one is reaped (a read of its
                # pending prompts is no activity; the reap is waited for, not slept for).
                with trio.fail_after(30):
                    while (
                        await client.get(f"/session/{idle['sessionId']}/pending-prompts")
                    ).status_code != 404:
                        r = await client.post(f"/session/{kept['sessionId']}/heartbeat")
                        assert r.status_code == 200
                        await trio.sleep(0.1)
                reaped_at = trio.current_time()
                while trio.current_time() < reaped_at + 2.0:  # > one more idle timeout
                    r = await client.post(f"/session/{kept['sessionId']}/heartbeat")
                    assert r.status_code == 200
                    await trio.sleep(0.1)
                # Never touched, idle for longer than the reaped one: its SSE subscriber kept
                # it alive.
                r = await client.post(f"/session/{watched['sessionId']}/heartbeat")
                assert r.status_code == 200
    finally:
        daemon.stop()


async def test_settled_grace_delays_reaping_after_a_prompt() -> None:
    # The idle timeout is long enough that a loaded machine still gets the first prompt in
    # before the worked session could be reaped; the reap is then waited for, not slept for.
    daemon = spawn_daemon(
        [
            "--session-idle-timeout-ms",
            "2000",
            "--session-reap-interval-ms",
            "100",
            "--session-prompt-settled-close-grace-ms",
            "60000",
        ],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            worked = (await client.post("/session", json={"sessionScope": "thread"})).json()
            r = await client.post(
                f"/session/{worked['sessionId']}/prompt",
                json={"prompt": [{"type": "text", "text": "hello"}]},
            )
            assert r.status_code == 200
            idle = (await client.post("/session", json={"sessionScope": "thread"})).json()
            # The session that never prompted is reaped (> idle timeout after its creation)...
            with trio.fail_after(20):
                while (  # noqa: ASYNC110
                    await client.get(f"/session/{idle['sessionId']}/pending-prompts")
                ).status_code != 404:
                    await trio.sleep(0.1)
            # ...while the one whose prompt settled before it was created is kept for the
            # grace period, although it too has been idle for longer than the idle timeout.
            r = await client.get(f"/session/{worked['sessionId']}/pending-prompts")
            assert r.status_code == 200
    finally:
        daemon.stop()


async def test_max_connections_caps_event_streams() -> None:
    daemon = spawn_daemon(["--max-connections", "2"], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            async with (
                client.stream("GET", f"/session/{sid}/events"),
                client.stream("GET", f"/session/{sid}/events"),
            ):
                third = await client.get(f"/session/{sid}/events")
                assert third.status_code == 503
                assert third.json()["code"] == "connection_limit_exceeded"
                assert third.headers["retry-after"] == "5"
            # Streams released (once the daemon has seen the disconnects): accepted again.
            with trio.fail_after(20):
                while (await client.get("/health", params={"deep": "1"})).json()[  # noqa: ASYNC110
                    "connectedClients"
                ]:
                    await trio.sleep(0.05)
            async with client.stream("GET", f"/session/{sid}/events") as again:
                assert again.status_code == 200
    finally:
        daemon.stop()
