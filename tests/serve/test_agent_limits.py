"""Per-agent-child limits enforced by the kernel (issue 23): real daemons, real hostile
agents (tests/serve/hostile_agent.py), real cgroup v1 hierarchies on this machine (root).

Each hostile agent runs beside a quiet session that must keep answering; an agent killed
for memory is named (``agent_oom``, ``turn_error {code: "agent_oom"}``) and its session is
restored in place. No cgroup of a daemon is left after it exits, also after a crash.
Waits are bounded polls; nothing is timed.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.conftest import AUTH, TOKEN
from tests.support.cgroups import groups_of, own_dir, private_base, status_groups
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until

HOSTILE = Path(__file__).resolve().parent / "hostile_agent.py"
CG = Path("/sys/fs/cgroup")
MIB = 1024 * 1024

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(CG / "memory", os.W_OK),
    reason="needs root and writable cgroup v1 memory/pids/cpu hierarchies",
)


def hostile_daemon(*args: str, **kwargs: Any) -> DaemonProcess:
    return spawn_daemon(
        ["--agent", f"{sys.executable} {HOSTILE}", "--warm-agents", "0", *args],
        env={"QWEN_SERVER_TOKEN": TOKEN},
        **kwargs,
    )


def prompt(client: httpx.Client, sid: str, text: str) -> httpx.Response:
    return client.post(f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": text}]})


def reply_text(client: httpx.Client, sid: str, text: str) -> str:
    """Run a prompt; the agent's message chunk of that turn."""
    r = prompt(client, sid, text)
    assert r.status_code == 200, r.text
    prompt_id = r.json()["promptId"]
    events = stream(
        client, sid, lambda e: e["type"] == "turn_complete" and e.get("promptId") == prompt_id
    )
    chunks = [
        e["data"]["update"]["content"]["text"]
        for e in events
        if e["type"] == "session_update"
        and e["data"].get("update", {}).get("sessionUpdate") == "agent_message_chunk"
    ]
    return chunks[-1]


def stream(client: httpx.Client, sid: str, stop: Any) -> list[dict[str, Any]]:
    """The session's events from the start (a replay) until ``stop``, bounded."""

    async def read() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=str(client.base_url), headers=AUTH) as ac:
            async with ac.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}, timeout=60
            ) as s:
                return await collect_until(s, stop)

    return trio.run(read)


def new_session(client: httpx.Client) -> str:
    r = client.post("/session", json={"sessionScope": "thread"})
    assert r.status_code == 200, r.text
    return str(r.json()["sessionId"])


def agent_pid(client: httpx.Client, sid: str) -> int | None:
    """The session's agent child as the daemon sees it (the pid the agent itself sees is 2
    in its own pid namespace: serve/isolation/pidns.py)."""
    body = client.get("/daemon/status", params={"detail": "full"}).json()
    session = next(s for s in body["full"]["sessions"] if s["sessionId"] == sid)
    return session["agentPid"]  # type: ignore[no-any-return]


def status(client: httpx.Client) -> dict[str, Any]:
    return dict(client.get("/daemon/status").json()["isolation"])


@pytest.fixture
def cleanup() -> Iterator[list[DaemonProcess]]:
    daemons: list[DaemonProcess] = []
    yield daemons
    for d in daemons:
        if d.proc.poll() is None:
            d.stop()


def test_a_memory_hog_is_killed_at_its_cap_named_and_restored(
    cleanup: list[DaemonProcess],
) -> None:
    daemon = hostile_daemon("--agent-memory-max-mb", "64")
    cleanup.append(daemon)
    with httpx.Client(base_url=daemon.url, headers=AUTH, timeout=60) as client:
        quiet = new_session(client)
        hog = new_session(client)
        iso = status(client)
        assert iso["backend"] == "cgroup-v1"
        assert iso["limits"]["memoryMaxBytes"] == 64 * MIB and iso["limits"]["pidsMax"] == 4096
        assert len(iso["children"]) == 2
        hog_pid = agent_pid(client, hog)

        r = prompt(client, hog, "alloc 200")
        assert r.status_code != 200
        assert r.json()["code"] == "agent_oom", r.text
        events = stream(client, hog, lambda e: e["type"] == "session_restarted")
        oom = next(e for e in events if e["type"] == "agent_oom")["data"]
        assert oom["backend"] == "cgroup-v1" and oom["scope"] == "agent"
        assert oom["limitMb"] == 64 and oom["peakBytes"] >= 60 * MIB
        error = next(e for e in events if e["type"] == "turn_error")["data"]
        assert error["code"] == "agent_oom" and "64 MiB" in error["message"]
        assert events[-1]["data"]["reason"] == "agent_oom"

        # Restored in place: the same session answers from a new child; the quiet one never
        # noticed.
        assert reply_text(client, hog, "pid")  # answers
        assert agent_pid(client, hog) not in (hog_pid, None)
        assert reply_text(client, quiet, "still there") == "ok still there"
        quiet_events = stream(client, quiet, lambda e: e["type"] == "turn_complete")
        assert not any(e["type"] in ("agent_oom", "session_restarted") for e in quiet_events)
        assert "agent_oom" not in [e["type"] for e in quiet_events]
        assert status(client)["agentOomTotal"] == 1
        metrics = client.get("/metrics").text
        assert "acp_serve_agent_oom_total 1.0" in metrics
        assert metrics.count("acp_serve_agent_memory_bytes{") == 2
        mine = status_groups(status(client))
    assert sorted(mine) == sorted(groups_of(daemon.proc.pid))
    assert len(mine) == 3  # memory, pids, cpu
    daemon.stop()
    assert not any(g.exists() for g in mine)


