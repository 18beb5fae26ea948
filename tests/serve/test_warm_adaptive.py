"""The adaptive warm pool and refill priority (issue 26 items 2 and 3), end to end.

Real daemon, real scripted-agent children; waits poll /daemon/status with a generous bound
and assert on what it reports (no timed assertions).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest
import trio

from serve.agents import adaptive
from tests.conftest import AUTH, TOKEN
from tests.serve.test_agent_pool import pool_until, status, warm_pids
from tests.support.daemon import spawn_daemon

CG = Path("/sys/fs/cgroup")


async def test_a_burst_of_creates_grows_the_warm_pool_and_it_shrinks_back_when_they_stop() -> None:
    # An agent whose start takes at least 0.5 s: with four arrivals, whatever their pace,
    # rate x spawn time stays above 1, so the pool wants its maximum on any machine (the
    # scripted agent alone starts in ~0.2 s on a quiet one, which wanted only 2).
    slow_start = f"sh -c 'sleep 0.5; exec {sys.executable} -m acp.agents.scripted'"
    daemon = spawn_daemon(
        ["--warm-agents", "1", "--warm-agents-max", "3", "--agent", slow_start],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=60) as client:
            pool = await pool_until(client, lambda p: len(warm_pids(p)) == 1)
            assert pool["warmTarget"] == 1 and pool["warmMax"] == 3
            sids = []
            for _ in range(4):  # arrivals faster than a spawn: the pool keeps more spares
                created = await client.post("/session", json={"sessionScope": "thread"})
                assert created.status_code == 200, created.text
                sids.append(created.json()["sessionId"])
            pool = await pool_until(client, lambda p: len(warm_pids(p)) == 3)
            assert pool["warmWanted"] == 3 and pool["warmTarget"] == 1
            # Each session still has its own child (isolation), none of them a spare.
            body = await status(client)
            pids = {s["agentPid"] for s in body["full"]["sessions"] if s["sessionId"] in sids}
            assert len(pids) == 4 and not pids & set(warm_pids(pool))
            # No more arrivals: back to the minimum once they leave the window.
            for _ in range(int(adaptive.WINDOW_S * 2 / 0.25)):
                pool = (await status(client))["runtime"]["agents"][0]
                if len(warm_pids(pool)) == 1 and pool["spawning"] == 0:
                    break
                await trio.sleep(0.25)
            assert len(warm_pids(pool)) == 1 and pool["warmWanted"] == 1, pool
            # The live sessions were not touched by the shrink.
            body = await status(client)
            assert {s["agentPid"] for s in body["full"]["sessions"]} == pids
    finally:
        daemon.stop()


def test_the_maximum_flag_is_validated() -> None:
    from serve.settings import SettingsError, parse_settings

    assert parse_settings([], {}).warm_agents_max == 4
    for bad in ("-1", "65", "x"):
        with pytest.raises(SettingsError, match="--warm-agents-max"):
            parse_settings(["--warm-agents-max", bad], {})
    # At or below --warm-agents: a fixed pool (accepted, not adaptive).
    settings = parse_settings(["--warm-agents", "2", "--warm-agents-max", "1"], {})
    assert settings.warm_agents == 2 and settings.warm_agents_max == 1


def cgroup_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


def cpu_shares_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if "cpu" in names.split(","):
            return int((CG / "cpu" / path.lstrip("/") / "cpu.shares").read_text())
    raise AssertionError(f"pid {pid} has no cpu cgroup")


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(CG / "cpu", os.W_OK),
    reason="needs root and a writable cgroup v1 cpu hierarchy",
)
async def test_a_warm_spare_runs_at_the_refill_weight_until_a_session_takes_it() -> None:
    daemon = spawn_daemon(
        ["--warm-agents", "1", "--warm-agents-max", "1", "--agent-limits", "cgroup"],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=60) as client:
            pool = await pool_until(client, lambda p: len(warm_pids(p)) == 1)
            (spare,) = warm_pids(pool)
            assert cpu_shares_of(spare) == 10  # weight 1 (of 100) in v1 shares
            assert pool["lowPriority"] == 1
            created = await client.post("/session", json={"sessionScope": "thread"})
            assert created.status_code == 200, created.text
            # Taken: the session's agent runs at --agent-cpu-weight (100: 1024 shares).
            assert cpu_shares_of(spare) == 1024
            reply = await client.post(
                f"/session/{created.json()['sessionId']}/prompt",
                json={"prompt": [{"type": "text", "text": "hi"}]},
            )
            assert reply.status_code == 200
            # Its replacement is a refill again: lowered.
            pool = await pool_until(
                client, lambda p: len(warm_pids(p)) == 1 and spare not in warm_pids(p)
            )
            (refill,) = warm_pids(pool)
            assert cpu_shares_of(refill) == 10 and cpu_shares_of(spare) == 1024
    finally:
        daemon.stop()


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(CG / "cpu", os.W_OK),
    reason="needs root and a writable cgroup v1 cpu hierarchy",
)
async def test_a_session_that_waits_for_a_refill_in_flight_raises_it_at_once() -> None:
    # A slow refill: a create that arrives while it starts waits for it, so the rest of
    # its start must not run at the refill weight.
    from tests.serve.test_agent_pool import children_of, flaky_agent

    daemon = spawn_daemon(
        [
            "--agent",
            flaky_agent("--start-delay", "3"),
            "--warm-agents",
            "1",
            "--warm-agents-max",
            "1",
            "--agent-limits",
            "cgroup",
        ],
        env={"QWEN_SERVER_TOKEN": TOKEN},
        ready_timeout_s=60,
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=60) as client:
            await pool_until(client, lambda p: p["spawning"] == 1 and p["lowPriority"] == 1)
            (starting,) = children_of(daemon.proc.pid)
            for _ in range(600):  # (the confinement trampoline joins the cgroups, then execs)
                if "acp-serve." in cgroup_of(starting):
                    break
                await trio.sleep(0.01)
            assert cpu_shares_of(starting) == 10
            replies: list[httpx.Response] = []

            async def create() -> None:
                replies.append(await client.post("/session", json={"sessionScope": "thread"}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(create)
                await pool_until(client, lambda p: p["waiting"] == 1)
                # Still starting (it sleeps 3 s), already at the normal weight.
                assert not replies and cpu_shares_of(starting) == 1024
            assert replies[0].status_code == 200, replies[0].text
            body = await status(client)
            (session,) = body["full"]["sessions"]
            assert session["agentPid"] == starting
    finally:
        daemon.stop()
