"""The agent pool (issue 17): warm children, refill, backoff, a failing command, drain.

Real daemon, real scripted-agent children, SIGKILL from the test; no timed assertions
(waits poll /daemon/status with a generous bound and assert on what it reports).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import trio

from serve.settings import SettingsError, parse_settings
from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, spawn_daemon

POLLS = 600  # x 0.05 s: a generous bound for a loaded machine


async def status(client: httpx.AsyncClient) -> dict[str, Any]:
    body = (await client.get("/daemon/status", params={"detail": "full"})).json()
    return body  # type: ignore[no-any-return]


async def pool_until(
    client: httpx.AsyncClient, check: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Poll the primary workspace's pool status until ``check`` holds (or fail)."""
    pool: dict[str, Any] = {}
    for _ in range(POLLS):
        pool = (await status(client))["runtime"]["agents"][0]
        if check(pool):
            return pool
        await trio.sleep(0.05)
    raise AssertionError(f"pool never reached the state; last: {pool}")


def warm_pids(pool: dict[str, Any]) -> list[int]:
    return [c["pid"] for c in pool["children"] if c["state"] == "warm"]


def children_of(parent: int) -> set[int]:
    out: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            out.add(int(entry))
    return out


def environ_of(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        raw = f.read()
    pairs = [item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item]
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def pool_daemon() -> Any:
    d = spawn_daemon(env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        yield d
    finally:
        d.stop()


async def test_a_warm_child_waits_ready_and_a_session_takes_it(pool_daemon: DaemonProcess) -> None:
    async with httpx.AsyncClient(base_url=pool_daemon.url, headers=AUTH, timeout=30) as client:
        pool = await pool_until(client, lambda p: len(warm_pids(p)) == 1)
        assert pool["warmTarget"] == 1 and pool["sessionsPerAgent"] == 1
        (warm,) = warm_pids(pool)
        # A real, initialized child of the daemon, with a session child's cwd and env...
        assert warm in children_of(pool_daemon.proc.pid)
        assert os.readlink(f"/proc/{warm}/cwd") == str(pool_daemon.workspace)
        env = environ_of(warm)
        assert env["QWEN_CODE_NO_RELAUNCH"] == "true"
        assert env["ACP_SCRIPTED_STATE_DIR"] == str(pool_daemon.state_dir / "scripted")
        assert "QWEN_SERVER_TOKEN" not in env
        # ... that is not a session.
        body = await status(client)
        assert body["runtime"]["sessions"]["active"] == 0

        created = await client.post("/session", json={"sessionScope": "thread"})
        assert created.status_code == 200, created.text
        sid = created.json()["sessionId"]
        body = await status(client)
        session = next(s for s in body["full"]["sessions"] if s["sessionId"] == sid)
        assert session["agentPid"] == warm  # the warm child, only session/new was left
        reply = await client.post(
            f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "hi"}]}
        )
        assert reply.status_code == 200 and reply.json()["stopReason"] == "end_turn"

        # The pool refills in the background with a fresh child.
        pool = await pool_until(
            client, lambda p: len(warm_pids(p)) == 1 and warm not in warm_pids(p)
        )
        assert pool["spawnedTotal"] == 2
        assert any(c["pid"] == warm and c["sessions"] == 1 for c in pool["children"])

        # Closing the session stops its child; the warm one stays.
        assert (await client.delete(f"/session/{sid}")).status_code == 204
        pool = await pool_until(client, lambda p: all(c["pid"] != warm for c in p["children"]))
        assert not alive(warm)
        assert len(warm_pids(pool)) == 1