def test_an_oom_hog_that_keeps_hitting_its_cap_dies_with_reason_agent_oom(
    cleanup: list[DaemonProcess], tmp_path: Path
) -> None:
    config = tmp_path / "daemon.yaml"
    config.write_text("restart:\n  session:\n    intensity: 1\n")
    daemon = hostile_daemon("--agent-memory-max-mb", "48", "--config", str(config))
    cleanup.append(daemon)
    with httpx.Client(base_url=daemon.url, headers=AUTH, timeout=60) as client:
        hog = new_session(client)
        assert prompt(client, hog, "alloc 200").json()["code"] == "agent_oom"
        stream(client, hog, lambda e: e["type"] == "session_restarted")

    async def second_oom() -> tuple[httpx.Response, list[dict[str, Any]]]:
        # The stream is open before the prompt: a dead session's stream is gone after.
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=60) as ac:
            async with ac.stream(
                "GET", f"/session/{hog}/events", headers={"Last-Event-ID": "0"}
            ) as s:
                body = {"prompt": [{"type": "text", "text": "alloc 200"}]}
                r = await ac.post(f"/session/{hog}/prompt", json=body)
                return r, await collect_until(s, lambda e: e["type"] == "session_died")

    r, events = trio.run(second_oom)
    assert r.json()["code"] == "agent_oom", r.text
    assert events[-1]["data"]["reason"] == "agent_oom"
    assert [e["type"] for e in events].count("agent_oom") == 2
    # The journal has it too (the session's durable record).
    journal = daemon.state_dir / "journal"
    assert any(b"agent_oom" in f.read_bytes() for f in journal.rglob("*") if f.is_file())


def test_a_fork_bomb_stops_at_its_pids_cap_and_the_daemon_still_spawns(
    cleanup: list[DaemonProcess],
) -> None:
    daemon = hostile_daemon("--agent-pids-max", "16")
    cleanup.append(daemon)
    with httpx.Client(base_url=daemon.url, headers=AUTH, timeout=60) as client:
        quiet = new_session(client)
        bomb = new_session(client)
        words = reply_text(client, bomb, "fork 200").split()
        forked, failed = int(words[1]), int(words[3])
        assert forked < 16 and failed > 0 and forked + failed == 200
        assert reply_text(client, quiet, "hello") == "ok hello"
        # The kernel's cap is per child: a new session's child starts fine.
        assert reply_text(client, new_session(client), "fresh") == "ok fresh"


def test_a_spinning_agent_gets_its_cpu_weight_and_the_quiet_session_answers(
    cleanup: list[DaemonProcess],
) -> None:
    daemon = hostile_daemon("--agent-cpu-weight", "50")
    cleanup.append(daemon)
    with httpx.Client(base_url=daemon.url, headers=AUTH, timeout=60) as client:
        quiet = new_session(client)
        spinner = new_session(client)
        r = client.post(
            f"/session/{spinner}/prompt",
            json={"prompt": [{"type": "text", "text": "spin 3"}]},
            headers={"Prefer": "respond-async"},
        )
        assert r.status_code == 202
        parent = Path(status(client)["groups"]["paths"]["cpu"])
        for child in status(client)["children"]:
            shares = parent / child["name"]
            assert (shares / "cpu.shares").read_text().strip() == "512"
        assert reply_text(client, quiet, "beside a spinner") == "ok beside a spinner"


def test_the_watchdog_backend_kills_a_tree_over_its_cap(cleanup: list[DaemonProcess]) -> None:
    daemon = hostile_daemon("--agent-limits", "watchdog", "--agent-memory-max-mb", "64")
    cleanup.append(daemon)
    with httpx.Client(base_url=daemon.url, headers=AUTH, timeout=60) as client:
        quiet = new_session(client)
        hog = new_session(client)
        iso = status(client)
        assert iso["backend"] == "watchdog" and "--agent-limits watchdog" in iso["reason"]
        assert iso["limits"]["pidsMax"] is None  # (the kernel's only)
        # The memory is a grandchild's (a tool): the whole tree is measured and killed.
        # Held 5 s at its peak: longer than the watchdog's 0.5 s sampling under any load.
        r = prompt(client, hog, "alloc-child 300 5")
        assert r.json()["code"] == "agent_oom", r.text
        events = stream(client, hog, lambda e: e["type"] == "session_restarted")
        oom = next(e for e in events if e["type"] == "agent_oom")["data"]
        assert oom["backend"] == "watchdog" and oom["scope"] == "agent"
        assert oom["peakBytes"] > 64 * MIB
        assert reply_text(client, quiet, "ok?") == "ok ok?"
        assert "groups" not in status(client)
    assert groups_of(daemon.proc.pid) == []  # the watchdog makes no cgroup


