"""``run_shell``: real ``/bin/sh`` processes, their groups, bounded output, timeout, cancel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from acp.process import live_group_members
from serve.workspaces.state.shell_run import run_shell, signal_name


async def group_gone(pgid: int) -> bool:
    """Wait (bounded) until no live process is left in group ``pgid``."""
    with trio.move_on_after(10):
        while live_group_members(pgid):  # noqa: ASYNC110 - polling /proc is the only way
            await trio.sleep(0.02)
        return True
    return False


async def test_exit_code_merged_output_and_streamed_chunks(tmp_path: Path) -> None:
    chunks: list[str] = []
    outcome = await run_shell(
        "echo out; echo err >&2; printf 'caf\\303\\251 %s' \"$FOO\"; exit 3",
        cwd=str(tmp_path),
        env={**os.environ, "FOO": "bar"},
        on_output=chunks.append,
    )
    assert outcome.exit_code == 3 and outcome.signal is None
    assert not outcome.aborted and not outcome.timed_out and not outcome.truncated
    assert outcome.output == "out\nerr\ncafé bar"
    assert "".join(chunks) == outcome.output


async def test_runs_in_cwd_with_stdin_closed(tmp_path: Path) -> None:
    outcome = await run_shell("pwd; cat; echo done", cwd=str(tmp_path), env=os.environ)
    assert outcome.output == f"{tmp_path}\ndone\n"
    assert outcome.exit_code == 0


async def test_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    outcome = await run_shell(
        "echo $$; sleep 30 & sleep 30", cwd=str(tmp_path), env=os.environ, timeout_s=0.5
    )
    pgid = int(outcome.output.split()[0])
    assert outcome.timed_out and outcome.aborted
    assert outcome.exit_code is None and outcome.signal == "SIGKILL"
    assert await group_gone(pgid)


async def test_background_jobs_do_not_outlive_the_command(tmp_path: Path) -> None:
    outcome = await run_shell(
        "echo $$; sleep 30 > /dev/null 2>&1 & sleep 30 & echo started",
        cwd=str(tmp_path),
        env=os.environ,
    )
    pgid = int(outcome.output.split()[0])
    assert outcome.exit_code == 0 and not outcome.aborted
    assert outcome.output.endswith("started\n")
    assert await group_gone(pgid)


async def test_cancellation_kills_and_reaps_before_propagating(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    seen = trio.Event()
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                await run_shell(
                    f"echo $$ > {pid_file}; echo ready; sleep 30",
                    cwd=str(tmp_path),
                    env=os.environ,
                    on_output=lambda _: seen.set(),
                )
                pytest.fail("run_shell returned instead of being cancelled")

            nursery.start_soon(run)
            await seen.wait()
            scope.cancel()
    pgid = int(pid_file.read_text())
    assert await group_gone(pgid)
    with pytest.raises(ChildProcessError):
        os.waitpid(pgid, os.WNOHANG)  # noqa: ASYNC222 - WNOHANG; reaped: not our child


async def test_output_is_bounded_tail_kept_head_streamed(tmp_path: Path) -> None:
    limit = 64 * 1024
    streamed: list[str] = []
    outcome = await run_shell(
        "i=0; while [ $i -lt 5000 ]; do printf 'line %05d ..............................\\n' $i;"
        " i=$((i+1)); done",
        cwd=str(tmp_path),
        env=os.environ,
        output_limit=limit,
        on_output=streamed.append,
    )
    assert outcome.exit_code == 0 and outcome.truncated
    assert len(outcome.output.encode()) <= limit
    assert outcome.output.endswith("line 04999 ..............................\n")
    head = "".join(streamed)
    assert head.startswith("line 00000 ")
    assert len(head.encode()) == limit


def test_signal_names() -> None:
    assert signal_name(0) is None and signal_name(2) is None and signal_name(None) is None
    assert signal_name(-9) == "SIGKILL"
    assert signal_name(-15) == "SIGTERM"
