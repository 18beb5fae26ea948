"""Issue 16 item 4: supervision of the daemon's own children (real daemon processes with one
fault injected by tests/support/faulty_daemon.py)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import trio

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import iter_events

FAULTY = str(Path(__file__).resolve().parents[1] / "support" / "faulty_daemon.py")


def _faulty(fault: str, trigger: Path) -> DaemonProcess:
    return spawn_daemon(env={"QWEN_SERVER_TOKEN": TOKEN}, launcher=(FAULTY, fault, str(trigger)))


async def _wait_for_log(daemon: DaemonProcess, pattern: str, count: int = 1) -> None:
    with trio.fail_after(60):
        while len(re.findall(pattern, daemon.stderr())) < count:  # noqa: ASYNC110
            await trio.sleep(0.1)


async def test_a_flapping_optional_service_has_its_own_budget(tmp_path: Path) -> None:
    trigger = tmp_path / "fault"
    daemon = _faulty("flaky-service", trigger)
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid = (await client.post("/session", json={"sessionScope": "thread"})).json()[
                "sessionId"
            ]
            trigger.touch()
            # The services supervisor gives up twice (each time after 6 crashes of "flaky")
            # and the root restarts it with backoff: 12+ crashes, the root never gives up.
            await _wait_for_log(daemon, r"supervisor services: flaky give_up", count=2)
            assert daemon.proc.poll() is None
            assert "supervisor root: services give_up" not in daemon.stderr()
            # Once the fault stops, the restarted services run again (the same actors, not
            # closed for good by the stop of the supervisor that gave up).
            trigger.unlink()
            with trio.fail_after(60):
                while (await client.get("/workspace/auth/status")).status_code != 200:  # noqa: ASYNC110
                    await trio.sleep(0.1)
            log = daemon.stderr()
            assert "device-flow-poller give_up" not in log and "mcp-pool give_up" not in log
            assert "device-flow-poller exit" not in log and "mcp-pool exit" not in log
            r = await client.post(
                f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "still"}]}
            )
            assert r.status_code == 200 and r.json()["stopReason"] == "end_turn"
            assert (await client.get("/health")).status_code == 200
    finally:
        daemon.stop()


async def test_when_the_root_gives_up_streams_end_then_the_process_exits_70(
    tmp_path: Path,
) -> None:
    trigger = tmp_path / "fault"
    daemon = _faulty("mediator", trigger)
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid = (await client.post("/session", json={"sessionScope": "thread"})).json()[
                "sessionId"
            ]
            seen: list[dict[str, object]] = []
            async with client.stream("GET", f"/session/{sid}/events") as stream:
                trigger.touch()
                with trio.fail_after(60):
                    async for event in iter_events(stream):
                        seen.append(event)
            # The stream ended after a terminal event, not cut.
            assert seen[-1]["type"] == "session_died"
            assert seen[-1]["data"]["reason"] == "daemon_failure"  # type: ignore[index]
        with trio.fail_after(30):
            while daemon.proc.poll() is None:  # noqa: ASYNC110
                await trio.sleep(0.1)
        assert daemon.proc.returncode == 70
        lines = daemon.stderr().strip().splitlines()
        assert lines[-1] == (
            "acp-serve: supervisor 'root' gave up: child 'permission-mediator' needed more "
            "than 5 restarts in 30 s; exiting"
        )
        assert "Exception Group Traceback" not in daemon.stderr()
    finally:
        daemon.stop()
