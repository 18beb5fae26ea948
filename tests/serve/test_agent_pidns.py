"""Agents in pid namespaces of their own (serve/isolation/pidns.py, acp/nsinit.py), end to
end: a real daemon (its token on its command line), real agent children, the real kernel.

From inside an agent (its own process, a shell step it runs through a terminal, the session
shell) the daemon's ``/proc`` entries and the other agents' processes cannot be seen; its
own work still works; killing the child leaves nothing behind, and everything is reaped."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from acp import procfs
from serve.isolation import pidns
from tests.conftest import AUTH, TOKEN
from tests.serve.test_agent_limits import HOSTILE, reply_text
from tests.serve.test_effects import new_session, said, turn
from tests.serve.test_teardown import agent_flag, state, wait_until, zombie_children
from tests.support.daemon import DaemonProcess, running_daemon
from tests.support.sse import iter_events

pytestmark = pytest.mark.skipif(
    pidns.resolve("auto").active is False, reason="the kernel refuses pid namespaces here"
)


def descendants(root: int) -> set[int]:
    return set(procfs.TreeWalker().tree(root)) - {root}


def agent_pid(client: httpx.Client, sid: str) -> int:
    body = client.get("/daemon/status", params={"detail": "full"}).json()
    session = next(s for s in body["full"]["sessions"] if s["sessionId"] == sid)
    return int(session["agentPid"])


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[DaemonProcess]:
    # The token on the command line: what /proc/<daemon>/cmdline would show an agent.
    with running_daemon(
        ["--agent", f"{sys.executable} {HOSTILE}", "--warm-agents", "0", "--token", TOKEN],
        workspace=tmp_path,
    ) as d:
        yield d


def test_an_agent_sees_only_its_own_tree_not_the_daemon_nor_other_agents(
    hostile: DaemonProcess,
) -> None:
    daemon_pid = hostile.proc.pid
    with httpx.Client(base_url=hostile.url, headers=AUTH, timeout=60) as client:
        iso = client.get("/daemon/status").json()["isolation"]["pidNamespace"]
        assert iso["mode"] == "auto"
        first = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        second = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        iso = client.get("/daemon/status").json()["isolation"]["pidNamespace"]
        assert iso["active"] is True and iso["via"] == "root"
        outside = {agent_pid(client, first), agent_pid(client, second)}
        assert len(outside) == 2 and all(p in descendants(daemon_pid) for p in outside)
        for sid in (first, second):
            # Its /proc lists its init (1) and itself (2): no daemon, no other agent.
            assert reply_text(client, sid, "procs") == "1 2"
            assert reply_text(client, sid, "pid") == "2"
            for what in ("cmdline", "environ"):
                seen = reply_text(client, sid, f"cat /proc/{daemon_pid}/{what}")
                assert seen == "error ENOENT", seen
            other = (outside - {agent_pid(client, sid)}).pop()
            assert reply_text(client, sid, f"cat /proc/{other}/cmdline") == "error ENOENT"
            # Its own /proc works.
            assert "hostile_agent" in reply_text(client, sid, "cat /proc/self/cmdline")
        # The daemon still reads the children's trees (memory figures, the reaper).
        full = client.get("/daemon/status", params={"detail": "full"}).json()
        assert TOKEN not in str(full)


async def test_a_shell_step_and_the_session_shell_cannot_see_the_daemon(tmp_path: Path) -> None:
    with running_daemon(["--token", TOKEN, "--enable-session-shell"], workspace=tmp_path) as d:
        daemon_pid = d.proc.pid
        async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=60) as client:
            sid, cid = await new_session(client)
            mode = await client.post(
                f"/session/{sid}/approval-mode",
                json={"mode": "yolo"},
                headers={"X-Qwen-Client-Id": cid},
            )
            assert mode.status_code == 200, mode.text
            script = (
                f"cat /proc/{daemon_pid}/cmdline || echo NO-CMDLINE; "
                f"cat /proc/{daemon_pid}/environ || echo NO-ENVIRON; "
                "echo PROCS $(ls /proc | grep -x -E '(0|1|2|3|4|5|6|7|8|9)+' | tr '\\n' ' '); "
                "echo mine > own.txt && cat own.txt"
            )
            # The effect gate asks about a command naming paths outside the workspace: allow.
            events = await turn(
                client, sid, f"[shell {script}]", client_id=cid, on_permission=_allow(client, sid)
            )
            out = said(events)
            assert TOKEN not in out
            assert "NO-CMDLINE" in out and "NO-ENVIRON" in out, out
            procs = out.split("PROCS", 1)[1].split("mine")[0].split()
            # Its init, its shell and the shell's few commands: a namespace of its own.
            assert str(daemon_pid) not in procs and procs[:2] == ["1", "2"], procs
            assert all(int(p) < 50 for p in procs), procs
            assert "mine" in out and (tmp_path / "own.txt").read_text() == "mine\n"

            # The session shell: the gate asks about the same paths; a client allows.
            shell: list[httpx.Response] = []

            async def run_shell() -> None:
                shell.append(
                    await client.post(
                        f"/session/{sid}/shell",
                        json={"command": script},
                        headers={"X-Qwen-Client-Id": cid},
                    )
                )
                nursery.cancel_scope.cancel()

            async def allow_requests() -> None:
                vote = _allow(client, sid)
                since = {"Last-Event-ID": str(events[-1]["id"])}  # nothing missed
                async with client.stream("GET", f"/session/{sid}/events", headers=since) as stream:
                    async for event in iter_events(stream):
                        if event.get("type") == "permission_request":
                            await vote(event["data"])

            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(allow_requests)
                    nursery.start_soon(run_shell)
            [done] = shell
            assert done.status_code == 200, done.text
            out = done.json()["output"]
            assert TOKEN not in out and "NO-CMDLINE" in out and "NO-ENVIRON" in out, out
            assert "PROCS 1 2 " in out, out
            assert done.json()["exitCode"] == 0


def _allow(client: httpx.AsyncClient, sid: str) -> Any:
    async def vote(request: dict[str, Any]) -> None:
        option = next(o["optionId"] for o in request["options"] if o["kind"] == "allow_once")
        r = await client.post(
            f"/session/{sid}/permission/{request['requestId']}",
            json={"outcome": {"outcome": "selected", "optionId": option}},
        )
        assert r.status_code == 200, r.text

    return vote


def test_sigkill_of_the_agent_kills_its_whole_namespace_and_all_is_reaped(
    tmp_path: Path,
) -> None:
    """Three grandchildren leave the agent's process group (``setsid``) and are orphaned:
    inside its namespace they go to its init. SIGKILL of the agent (the pid the daemon
    reports) ends all of them, and nothing is left unreaped."""
    pids_file = tmp_path / "orphans"
    with running_daemon(
        [*agent_flag("--orphans", "3", "--pids", str(pids_file)), "--warm-agents", "0"],
        workspace=tmp_path,
        env={"QWEN_SERVER_TOKEN": TOKEN},
    ) as d:
        with httpx.Client(base_url=d.url, headers=AUTH, timeout=30) as client:
            sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
            assert len(pids_file.read_text().split()) == 3  # as the agent sees them
            pid = agent_pid(client, sid)
            # P (the daemon's child), its init, the agent, the three orphans.
            assert wait_until(lambda: len(descendants(pid)) >= 5), descendants(pid)
            tree = descendants(pid) | {pid}
            os.kill(pid, signal.SIGKILL)
            assert wait_until(lambda: all(state(p) is None for p in tree)), [
                (p, state(p)) for p in tree
            ]
            assert wait_until(lambda: zombie_children(d.proc.pid) == [])
            assert client.get("/health").status_code == 200


def test_the_daemons_stop_kills_every_agent_tree(tmp_path: Path) -> None:
    pids_file = tmp_path / "orphans"
    with running_daemon(
        [*agent_flag("--orphans", "2", "--pids", str(pids_file)), "--warm-agents", "0"],
        workspace=tmp_path,
        env={"QWEN_SERVER_TOKEN": TOKEN},
    ) as d:
        with httpx.Client(base_url=d.url, headers=AUTH, timeout=30) as client:
            client.post("/session", json={"sessionScope": "thread"}).raise_for_status()
            assert wait_until(lambda: len(descendants(d.proc.pid)) >= 5)
            tree = descendants(d.proc.pid)
        assert d.stop(signal.SIGTERM, timeout_s=20) == 0
    assert wait_until(lambda: all(state(p) in (None, "Z") for p in tree)), [
        (p, state(p)) for p in tree
    ]


def test_off_keeps_agents_in_the_daemons_namespace(tmp_path: Path) -> None:
    with running_daemon(
        [
            "--agent",
            f"{sys.executable} {HOSTILE}",
            "--warm-agents",
            "0",
            "--agent-pid-namespace",
            "off",
        ],
        workspace=tmp_path,
        env={"QWEN_SERVER_TOKEN": TOKEN},
    ) as d:
        with httpx.Client(base_url=d.url, headers=AUTH, timeout=60) as client:
            sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
            assert reply_text(client, sid, "pid") == str(agent_pid(client, sid))
            body: dict[str, Any] = client.get("/daemon/status").json()
            ns = body["isolation"]["pidNamespace"]
            assert ns["active"] is False and ns["reason"] == "--agent-pid-namespace off"
