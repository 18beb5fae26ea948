"""Teardown of hard-to-stop agents (issue 16 items 5 and 6), against the real daemon process.

The agent is ``tests/serve/stubborn_agent.py``: it can ignore stdin EOF, ignore SIGTERM, and
leave grandchildren that ``setsid()`` out of its process group and outlive it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import httpx

from tests.support.daemon import spawn_daemon

AGENT = str(Path(__file__).with_name("stubborn_agent.py"))


def agent_flag(*args: str) -> list[str]:
    return ["--agent", " ".join([sys.executable, AGENT, *args])]


def state(pid: int) -> str | None:
    """The /proc state letter of ``pid`` (``Z`` for a zombie), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def zombie_children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] == "Z":
                out.append(int(entry))
    return out


def wait_until(predicate: object, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_sigterm_does_not_wait_on_an_idle_agent_that_ignores_stdin_eof() -> None:
    daemon = spawn_daemon(agent_flag("--ignore-eof"))
    try:
        with httpx.Client(base_url=daemon.url, timeout=30) as client:
            assert client.post("/session", json={}).status_code == 200
        assert daemon.stop(signal.SIGTERM, timeout_s=20) == 0
        log = daemon.stderr()
        # At shutdown the idle agent gets no EOF grace: SIGTERM comes with the EOF.
        assert "ignored stdin EOF for 0.0s; sending SIGTERM" in log, log[-2000:]
        assert "ignored stdin EOF for 0.2s" not in log, log[-2000:]
    finally:
        daemon.stop(signal.SIGKILL)


def test_sigterm_does_not_wait_on_an_agent_still_starting(tmp_path: Path) -> None:
    """The pool's refill child never answers ``initialize`` (and ignores stdin EOF): the
    shutdown stops it with SIGTERM at once, not after a whole EOF grace."""
    hang = tmp_path / "hang"
    daemon = spawn_daemon(agent_flag("--ignore-eof", "--hang-init-if", str(hang)))
    try:
        with httpx.Client(base_url=daemon.url, timeout=30) as client:

            def warm() -> bool:
                pool = client.get("/daemon/status").json()["runtime"]["agents"][0]
                return any(c["state"] == "warm" for c in pool["children"])

            assert wait_until(warm)
            hang.touch()  # the spare is ready; the refill after the next create hangs
            assert client.post("/session", json={}).status_code == 200

            def starting() -> bool:
                pool = client.get("/daemon/status").json()["runtime"]["agents"][0]
                return bool(pool.get("spawning"))

            assert wait_until(starting)
        assert daemon.stop(signal.SIGTERM, timeout_s=20) == 0
        log = daemon.stderr()
        assert "ignored stdin EOF for 1.0s" not in log, log[-2000:]
        assert "ignored stdin EOF for 0.2s" not in log, log[-2000:]
    finally:
        daemon.stop(signal.SIGKILL)


def test_a_session_being_torn_down_does_not_count_against_max_sessions() -> None:
    """The agent ignores EOF and SIGTERM, so its teardown takes seconds (SIGKILL ends it);
    meanwhile the slot is free: a new session is created, not refused with 503."""
    daemon = spawn_daemon(["--max-sessions", "1", *agent_flag("--ignore-eof", "--ignore-term")])
    try:
        with httpx.Client(base_url=daemon.url, timeout=30) as client:
            first = client.post("/session", json={"sessionScope": "thread"})
            assert first.status_code == 200, first.text
            sid = first.json()["sessionId"]
            assert client.delete(f"/session/{sid}").status_code in (200, 204)
            second = client.post("/session", json={"sessionScope": "thread"})
            assert second.status_code == 200, second.text
            third = client.post("/session", json={"sessionScope": "thread"})
            assert third.status_code == 503  # the limit itself still holds
    finally:
        daemon.stop()


def test_orphaned_grandchildren_that_left_the_group_die_and_leave_no_zombie(
    tmp_path: Path,
) -> None:
    """Three grandchildren setsid() out of the agent's group and are orphaned (re-parented to
    the daemon, a child subreaper). Closing the session kills them; the daemon reaps them."""
    pids_file = tmp_path / "orphans"
    # In the workspace: the agent's file sandbox lets it write there. No spare: a refill
    # opens its first session ahead of need (serve/agents/primed.py), whose orphans would
    # join this session's in the file.
    daemon = spawn_daemon(
        [
            *agent_flag("--orphans", "3", "--pids", str(pids_file)),
            "--warm-agents",
            "0",
            # The agent writes the pids it sees: the daemon's own only outside a namespace
            # (test_agent_pidns.py has this case inside one).
            "--agent-pid-namespace",
            "off",
        ],
        workspace=tmp_path,
    )
    try:
        with httpx.Client(base_url=daemon.url, timeout=30) as client:
            created = client.post("/session", json={"sessionScope": "thread"})
            assert created.status_code == 200, created.text
            orphans = [int(p) for p in pids_file.read_text().split()]
            assert len(orphans) == 3
            # Orphaned, they were re-parented to the daemon (the subreaper), not to PID 1.
            assert wait_until(lambda: all(_ppid(p) == daemon.proc.pid for p in orphans))
            assert client.delete(f"/session/{created.json()['sessionId']}").status_code in (
                200,
                204,
            )
            # Killed with the session, and reaped: no process and no zombie remains.
            assert wait_until(lambda: all(state(p) is None for p in orphans)), [
                (p, state(p)) for p in orphans
            ]
            assert zombie_children(daemon.proc.pid) == []
            assert client.get("/health").status_code == 200
    finally:
        daemon.stop()


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None
