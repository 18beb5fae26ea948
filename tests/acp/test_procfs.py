"""``acp.procfs.children``: a process's children without a scan of ``/proc``, zombies
included (the reaper and the memory sampling rely on both), matching a full scan."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from acp import procfs

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")


def _scan_children(pid: int) -> set[int]:
    return {child for child, _state, parent, _pgid in procfs.stats() if parent == pid}


def test_children_lists_live_and_exited_unreaped_children_like_a_scan() -> None:
    if procfs.children(os.getpid()) is None:
        pytest.skip("kernel without /proc/<pid>/task/<tid>/children")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until `quick` is a zombie (not reaped by us)
            with open(f"/proc/{quick.pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    break
            time.sleep(0.01)
        found = procfs.children(os.getpid())
        assert found is not None
        assert {sleeper.pid, quick.pid} <= set(found)
        assert set(found) == _scan_children(os.getpid())
        quick.wait()
        assert quick.pid not in (procfs.children(os.getpid()) or [])
    finally:
        sleeper.kill()
        sleeper.wait()
        quick.wait()
    assert sleeper.pid not in (procfs.children(os.getpid()) or [])


def test_children_of_a_gone_process_is_empty() -> None:
    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    quick.wait()
    assert procfs.children(quick.pid) == []


def test_a_tree_walk_finds_every_descendant_with_and_without_the_children_files(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A child that forks a grandchild (both sleep): the tree is the root, then both.
    code = (
        "import subprocess, sys, time; "
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
        "print(g.pid, flush=True); time.sleep(30)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        walked = procfs.TreeWalker().tree(child.pid)
        assert walked[0] == child.pid and set(walked) == {child.pid, grandchild}
        assert procfs.TreeWalker().tree(os.getpid())[0] == os.getpid()
        assert {child.pid, grandchild} <= set(procfs.TreeWalker().tree(os.getpid()))
        # A kernel without /proc/<pid>/task/<tid>/children: one scan, the same tree.
        monkeypatch.setattr(procfs, "children", lambda pid: None)
        scanned = procfs.TreeWalker().tree(child.pid)
        assert scanned[0] == child.pid and set(scanned) == set(walked)
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the child and the grandchild
        child.wait()
