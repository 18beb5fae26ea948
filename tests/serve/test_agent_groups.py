"""Several real daemons on this host's cgroup v1 hierarchies (root), some of them PID 1 of a
pid namespace of their own (``unshare --pid --fork --mount-proc``, as in a container), each
with scripted agents: no daemon's start or stop removes or signals anything of another live
daemon's groups, whatever namespace either runs in; a SIGKILLed daemon's groups (and what
was left in them) are removed by the next daemon, which proves the owner gone by taking its
lock; a PID-1 daemon starts agents after another PID-1 daemon was SIGKILLed.

A test's daemons all run in a cgroup of the test's own (``tests.support.cgroups.private_base``):
they share it, as daemons sharing a host's hierarchies do, and a daemon of another test run
on this host cannot sweep the test's dead daemons' groups before the test's next daemon does.
Every daemon, process and group a test makes is removed by the ``rig`` fixture, also when
the test fails. Waits are bounded polls; nothing is timed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve.isolation import cgroups
from tests.conftest import AUTH, TOKEN
from tests.support.cgroups import (
    CG,
    CONTROLLERS,
    PrivateBase,
    private_base,
    record,
    remove,
    status_groups,
)
from tests.support.daemon import DaemonProcess, spawn_daemon

UNSHARE = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")
LOCK_FREE = "its owner is gone (its lock was free)"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0
    or not all(os.access(CG / c, os.W_OK) for c in CONTROLLERS)
    or shutil.which("unshare") is None,
    reason="needs root, writable cgroup v1 memory/pids/cpu hierarchies and unshare(1)",
)


@dataclass
class Daemon:
    process: DaemonProcess
    #: The daemon's pid on the host (for a PID-1 daemon: the wrapper's child).
    pid: int
    pid1: bool
    client: httpx.Client

    def isolation(self) -> dict[str, Any]:
        r = self.client.get("/daemon/status")
        assert r.status_code == 200, r.text
        return dict(r.json()["isolation"])

    def groups(self) -> list[Path]:
        return status_groups(self.isolation())

    def agents(self) -> set[tuple[str, int]]:
        """Its agent children (name, pid as the daemon sees it); a refill may add some."""
        return {(c["name"], c["pid"]) for c in self.isolation()["children"]}

    def new_session(self) -> str:
        r = self.client.post("/session", json={"sessionScope": "thread"})
        assert r.status_code == 200, r.text
        return str(r.json()["sessionId"])

    def answers(self, sid: str, text: str = "still here") -> bool:
        body = {"prompt": [{"type": "text", "text": text}]}
        r = self.client.post(f"/session/{sid}/prompt", json=body)
        return r.status_code == 200 and r.json().get("stopReason") == "end_turn"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """``sig`` to the daemon itself (unshare does not pass signals on), then wait for
        its wrapper; SIGKILL for the whole session after 30 s."""
        if self.process.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)
            try:
                self.process.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.proc.pid, signal.SIGKILL)
                self.process.proc.wait()
        self.client.close()


class Rig:
    """The daemons and groups of one test, all in ``base``: stopped and removed at its end."""

    def __init__(self, base: PrivateBase) -> None:
        self.base = base
        self.daemons: list[Daemon] = []
        self.groups: set[Path] = set()
        self.made: list[Path] = []

    def start(self, *, pid1: bool, warm: int = 1, pidns: str = "auto") -> Daemon:
        process = spawn_daemon(
            ["--warm-agents", str(warm), "--agent-pid-namespace", pidns],
            env={"QWEN_SERVER_TOKEN": TOKEN},
            wrapper=UNSHARE if pid1 else (),
            launcher=self.base.launcher(),
            ready_timeout_s=60,
        )
        pid = process.proc.pid
        if pid1:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            assert len(children) == 1, children
            pid = int(children[0])
        client = httpx.Client(base_url=process.url, headers=AUTH, timeout=60)
        daemon = Daemon(process, pid, pid1, client)
        self.daemons.append(daemon)
        groups = daemon.groups()
        self.groups.update(groups)
        assert len(groups) == 3, groups  # memory, pids, cpu
        if pid1:
            assert record(groups[0])["pid"] == 1
        return daemon

    def close(self) -> None:
        for daemon in self.daemons:
            daemon.stop()
        remove(self.groups)
        remove(self.made, kill=False)  # (an older daemon may have taken one meanwhile)


@pytest.fixture
def rig() -> Iterator[Rig]:
    with private_base() as base:
        r = Rig(base)
        try:
            yield r
        finally:
            r.close()


def exists(groups: list[Path]) -> bool:
    return all(g.is_dir() for g in groups)


def gone(groups: list[Path]) -> bool:
    return not any(g.exists() for g in groups)


def removed_at_start(iso: dict[str, Any]) -> dict[str, str]:
    return {e["path"]: e["why"] for e in iso["groups"]["removedAtStart"]}


def touched(iso: dict[str, Any], groups: list[Path]) -> list[dict[str, Any]]:
    """What a daemon's start-up sweep did to ``groups`` (removed or left alone noisily)."""
    names = {str(g) for g in groups}
    entries = iso["groups"]["removedAtStart"] + iso["groups"]["leftAlone"]
    return [e for e in entries if e["path"] in names or Path(e["path"]).parent.name in names]