def test_a_daemon_in_a_memory_limited_cgroup_keeps_its_agents_below_it(
    cleanup: list[DaemonProcess],
) -> None:
    """The pod's container, stood in for by a v1 memory cgroup of 512 MiB that the daemon
    is started in: the agents' ceiling (512 - 128 MiB headroom) fires, never the
    container's limit; the daemon keeps serving."""
    container = own_dir("memory") / f"h6-container-{uuid.uuid4().hex[:8]}"
    container.mkdir()
    try:
        (container / "memory.limit_in_bytes").write_text(str(512 * MIB))
        (container / "memory.memsw.limit_in_bytes").write_text(str(512 * MIB))
        procs = container / "cgroup.procs"
        launcher = (
            "-c",
            f"import os, sys; open({str(procs)!r}, 'w').write(str(os.getpid())); "
            "from serve.__main__ import main; sys.exit(main(sys.argv[1:]))",
        )
        daemon = hostile_daemon(
            "--agent-memory-max-mb",
            "1024",
            "--agent-memory-headroom-mb",
            "128",
            launcher=launcher,
        )
        cleanup.append(daemon)
        with httpx.Client(base_url=daemon.url, headers=AUTH, timeout=60) as client:
            iso = status(client)
            assert iso["ceiling"]["daemonLimitBytes"] == 512 * MIB
            assert iso["ceiling"]["memoryMaxBytes"] == 384 * MIB
            quiet = new_session(client)
            hog = new_session(client)
            r = prompt(client, hog, "alloc 700")
            assert r.json()["code"] == "agent_oom", r.text
            events = stream(client, hog, lambda e: e["type"] == "agent_oom")
            assert events[-1]["data"]["scope"] == "ceiling"
            assert events[-1]["data"]["limitBytes"] == 384 * MIB
            assert client.get("/health").status_code == 200
            assert reply_text(client, quiet, "alive") == "ok alive"
            # The container's own limit never fired: its usage stayed below it.
            peak = int((container / "memory.max_usage_in_bytes").read_text())
            assert peak < 512 * MIB
            parent = Path(status(client)["groups"]["paths"]["memory"])
        assert parent.parent == container and parent.exists()
        daemon.stop()
        assert not parent.exists()
    finally:
        for _ in range(100):
            try:
                container.rmdir()
                break
            except OSError:
                time.sleep(0.05)


def test_a_crashed_daemons_cgroups_are_removed_at_the_next_start(
    cleanup: list[DaemonProcess],
) -> None:
    # Both daemons in a cgroup of the test's own: a daemon of another test run on this
    # host cannot remove the crashed one's groups before the second one does.
    with private_base() as base:
        first = hostile_daemon("--warm-agents", "1", launcher=base.launcher())
        cleanup.append(first)
        with httpx.Client(base_url=first.url, headers=AUTH, timeout=60) as client:
            new_session(client)
            crashed = status_groups(status(client))
        assert len(crashed) == 3
        os.killpg(first.proc.pid, signal.SIGKILL)  # the daemon and anything of its group
        first.proc.wait()
        second = hostile_daemon(launcher=base.launcher())
        cleanup.append(second)
        with httpx.Client(base_url=second.url, headers=AUTH, timeout=60) as client:
            iso = status(client)
            assert iso["backend"] == "cgroup-v1"
            mine = status_groups(iso)
        # Its agents got stdin EOF and the second daemon's start removed what was left.
        assert not any(g.exists() for g in crashed)
        removed = {e["path"]: e["why"] for e in iso["groups"]["removedAtStart"]}
        assert all(removed[str(g)] == "its owner is gone (its lock was free)" for g in crashed)
        second.stop()
        assert not any(g.exists() for g in mine)


def test_every_session_on_a_shared_child_killed_for_memory_gets_agent_oom(
    cleanup: list[DaemonProcess],
) -> None:
    daemon = hostile_daemon("--agent-memory-max-mb", "64", "--sessions-per-agent", "2")
    cleanup.append(daemon)
    with httpx.Client(base_url=daemon.url, headers=AUTH, timeout=60) as client:
        first = new_session(client)
        second = new_session(client)
        assert len(status(client)["children"]) == 1  # both on one child
        assert prompt(client, first, "alloc 200").json()["code"] == "agent_oom"
        for sid in (first, second):
            events = stream(client, sid, lambda e: e["type"] == "session_restarted")
            oom = [e["data"] for e in events if e["type"] == "agent_oom"]
            assert len(oom) == 1 and oom[0]["limitMb"] == 64
        assert reply_text(client, second, "after") == "ok after"
        assert status(client)["agentOomTotal"] == 1  # one child killed, named once
