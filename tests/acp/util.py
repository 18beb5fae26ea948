"""Small helpers shared by the ACP tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import trio

from acp import AgentConnection


async def eventually(predicate: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Wait until ``predicate()`` is true (a safety deadline, not a timed assertion)."""
    with trio.fail_after(timeout_s):
        while not predicate():  # noqa: ASYNC110 - polling state written by another task
            await trio.sleep(0.005)


def pending_calls(conn: AgentConnection) -> int:
    """Requests ``conn`` sent (queued in order) and is still waiting on."""
    stats = conn.statistics()
    return 0 if stats is None else stats.pending_calls


def scripted_argv(state_dir: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "acp.agents.scripted", "--state-dir", state_dir, *extra]


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] != b"Z"


def env_without(*names: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in names}