def process_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def wait_for(condition: Any, what: str, tries: int = 400) -> None:
    for _ in range(tries):
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"not reached: {what}")


def test_daemons_in_and_out_of_a_pid_namespace_leave_each_others_groups_and_agents_alone(
    rig: Rig,
) -> None:
    # The host daemon has no agent yet: its groups are empty, the case an older daemon's
    # start removed from under a live daemon.
    host = rig.start(pid1=False, warm=0)
    host_groups = host.groups()
    assert all(cgroups.count_members(g) == 0 for g in host_groups)

    pid1 = rig.start(pid1=True)
    pid1_groups = pid1.groups()
    assert exists(host_groups)
    iso = pid1.isolation()
    assert touched(iso, host_groups) == []  # a live owner's: left alone, silently
    assert iso["groups"]["liveOthers"] >= 3

    # Both spawn and answer; the host daemon can still make its agents' cgroups.
    host_sid = host.new_session()
    pid1_sid = pid1.new_session()
    assert host.answers(host_sid) and pid1.answers(pid1_sid)
    host_agents, pid1_agents = host.agents(), pid1.agents()
    assert host_agents and pid1_agents
    assert all(cgroups.count_members(g) > 0 for g in host_groups)

    # Another host daemon and another PID-1 daemon start and stop beside them.
    for pid1_flag in (False, True):
        other = rig.start(pid1=pid1_flag)
        other_groups = other.groups()
        iso = other.isolation()
        assert touched(iso, host_groups + pid1_groups) == []
        other.stop()
        assert gone(other_groups)
        assert exists(host_groups) and exists(pid1_groups)
        assert host.agents() >= host_agents and pid1.agents() >= pid1_agents  # none lost
        assert not any(process_gone(pid) for _, pid in host_agents)
        assert host.answers(host_sid) and pid1.answers(pid1_sid)

    # Either one stops: the other's groups and agents are untouched.
    host_pids = [pid for _, pid in host_agents]
    host.stop()
    assert gone(host_groups)
    assert all(process_gone(pid) for pid in host_pids)  # its own agents: stopped with it
    assert exists(pid1_groups)
    assert pid1.agents() >= pid1_agents and pid1.answers(pid1_sid)
    # ... and a host daemon started after it leaves the PID-1 daemon's alone too.
    again = rig.start(pid1=False)
    assert touched(again.isolation(), pid1_groups) == []
    assert exists(pid1_groups) and pid1.answers(pid1_sid)
    pid1.stop()
    assert gone(pid1_groups)
    assert again.answers(again.new_session())


