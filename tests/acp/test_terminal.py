"""Client-side terminals: real processes, output limits, kill/release semantics."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from acp.errors import RESOURCE_NOT_FOUND, HandlerError
from acp.process import live_group_members
from acp.schema import CreateTerminalParams, EnvVariable, TerminalIdParams
from acp.terminal import SHELL, TerminalManager, argv_for, trim_output
from tests.acp.util import eventually, pid_alive


@pytest.mark.parametrize(
    ("data", "limit", "expected", "truncated"),
    [
        (b"hello", 10, b"hello", False),
        (b"hello", 5, b"hello", False),
        (b"hello world", 5, b"world", True),
        # "é" is 2 bytes (c3 a9): a cut inside it drops the dangling continuation byte
        ("aé".encode(), 1, b"", True),
        ("xé".encode() + b"b", 2, b"b", True),
        ("日本語".encode(), 4, "語".encode(), True),  # 3-byte chars
        ("😀x".encode(), 2, b"x", True),  # 4-byte char
    ],
)
def test_trim_output_cuts_at_char_boundary(
    data: bytes, limit: int, expected: bytes, truncated: bool
) -> None:
    buf = bytearray(data)
    assert trim_output(buf, limit) == truncated
    assert bytes(buf) == expected
    buf.decode("utf-8")  # always valid UTF-8 at the front


def tid(session: str, terminal_id: str) -> TerminalIdParams:
    return TerminalIdParams(session_id=session, terminal_id=terminal_id)


async def test_run_command_and_read_output(nursery: trio.Nursery, tmp_path: object) -> None:
    terms = TerminalManager(nursery, cwd=str(tmp_path))
    term_id = await terms.create(
        CreateTerminalParams(
            session_id="s",
            command="sh",
            args=["-c", 'echo "$GREETING from $(pwd)"; echo oops >&2; exit 4'],
            env=[EnvVariable(name="GREETING", value="hi")],
        )
    )
    status = await terms.wait_for_exit(tid("s", term_id))
    assert (status.exit_code, status.signal) == (4, None)
    out = terms.output(tid("s", term_id))
    assert out.output == f"hi from {tmp_path}\noops\n"
    assert not out.truncated
    assert out.exit_status == status
    await terms.release(tid("s", term_id))
    with pytest.raises(HandlerError) as exc_info:
        terms.output(tid("s", term_id))
    assert exc_info.value.code == RESOURCE_NOT_FOUND


async def test_output_byte_limit_keeps_the_tail(nursery: trio.Nursery, tmp_path: object) -> None:
    terms = TerminalManager(nursery, cwd=str(tmp_path))
    term_id = await terms.create(
        CreateTerminalParams(
            session_id="s",
            command="sh",
            args=["-c", "for i in $(seq 1 2000); do echo line$i; done"],
            output_byte_limit=100,
        )
    )
    await terms.wait_for_exit(tid("s", term_id))
    await eventually(lambda: terms.output(tid("s", term_id)).output.endswith("line2000\n"))
    out = terms.output(tid("s", term_id))
    assert out.truncated
    assert len(out.output.encode()) <= 100


async def test_kill_keeps_terminal_valid_and_release_kills(
    nursery: trio.Nursery, tmp_path: object
) -> None:
    terms = TerminalManager(nursery, cwd=str(tmp_path))
    t1 = await terms.create(CreateTerminalParams(session_id="s", command="sleep", args=["1000"]))
    await terms.kill(tid("s", t1))
    status = await terms.wait_for_exit(tid("s", t1))
    assert status.signal == "SIGKILL" and status.exit_code is None
    assert terms.output(tid("s", t1)).exit_status == status  # still valid after kill

    t2 = await terms.create(
        CreateTerminalParams(session_id="s", command="sh", args=["-c", "sleep 1000 & sleep 1000"])
    )
    pgid = terms._terminals[t2].proc.pid
    await eventually(lambda: len(live_group_members(pgid)) >= 2)
    await terms.release(tid("s", t2))
    await eventually(lambda: live_group_members(pgid) == [])
    assert len(terms) == 1


async def test_terminals_belong_to_their_session(nursery: trio.Nursery, tmp_path: object) -> None:
    terms = TerminalManager(nursery, cwd=str(tmp_path))
    t1 = await terms.create(CreateTerminalParams(session_id="a", command="true"))
    for call in (terms.kill, terms.release, terms.wait_for_exit):
        with pytest.raises(HandlerError) as exc_info:
            await call(tid("b", t1))
        assert exc_info.value.code == RESOURCE_NOT_FOUND


async def test_limits_and_bad_commands(nursery: trio.Nursery, tmp_path: object) -> None:
    terms = TerminalManager(nursery, cwd=str(tmp_path), max_terminals=1)
    await terms.create(CreateTerminalParams(session_id="s", command="true"))
    with pytest.raises(HandlerError, match="too many terminals"):
        await terms.create(CreateTerminalParams(session_id="s", command="true"))
    other = TerminalManager(nursery, cwd=str(tmp_path))
    with pytest.raises(HandlerError, match="cannot start"):
        await other.create(CreateTerminalParams(session_id="s", command="/no/such/binary"))


async def test_the_terminal_cap_is_per_session(nursery: trio.Nursery, tmp_path: object) -> None:
    """Sessions sharing a connection (packing) each get the whole cap (issue 22, item 4)."""
    terms = TerminalManager(nursery, cwd=str(tmp_path), max_terminals=1)
    await terms.create(CreateTerminalParams(session_id="a", command="true"))
    await terms.create(CreateTerminalParams(session_id="b", command="true"))  # b has its own
    with pytest.raises(HandlerError, match="too many terminals"):
        await terms.create(CreateTerminalParams(session_id="a", command="true"))


async def test_release_session_kills_only_that_sessions_terminals(
    nursery: trio.Nursery, tmp_path: object
) -> None:
    terms = TerminalManager(nursery, cwd=str(tmp_path))
    mine = [
        await terms.create(CreateTerminalParams(session_id="a", command="sleep", args=["1000"]))
        for _ in range(2)
    ]
    theirs = await terms.create(
        CreateTerminalParams(session_id="b", command="sleep", args=["1000"])
    )
    pids = [terms._terminals[t].proc.pid for t in mine]
    other = terms._terminals[theirs].proc.pid
    assert terms.release_session("a") == 2
    await eventually(lambda: not any(pid_alive(p) for p in pids))
    with pytest.raises(HandlerError) as exc_info:
        await terms.kill(tid("a", mine[0]))  # forgotten
    assert exc_info.value.code == RESOURCE_NOT_FOUND
    assert pid_alive(other) and len(terms) == 1
    # The session may come back (rebound) and create terminals again.
    await terms.create(CreateTerminalParams(session_id="a", command="true"))
    await terms.aclose()


async def test_aclose_kills_everything(nursery: trio.Nursery, tmp_path: object) -> None:
    terms = TerminalManager(nursery, cwd=str(tmp_path))
    ids = [
        await terms.create(CreateTerminalParams(session_id="s", command="sleep", args=["1000"]))
        for _ in range(3)
    ]
    pids = [terms._terminals[i].proc.pid for i in ids]
    await terms.aclose()
    assert not any(pid_alive(p) for p in pids)
    with pytest.raises(HandlerError):
        await terms.create(CreateTerminalParams(session_id="s", command="true"))


# -- whole command lines in `command` (kimi) --------------------------------------------------


async def test_a_whole_command_line_without_args_runs_through_sh(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    (tmp_path / "a.txt").write_text("x")
    terms = TerminalManager(nursery, cwd=str(tmp_path))
    term_id = await terms.create(
        CreateTerminalParams(session_id="s", command="echo $((6 * 7)) | tr 4 X; ls a.txt")
    )
    status = await terms.wait_for_exit(tid("s", term_id))
    assert (status.exit_code, terms.output(tid("s", term_id)).output) == (0, "X2\na.txt\n")


def test_argv_for_the_rule(tmp_path: Path) -> None:
    spaced = tmp_path / "my tool"
    spaced.write_text("#!/bin/sh\necho spaced\n")
    spaced.chmod(0o755)
    path = os.environ.get("PATH")
    cwd = str(tmp_path)
    # A line with shell syntax and no args: through the shell.
    assert argv_for("ls -la | head", [], path=path, cwd=cwd) == [SHELL, "-c", "ls -la | head"]
    # With args, a program name: executed directly, never through a shell.
    assert argv_for("echo", ["a | b"], path=path, cwd=cwd) == ["echo", "a | b"]
    assert argv_for("echo a", ["b"], path=path, cwd=cwd) == ["echo a", "b"]
    # An executable whose path has a space runs as itself (absolute, or relative to cwd).
    assert argv_for(str(spaced), [], path=path, cwd=cwd) == [str(spaced)]
    assert argv_for("./my tool", [], path=path, cwd=cwd) == ["./my tool"]
    # One plain word stays a program name (an unknown one fails with "cannot start").
    assert argv_for("true", [], path=path, cwd=cwd) == ["true"]
    assert argv_for("no-such-program", [], path=path, cwd=cwd) == ["no-such-program"]


async def test_an_executable_with_a_space_in_its_path_is_not_given_to_the_shell(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    spaced = tmp_path / "my tool"
    spaced.write_text("#!/bin/sh\necho ran as itself\n")
    spaced.chmod(0o755)
    terms = TerminalManager(nursery, cwd=str(tmp_path))
    term_id = await terms.create(CreateTerminalParams(session_id="s", command=str(spaced)))
    await terms.wait_for_exit(tid("s", term_id))
    assert terms.output(tid("s", term_id)).output == "ran as itself\n"


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/sys/fs/cgroup/pids/cgroup.procs").exists(),
    reason="needs root and a writable cgroup v1 pids hierarchy",
)
async def test_terminals_run_inside_the_agents_confinement(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """A terminal the agent asks for counts against the agent's limits: it joins the
    agent's cgroups before its exec; a missing command is still refused at create."""
    import uuid

    from acp.confine import Confinement

    group = Path("/sys/fs/cgroup/pids") / f"acp-serve-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        confine = Confinement(cgroup_procs=(str(group / "cgroup.procs"),), oom_score_adj=700)
        terms = TerminalManager(nursery, cwd=str(tmp_path), confine=confine)
        term_id = await terms.create(
            CreateTerminalParams(
                session_id="s",
                command="sh",
                args=["-c", "grep pids: /proc/self/cgroup; cat /proc/self/oom_score_adj"],
            )
        )
        await terms.wait_for_exit(tid("s", term_id))
        lines = terms.output(tid("s", term_id)).output.split()
        assert lines[0].endswith("/" + group.name) and lines[1] == "700"
        with pytest.raises(HandlerError, match="cannot start terminal command"):
            await terms.create(CreateTerminalParams(session_id="s", command="/no/such/tool"))
        await terms.aclose()
    finally:
        group.rmdir()
