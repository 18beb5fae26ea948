"""Memory budget (issue 17, item 4): --agent-memory-budget-mb over the children's PSS.

The pool measures each child's process tree (PSS from /proc/<pid>/smaps_rollup); a new
child that would pass the budget first makes the least recently used idle session let its
agent go; when nothing can be released the create (or a released session's prompt) answers
503 memory_budget_exceeded with Retry-After. Per-child memory in /daemon/status and
/metrics. Real daemons, real scripted-agent children; waits are bounded polls.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx
import trio

from serve.agents.memory import measure_trees
from tests.conftest import AUTH, TOKEN
from tests.support.daemon import spawn_daemon
from tests.support.sse import collect_until

POLLS = 600  # x 0.05 s


def text(prompt: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": prompt}]}


async def pool_until(
    client: httpx.AsyncClient, check: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    pool: dict[str, Any] = {}
    for _ in range(POLLS):
        pool = (await client.get("/daemon/status")).json()["runtime"]["agents"][0]
        if check(pool):
            return pool
        await trio.sleep(0.05)
    raise AssertionError(f"pool never reached the state; last: {pool}")


def all_measured(n: int) -> Callable[[dict[str, Any]], bool]:
    def check(pool: dict[str, Any]) -> bool:
        live = [c for c in pool["children"] if c["state"] != "stopping"]
        return len(live) == n and all(c["pssKiB"] for c in live)

    return check


async def create(client: httpx.AsyncClient) -> httpx.Response:
    return await client.post("/session", json={"sessionScope": "thread"})


def test_measure_trees_sums_a_process_tree() -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"])
    kids: list[int] = []
    try:
        for _ in range(POLLS):  # until both sleeps are forked
            kids = [
                int(e) for e in os.listdir("/proc") if e.isdigit() and _ppid(int(e)) == proc.pid
            ]
            if len(kids) == 2:
                break
            time.sleep(0.05)
        assert len(kids) == 2
        whole = measure_trees([proc.pid])[proc.pid]
        alone = measure_trees(kids)
        assert all(kib > 0 for kib in alone.values())
        assert whole > sum(alone.values())  # the shell's own PSS plus both children's
        assert measure_trees([]) == {}
    finally:
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()
        proc.wait()


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


async def child_kib() -> int:
    """What one scripted-agent child measures here (to size a budget for two)."""
    probe = spawn_daemon(["--warm-agents", "1"], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        async with httpx.AsyncClient(base_url=probe.url, headers=AUTH, timeout=30) as client:
            pool = await pool_until(client, all_measured(1))
            return int(pool["children"][0]["pssKiB"])
    finally:
        probe.stop()


async def test_the_budget_releases_the_lru_idle_session_then_refuses_with_503() -> None:
    budget_mb = math.ceil(2.5 * await child_kib() / 1024)
    daemon = spawn_daemon(
        [
            "--agent-memory-budget-mb",
            str(budget_mb),
            "--warm-agents",
            "0",
            "--agent-idle-release-ms",
            "0",
        ],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            first = (await create(client)).json()["sessionId"]
            await pool_until(client, all_measured(1))
            second = (await create(client)).json()["sessionId"]
            await pool_until(client, all_measured(2))

            # A third child would pass the budget: the least recently used idle session
            # (the first) lets its agent go, and the create succeeds.
            third = await create(client)
            assert third.status_code == 200, third.text
            async with client.stream(
                "GET", f"/session/{first}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                events = await collect_until(stream, lambda e: e["type"] == "agent_released")
            assert events[-1]["data"]["reason"] == "memory_budget"
            pool = await pool_until(client, all_measured(2))
            assert pool["memoryBudgetMb"] == budget_mb and pool["budgetReleases"] == 1
            assert pool["memoryUsedKiB"] == sum(c["pssKiB"] for c in pool["children"])

            # Now nobody is idle: both live sessions run a prompt.
            for sid in (second, third.json()["sessionId"]):
                busy = await client.post(
                    f"/session/{sid}/prompt",
                    json=text("[sleep 30000]"),
                    headers={"Prefer": "respond-async"},
                )
                assert busy.status_code == 202
            refused = await create(client)
            assert refused.status_code == 503, refused.text
            assert refused.json()["code"] == "memory_budget_exceeded"
            assert refused.json()["budgetMb"] == budget_mb
            assert refused.headers["retry-after"] == "10"
            # The released session's next prompt is refused the same way, and it stays.
            again = await client.post(f"/session/{first}/prompt", json=text("wake up"))
            assert again.status_code == 503 and again.json()["code"] == "memory_budget_exceeded"
            body = (await client.get("/daemon/status", params={"detail": "full"})).json()
            assert first in [s["sessionId"] for s in body["full"]["sessions"]]

            metrics = (await client.get("/metrics")).text
            series = [
                line
                for line in metrics.splitlines()
                if line.startswith("acp_serve_agent_pss_bytes{")
            ]
            assert len(series) == 2 and all(float(line.split()[-1]) > 0 for line in series)
    finally:
        daemon.stop()


async def test_the_budget_holds_for_children_spawned_before_the_first_sample() -> None:
    """Six creates at once, before any child was measured: the budget still holds (the
    first child's cost is measured before more are admitted)."""
    import shlex
    import sys

    from tests.support.daemon import ROOT

    # Sessions that can never be released: only refusal keeps the budget.
    agent = shlex.join(
        [sys.executable, str(ROOT / "tests" / "serve" / "flaky_agent.py"), "--no-restore"]
    )
    budget_mb = math.ceil(2.5 * await child_kib() / 1024)
    daemon = spawn_daemon(
        ["--agent", agent, "--agent-memory-budget-mb", str(budget_mb), "--warm-agents", "0"],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=60) as client:
            replies: list[httpx.Response] = []

            async def one() -> None:
                replies.append(await create(client))

            async with trio.open_nursery() as nursery:
                for _ in range(6):
                    nursery.start_soon(one)
            codes = sorted(r.status_code for r in replies)
            assert 200 in codes, [r.text for r in replies]
            refused = [r for r in replies if r.status_code != 200]
            assert refused and all(
                r.status_code == 503 and r.json()["code"] == "memory_budget_exceeded"
                for r in refused
            ), [r.text for r in refused]
            pool = await pool_until(client, all_measured(codes.count(200)))
            assert pool["memoryUsedKiB"] <= budget_mb * 1024, pool
    finally:
        daemon.stop()