def test_a_sigkilled_daemons_groups_are_removed_by_the_next_daemon_in_any_namespace(
    rig: Rig,
) -> None:
    # A PID-1 daemon SIGKILLed: the kernel ends its namespace, its groups stay behind.
    first = rig.start(pid1=True)
    assert first.answers(first.new_session())
    first_groups = first.groups()
    first.stop(signal.SIGKILL)
    assert exists(first_groups)

    # A host daemon proves it gone (its lock is free) and removes them.
    # Its agents outside pid namespaces: inside one, the tool would end with the agent (its
    # namespace's init exits with it: tests/serve/test_agent_pidns.py).
    host = rig.start(pid1=False, pidns="off")
    assert gone(first_groups)
    removed = removed_at_start(host.isolation())
    assert all(removed[str(g)] == LOCK_FREE for g in first_groups)
    # Its agent leaves a tool behind (a grandchild in its cgroup), then the daemon alone is
    # SIGKILLed: the agent exits on stdin EOF, the tool stays in the dead daemon's groups.
    sid = host.new_session()
    assert host.answers(sid, "[spawn-grandchild]")
    host_groups = host.groups()
    memory = next(g for g in host_groups if g.is_relative_to(rig.base.dirs["memory"]))
    host.stop(signal.SIGKILL)
    wait_for(lambda: len(cgroups.members(memory)) == 1, "only the tool is left")
    (tool,) = cgroups.members(memory)

    # A PID-1 daemon proves the owner gone too, but cannot see the tool: it says so and
    # leaves the groups (the tool cannot be signalled from there, nor is it).
    blind = rig.start(pid1=True)
    left = {e["path"]: e["why"] for e in blind.isolation()["groups"]["leftAlone"]}
    unseen = "its owner is gone but processes this daemon cannot see are still in it"
    assert all(left[str(g)].startswith(unseen) for g in host_groups), left
    assert exists(host_groups) and not process_gone(tool)
    assert blind.answers(blind.new_session())

    # The next host daemon (it sees the tool) kills it and removes the groups.
    second = rig.start(pid1=False)
    assert gone(host_groups)
    entries = {e["path"]: e for e in second.isolation()["groups"]["removedAtStart"]}
    assert all(entries[str(g)]["why"] == LOCK_FREE for g in host_groups)
    # (killed in the first hierarchy swept; already gone in the others)
    assert sum(entries[str(g)]["killed"] for g in host_groups) == 1
    wait_for(lambda: process_gone(tool), f"the left-over tool {tool} is killed")
    assert second.answers(second.new_session())


def test_a_pid1_daemon_starts_agents_after_another_pid1_daemon_was_sigkilled(
    rig: Rig,
) -> None:
    # What an older PID-1 daemon left on this host (its name was its pid: 1); kept as is.
    legacy = [rig.base.dirs[c] / "acp-serve.1" for c in ("pids", "cpu")]
    for group in legacy:
        if not group.exists():
            (group / "agent-1").mkdir(parents=True)
            rig.made.append(group)

    first = rig.start(pid1=True)
    assert first.answers(first.new_session())
    first_groups = first.groups()
    first.stop(signal.SIGKILL)

    second = rig.start(pid1=True)
    sid = second.new_session()
    assert second.answers(sid)
    assert second.agents()
    iso = second.isolation()
    second_groups = status_groups(iso)
    assert gone(first_groups)
    assert all(removed_at_start(iso)[str(g)] == LOCK_FREE for g in first_groups)
    # The legacy groups are not its to judge (pid 1 of which namespace?): left alone, said.
    left = {e["path"]: e["why"] for e in iso["groups"]["leftAlone"]}
    blind = "this daemon runs in a pid namespace of its own and cannot see every pid"
    for group in legacy:
        assert group.is_dir()
        assert left[str(group)] == f"an older daemon's group (no owner lock): {blind}"
    assert "left alone: an older daemon's group" in second.process.stderr()
    second.stop()
    assert gone(second_groups)
    assert all(g.is_dir() for g in legacy)
