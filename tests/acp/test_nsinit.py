"""The exec wrapper's pid namespace (acp/nsinit.py, acp/confine.py): real children, the real
kernel. The agent is pid 2 under an init, sees only its tree, ends as the daemon reports it
(exit status, signal), gets the daemon's signals, and nothing of it outlives a kill."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio

from acp import procfs
from acp.confine import Confinement
from acp.process import AgentProcess
from serve.isolation import pidns
from tests.acp.util import eventually, pid_alive

pytestmark = pytest.mark.skipif(
    not pidns.resolve("auto").active, reason="the kernel refuses pid namespaces here"
)

NS = Confinement(pid_namespace=True)


async def run(script: str, confine: Confinement = NS, cwd: str = "/") -> tuple[int | None, str]:
    """Run ``sh -c script`` confined; its Popen-style return code and its stderr."""
    async with trio.open_nursery() as nursery:
        proc = await AgentProcess.spawn(
            nursery, ["/bin/sh", "-c", script], cwd=cwd, confine=confine
        )
        with trio.fail_after(20):
            info = await proc.wait()
    return info.returncode, proc.stderr_tail()


async def test_the_agent_is_pid_2_and_its_proc_lists_its_tree_only() -> None:
    code, err = await run(
        f"echo $$ >&2; ls /proc | grep -x -E '[0-9]+' | tr '\\n' ' ' >&2; "
        f"cat /proc/{os.getpid()}/cmdline || echo NO-DAEMON >&2"
    )
    assert code == 0, err
    pid, procs, rest = err.split("\n", 2)
    assert pid == "2"
    assert str(os.getpid()) not in procs.split() and procs.split()[:2] == ["1", "2"]
    assert "NO-DAEMON" in rest


@pytest.mark.parametrize(
    ("script", "code"),
    [("exit 7", 7), ("kill -TERM $$", -signal.SIGTERM), ("kill -KILL $$", -signal.SIGKILL)],
)
async def test_the_wrapper_ends_as_the_agent_did(script: str, code: int) -> None:
    assert (await run(script))[0] == code


async def test_the_daemons_sigterm_reaches_the_agent_through_the_init(tmp_path: Path) -> None:
    got = tmp_path / "got"
    async with trio.open_nursery() as nursery:
        proc = await AgentProcess.spawn(
            nursery,
            [
                "/bin/sh",
                "-c",
                f"trap 'echo TERM > {got}; exit 3' TERM; echo up; while :; do sleep 0.05; done",
            ],
            cwd="/",
            confine=NS,
        )
        with trio.fail_after(10):
            assert await proc.stdout.receive_some(16) == b"up\n"
        proc.signal_group(signal.SIGTERM)  # the daemon's escalation: P's group
        with trio.fail_after(10):
            info = await proc.wait()
    assert info.exit_code == 3 and got.read_text() == "TERM\n"


async def test_sigkill_of_the_wrapper_ends_the_whole_namespace() -> None:
    async with trio.open_nursery() as nursery:
        # Two grandchildren leave every group (setsid) and are orphaned to the init.
        proc = await AgentProcess.spawn(
            nursery,
            ["/bin/sh", "-c", "(setsid sleep 60 &); (setsid sleep 60 &); echo up; sleep 60"],
            cwd="/",
            confine=NS,
        )
        with trio.fail_after(10):
            assert await proc.stdout.receive_some(16) == b"up\n"
        tree: list[int] = []

        def grown() -> bool:
            tree[:] = procfs.TreeWalker().tree(proc.pid)
            return len(tree) >= 6  # wrapper, init, shell, its sleep, two orphans

        await eventually(grown)
        os.kill(proc.pid, signal.SIGKILL)
        with trio.fail_after(10):
            info = await proc.wait()
    assert info.signal == signal.SIGKILL
    await eventually(lambda: not any(pid_alive(p) for p in tree[1:]))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
async def test_in_a_user_namespace_and_under_a_uid(tmp_path: Path) -> None:
    code, err = await run(
        "id -u >&2; echo $$ >&2", Confinement(pid_namespace=True, user_namespace=True)
    )
    assert code == 0 and err.split() == ["0", "2"], err
    secret = tmp_path / "secret"
    secret.write_text("root's\n")
    secret.chmod(0o600)
    code, err = await run(
        f"id -u >&2; id -G >&2; cat {secret} >&2 || echo DENIED >&2; umount /proc || echo KEPT >&2",
        Confinement(pid_namespace=True, uid=3_000_123, gid=3_000_123),
    )
    assert code == 0, err
    assert err.split()[:2] == ["3000123", "3000123"], err
    assert "DENIED" in err and "root's" not in err and "KEPT" in err, err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
async def test_a_root_agent_cannot_unmount_its_proc() -> None:
    code, err = await run("umount /proc && echo UNMOUNTED >&2; grep CapBnd /proc/self/status >&2")
    assert code == 0 and "UNMOUNTED" not in err, err
    bounding = int(err.split("CapBnd:")[1].split()[0], 16)
    assert not bounding & (1 << 21)  # CAP_SYS_ADMIN
