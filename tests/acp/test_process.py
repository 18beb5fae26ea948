"""AgentProcess: real children, real process groups, real signals."""

from __future__ import annotations

import os
import signal
import sys

import pytest
import trio

from acp.process import AgentProcess, live_group_members, redact, scrub_env
from tests.acp.util import eventually, pid_alive

PY = sys.executable


async def read_line(proc: AgentProcess) -> bytes:
    buf = b""
    with trio.fail_after(10):
        while not buf.endswith(b"\n"):
            data = await proc.stdout.receive_some(4096)
            assert data, f"stdout closed early; stderr: {proc.stderr_tail()}"
            buf += data
    return buf.strip()


def test_scrub_env_drops_daemon_secrets_and_keeps_agent_credentials() -> None:
    env = {
        "QWEN_SERVER_TOKEN": "t0ken-secret",
        "ACP_SERVE_TOKEN": "x",
        "ACP_SERVE_API_KEY": "x",
        "QWEN_SERVER_SECRET_FILE": "x",
        "ACP_SERVE_STATE_DIR": "/state",
        "OPENAI_API_KEY": "sk-agent-needs-this",
        "PATH": "/usr/bin",
    }
    assert scrub_env(env) == {
        "ACP_SERVE_STATE_DIR": "/state",
        "OPENAI_API_KEY": "sk-agent-needs-this",
        "PATH": "/usr/bin",
    }


@pytest.mark.parametrize(
    ("text", "secrets", "expected"),
    [
        ("Authorization: Bearer abcdefghijklmnop", (), "Authorization: Bearer [REDACTED]"),
        ("key sk-proj-abcdefghijklmnopqrstuvwxyz ok", (), "key [REDACTED] ok"),
        ("api_key=hunter22hunter end", (), "api_key=[REDACTED] end"),
        ('"token": "abcdef123456"', (), '"token": "[REDACTED]"'),
        ("ghp_abcdefghijklmnopqrstuvwxyz0123", (), "[REDACTED]"),
        ("value my-long-secret-value here", ("my-long-secret-value",), "value [REDACTED] here"),
        ("short ab", ("ab",), "short ab"),  # too short to redact blindly
        ("plain log line: 42 files", (), "plain log line: 42 files"),
    ],
)
def test_redact(text: str, secrets: tuple[str, ...], expected: str) -> None:
    assert redact(text, secrets) == expected


async def test_env_is_scrubbed_in_the_child(nursery: trio.Nursery, tmp_path: object) -> None:
    env = dict(os.environ, QWEN_SERVER_TOKEN="daemon-secret", OPENAI_API_KEY="agent-key")
    code = "import os; print(os.environ.get('QWEN_SERVER_TOKEN'), os.environ.get('OPENAI_API_KEY'))"
    proc = await AgentProcess.spawn(nursery, [PY, "-c", code], cwd=str(tmp_path), env=env)
    assert await read_line(proc) == b"None agent-key"
    info = await proc.wait()
    assert info.exit_code == 0 and info.signal is None


async def test_exit_code_and_stderr_tail(nursery: trio.Nursery, tmp_path: object) -> None:
    proc = await AgentProcess.spawn(
        nursery, ["sh", "-c", "echo first >&2; echo fatal: boom >&2; exit 3"], cwd=str(tmp_path)
    )
    info = await proc.wait()
    assert (info.returncode, info.exit_code, info.signal) == (3, 3, None)
    assert info.stderr_tail == "first\nfatal: boom\n"
    assert "status 3" in info.describe() and "fatal: boom" in info.describe()


async def test_killed_by_signal(nursery: trio.Nursery, tmp_path: object) -> None:
    proc = await AgentProcess.spawn(nursery, ["sh", "-c", "kill -KILL $$"], cwd=str(tmp_path))
    info = await proc.wait()
    assert (info.returncode, info.exit_code, info.signal) == (-9, None, 9)
    assert "SIGKILL" in info.describe()


async def test_stderr_tail_is_bounded_and_redacted(nursery: trio.Nursery, tmp_path: object) -> None:
    code = (
        "import sys, os\n"
        "sys.stderr.write('x' * 200000)\n"
        "sys.stderr.write('\\nAuthorization: Bearer sekrit-abcdefgh ' + os.environ['MY_TOKEN'])\n"
    )
    env = dict(os.environ, MY_TOKEN="literal-token-value")
    proc = await AgentProcess.spawn(
        nursery, [PY, "-c", code], cwd=str(tmp_path), env=env, stderr_tail_bytes=1000
    )
    info = await proc.wait()
    assert len(info.stderr_tail) <= 1000
    assert info.stderr_tail.endswith("Authorization: Bearer [REDACTED] [REDACTED]")
    assert "sekrit" not in info.stderr_tail and "literal-token-value" not in info.stderr_tail


async def test_stop_closes_stdin_first(nursery: trio.Nursery, tmp_path: object) -> None:
    proc = await AgentProcess.spawn(nursery, ["cat"], cwd=str(tmp_path))
    info = await proc.stop(grace_s=5)
    assert info.exit_code == 0 and info.signal is None  # cat exits on EOF, no signal needed


STUBBORN = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "child = subprocess.Popen(['sleep', '1000'])\n"
    "print(child.pid, flush=True)\n"
    "sys.stdin.close()\n"
    "time.sleep(1000)\n"
)


async def test_stop_escalates_to_sigkill_and_leaves_no_process(
    nursery: trio.Nursery, tmp_path: object
) -> None:
    proc = await AgentProcess.spawn(nursery, [PY, "-c", STUBBORN], cwd=str(tmp_path))
    grandchild = int(await read_line(proc))
    assert set(live_group_members(proc.pgid)) >= {proc.pid, grandchild}
    info = await proc.stop(grace_s=0.2)
    assert info.signal == signal.SIGKILL
    await eventually(lambda: not pid_alive(grandchild))
    assert live_group_members(proc.pgid) == []


async def test_leader_exit_kills_orphaned_grandchildren(
    nursery: trio.Nursery, tmp_path: object
) -> None:
    # the grandchild inherits stdout/stderr: without the group kill, EOF would never come
    proc = await AgentProcess.spawn(
        nursery, ["sh", "-c", "sleep 1000 & echo $!; exit 0"], cwd=str(tmp_path)
    )
    grandchild = int(await read_line(proc))
    info = await proc.wait()
    assert info.exit_code == 0
    await eventually(lambda: not pid_alive(grandchild))
    assert live_group_members(proc.pgid) == []


async def test_cancelling_the_owner_stops_the_child(tmp_path: object) -> None:
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            proc = await AgentProcess.spawn(
                nursery, [PY, "-c", STUBBORN], cwd=str(tmp_path), cancel_grace_s=0.2
            )
            grandchild = int(await read_line(proc))
            scope.cancel()
    assert proc.exited  # the supervising task reaped it before letting the cancellation out
    info = await proc.wait()
    assert info.signal == signal.SIGKILL
    await eventually(lambda: not pid_alive(grandchild))
    assert live_group_members(proc.pgid) == []


async def test_missing_command_raises(nursery: trio.Nursery, tmp_path: object) -> None:
    with pytest.raises(FileNotFoundError):
        await AgentProcess.spawn(nursery, ["/nonexistent/agent"], cwd=str(tmp_path))