async def test_a_killed_warm_child_is_replaced_and_drain_stops_it() -> None:
    daemon = spawn_daemon(env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            (first,) = warm_pids(await pool_until(client, lambda p: len(warm_pids(p)) == 1))
            os.killpg(first, signal.SIGKILL)
            pool = await pool_until(
                client, lambda p: len(warm_pids(p)) == 1 and first not in warm_pids(p)
            )
            assert pool["exitedTotal"] == 1
            assert "signal 9" in pool["lastError"]
            (second,) = warm_pids(pool)
            # Reset once the replacement has stayed up a while (a stable start).
            pool = await pool_until(client, lambda p: p["consecutiveFailures"] == 0)
            assert not pool["failing"] and warm_pids(pool) == [second]
            assert (await client.get("/readyz")).status_code == 200
        assert daemon.stop() == 0
        assert not alive(second)  # drain stopped the warm child
    finally:
        daemon.stop()


async def test_a_failing_agent_command_is_reported_not_respawned_forever() -> None:
    daemon = spawn_daemon(
        ["--agent", "sh -c 'echo broken agent >&2; exit 3'"],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            pool = await pool_until(client, lambda p: p["failing"])
            assert pool["consecutiveFailures"] == 3
            assert pool["children"] == [] and pool["spawning"] == 0
            body = await status(client)
            issue = next(i for i in body["issues"] if i["code"] == "agent_command_failing")
            assert issue["severity"] == "error" and body["status"] == "error"
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["reason"] == "agent_unavailable"
            assert ready.json()["agentsFailing"] == [str(daemon.workspace)]
            # A create still tries at once and answers with the agent's failure: the same
            # command exited again, so it is not retryable (no Retry-After).
            before = (await status(client))["runtime"]["agents"][0]["consecutiveFailures"]
            created = await client.post("/session", json={"sessionScope": "thread"})
            assert created.status_code == 503, created.text
            refused = created.json()
            assert refused["code"] == "acp_channel_unavailable"
            assert refused["retryable"] is False and "retry-after" not in created.headers
            assert refused["consecutiveFailures"] > before
            assert "broken agent" in refused["error"]  # the agent's own words
            pool = (await status(client))["runtime"]["agents"][0]
            assert pool["consecutiveFailures"] > before
            # The refill goes on probing, one child at a time, with a growing backoff.
            pool = await pool_until(client, lambda p: p["consecutiveFailures"] >= before + 2)
            assert pool["failing"] and pool["spawning"] <= 1
            assert body["runtime"]["sessions"]["active"] == 0
    finally:
        daemon.stop()


async def test_without_warm_agents_no_child_runs_before_a_session() -> None:
    daemon = spawn_daemon(["--warm-agents", "0"], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            pool = (await status(client))["runtime"]["agents"][0]
            assert pool["warmTarget"] == 0 and pool["children"] == []
            assert children_of(daemon.proc.pid) == set()
            created = await client.post("/session", json={"sessionScope": "thread"})
            assert created.status_code == 200
            pool = (await status(client))["runtime"]["agents"][0]
            assert [c["sessions"] for c in pool["children"]] == [1]
    finally:
        daemon.stop()


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--warm-agents", "-1"), ("--warm-agents", "x"), ("--sessions-per-agent", "0")],
)
def test_pool_flags_are_validated(flag: str, value: str) -> None:
    with pytest.raises(SettingsError, match=flag):
        parse_settings([flag, value], env={})


def flaky_agent(*flags: str) -> str:
    """The scripted agent behind tests/serve/flaky_agent.py's failure switches."""
    import shlex
    import sys

    from tests.support.daemon import ROOT

    return shlex.join([sys.executable, str(ROOT / "tests" / "serve" / "flaky_agent.py"), *flags])


async def ready_until(client: httpx.AsyncClient, status_code: int, polls: int = POLLS) -> Any:
    reply = None
    for _ in range(polls):
        reply = await client.get("/readyz")
        if reply.status_code == status_code:
            return reply
        await trio.sleep(0.1)
    raise AssertionError(f"/readyz never answered {status_code}; last: {reply and reply.text}")


async def test_the_pool_keeps_probing_a_failing_agent_and_is_ready_again_when_it_works(
    tmp_path: Any,
) -> None:
    down = tmp_path / "down"
    down.touch()  # an agent outage from the start
    daemon = spawn_daemon(
        ["--agent", flaky_agent("--down", str(down))], env={"QWEN_SERVER_TOKEN": TOKEN}
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            await pool_until(client, lambda p: p["failing"])
            assert (await ready_until(client, 503)).json()["reason"] == "agent_unavailable"
            down.unlink()  # the agent works again; no session create comes (no traffic)
            await ready_until(client, 200)
            pool = await pool_until(client, lambda p: len(warm_pids(p)) == 1)
            assert not pool["failing"] and pool["consecutiveFailures"] == 0
    finally:
        daemon.stop()


async def test_an_agent_that_dies_soon_after_initialize_is_failing_not_a_respawn_storm() -> None:
    daemon = spawn_daemon(
        ["--agent", flaky_agent("--die-after", "1")], env={"QWEN_SERVER_TOKEN": TOKEN}
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            pool = await pool_until(client, lambda p: p["failing"])
            assert "exited" in pool["lastError"]
            assert (await ready_until(client, 503)).json()["reason"] == "agent_unavailable"
    finally:
        daemon.stop()


async def test_a_secondary_workspace_failing_is_reported_but_the_daemon_stays_ready(
    tmp_path: Any,
) -> None:
    second = tmp_path / "second"
    second.mkdir()
    (second / ".agent-down").touch()  # the agent fails only in the second workspace
    daemon = spawn_daemon(
        ["--workspace", str(second), "--agent", flaky_agent("--down", ".agent-down")],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            for _ in range(POLLS):
                pools = (await status(client))["runtime"]["agents"]
                if pools[1]["failing"]:
                    break
                await trio.sleep(0.05)
            assert pools[1]["failing"] and not pools[0]["failing"]
            ready = await client.get("/readyz")
            assert ready.status_code == 200, ready.text
            assert ready.json()["agentsFailing"] == [str(second.resolve())]
            body = await status(client)
            issue = next(i for i in body["issues"] if i["code"] == "agent_command_failing")
            assert str(second.resolve()) in issue["message"]
    finally:
        daemon.stop()


async def test_packed_mode_spawns_no_spare_while_a_child_being_spawned_will_have_room() -> None:
    # A slow start: the creates arrive while the warm child is still being spawned.
    daemon = spawn_daemon(
        [
            "--agent",
            flaky_agent("--start-delay", "1"),
            "--warm-agents",
            "1",
            "--sessions-per-agent",
            "12",
        ],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            replies: list[httpx.Response] = []

            async def one() -> None:
                replies.append(await client.post("/session", json={"sessionScope": "thread"}))

            async with trio.open_nursery() as nursery:
                for _ in range(6):
                    nursery.start_soon(one)
            assert [r.status_code for r in replies] == [200] * 6
            # The one child has 6 free slots: that is the warm capacity, no spare child.
            pool = (await status(client))["runtime"]["agents"][0]
            assert pool["spawning"] == 0 and pool["spawnedTotal"] == 1, pool
            assert [(c["state"], c["sessions"]) for c in pool["children"]] == [("shared", 6)]
    finally:
        daemon.stop()


@pytest.mark.parametrize("packed_spare", [False, True])
async def test_a_full_packed_child_gets_a_spare_only_with_packed_spare(packed_spare: bool) -> None:
    flags = ["--sessions-per-agent", "2", *(["--packed-spare"] if packed_spare else [])]
    daemon = spawn_daemon(flags, env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            # No child yet: the first is kept ahead either way (the first create is warm).
            pool = await pool_until(client, lambda p: len(warm_pids(p)) == 1)
            assert pool["packedSpare"] is packed_spare
            for _ in range(2):
                reply = await client.post("/session", json={"sessionScope": "thread"})
                assert reply.status_code == 200, reply.text
            if packed_spare:  # the full child's spare: a second, idle child
                pool = await pool_until(client, lambda p: len(warm_pids(p)) == 1)
                assert [c["state"] for c in pool["children"]] == ["full", "warm"]
                return
            # Wait as long as a spare takes to appear with the flag; then none is there.
            with trio.move_on_after(1.5):
                await pool_until(client, lambda p: p["spawnedTotal"] > 1)
            pool = (await status(client))["runtime"]["agents"][0]
            assert pool["spawnedTotal"] == 1 and pool["spawning"] == 0, pool
            assert [c["state"] for c in pool["children"]] == ["full"]
            # The next create starts the next child itself, and gets a session on it.
            reply = await client.post("/session", json={"sessionScope": "thread"})
            assert reply.status_code == 200, reply.text
            pool = (await status(client))["runtime"]["agents"][0]
            assert sorted(c["state"] for c in pool["children"]) == ["full", "shared"], pool
    finally:
        daemon.stop()
