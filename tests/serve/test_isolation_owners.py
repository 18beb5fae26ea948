"""serve/isolation/owners.py: which agents' cgroups a daemon may remove, proven by the owner's
lock; against directory trees of plain files (a flock works on any directory) and real
processes holding or having held the lock. The real-kernel, two-daemon tests are in
test_agent_groups.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from serve.isolation import Detected, Isolation, cgroups, owners
from serve.isolation.cgroups import Limits
from serve.settings import parse_settings

ROOT = Path(__file__).resolve().parents[2]
#: A process that claims an agents' parent under argv[1], prints its name and holds the
#: lock until its stdin closes.
CLAIMER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from serve.isolation import owners
    got = owners.claim({"memory": Path(sys.argv[1])})
    print(got.name, flush=True)
    sys.stdin.read()
    """
)


@pytest.fixture
def claimers() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def claimed_by_another_process(base: Path, procs: list[subprocess.Popen[str]]) -> Path:
    proc = subprocess.Popen(
        [sys.executable, "-c", CLAIMER, str(base)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.append(proc)
    assert proc.stdout is not None
    name = proc.stdout.readline().strip()
    assert owners.is_instance(name), name
    return base / name


def test_a_live_owners_group_is_left_alone_and_a_dead_owners_is_removed(
    tmp_path: Path, claimers: list[subprocess.Popen[str]]
) -> None:
    live = claimed_by_another_process(tmp_path, claimers)
    (live / "agent-1").mkdir()  # between two agents: empty, yet its owner's
    dead = claimed_by_another_process(tmp_path, claimers)
    (dead / "agent-4").mkdir()
    claimers[1].send_signal(signal.SIGKILL)  # no clean-up of its own: the kernel's unlock
    claimers[1].wait()

    found = owners.sweep([tmp_path])
    assert live.is_dir() and (live / "agent-1").is_dir()
    assert not dead.exists()
    assert found.live == 1 and found.left_alone == []
    assert found.removed == [
        {"path": str(dead), "why": "its owner is gone (its lock was free)", "killed": 0}
    ]
    # The live owner, asked again after the sweep, still holds its lock.
    assert owners.try_lock(live) is None


def test_a_claim_never_reuses_an_existing_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = tmp_path / "acp-serve.d-0000000000000000"
    (taken / "agent-1").mkdir(parents=True)
    names = iter([taken.name, "acp-serve.d-1111111111111111"])
    monkeypatch.setattr(owners, "new_name", lambda: next(names))
    got = owners.claim({"memory": tmp_path})
    try:
        assert got.name == "acp-serve.d-1111111111111111"
        assert (taken / "agent-1").is_dir()  # what was there is untouched
        assert owners.try_lock(tmp_path / got.name) is None  # locked by this claim
        assert owners.try_lock(taken) is not None  # (nobody's)
    finally:
        got.release()


def test_a_sweepers_lock_on_a_fresh_directory_makes_the_claim_draw_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race: a sweeper takes the lock of a directory between its ``mkdir`` and the
    owner's ``flock``; the owner must not take a group the sweeper is removing."""
    first = tmp_path / "acp-serve.d-2222222222222222"
    names = iter([first.name, "acp-serve.d-3333333333333333"])
    monkeypatch.setattr(owners, "new_name", lambda: next(names))
    held: list[int] = []
    real_try_lock = owners.try_lock

    def sweeper_first(path: Path) -> int | None:
        if path == first and not held:
            fd = real_try_lock(path)  # the sweeper's
            assert fd is not None
            held.append(fd)
        return real_try_lock(path)

    monkeypatch.setattr(owners, "try_lock", sweeper_first)
    got = owners.claim({"memory": tmp_path})
    try:
        assert got.name == "acp-serve.d-3333333333333333"
        assert first.is_dir()  # left to the sweeper that holds it
    finally:
        got.release()
        os.close(held[0])


def test_legacy_groups_are_removed_only_empty_with_their_pid_in_use_by_nobody(
    tmp_path: Path,
) -> None:
    if owners._why_blind("/proc") is not None:
        pytest.skip("the test runs in a pid namespace of its own: no pid can be proven dead")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        dead_empty = tmp_path / f"acp-serve.{gone.pid}"
        (dead_empty / "agent-2").mkdir(parents=True)
        alive = tmp_path / f"acp-serve.{sleeper.pid}.2"
        alive.mkdir()
        with_members = tmp_path / f"acp-serve.{gone.pid}.3"
        (with_members / "agent-1").mkdir(parents=True)
        (with_members / "agent-1" / "cgroup.procs").write_text(f"{sleeper.pid}\n")
        daemon_leaf = tmp_path / cgroups.DAEMON_LEAF
        daemon_leaf.mkdir()
        odd = tmp_path / "acp-serve.custom"
        odd.mkdir()

        found = owners.sweep([tmp_path])
        assert not dead_empty.exists()
        assert alive.is_dir() and with_members.is_dir() and daemon_leaf.is_dir() and odd.is_dir()
        assert sleeper.poll() is None  # nothing signalled
        why = {Path(e["path"]).name: e["why"] for e in found.left_alone}
        assert why == {
            alive.name: f"an older daemon's group (no owner lock): pid {sleeper.pid} is in use",
            with_members.name: "an older daemon's group (no owner lock) with 1 process in it",
            odd.name: "not a name this daemon gives its groups",
        }
        assert [Path(e["path"]).name for e in found.removed] == [dead_empty.name]
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs root")
def test_a_daemon_in_its_own_pid_namespace_leaves_every_legacy_group_alone(
    tmp_path: Path,
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    legacy = tmp_path / f"acp-serve.{gone.pid}"
    legacy.mkdir()
    one = tmp_path / "acp-serve.1"  # a PID-1 daemon's, as an older daemon named it
    (one / "agent-1").mkdir(parents=True)
    code = (
        "import json, sys; from pathlib import Path; from serve.isolation import owners; "
        "print(json.dumps(owners.sweep([Path(sys.argv[1])]).status()))"
    )
    out = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert legacy.is_dir() and (one / "agent-1").is_dir()
    blind = "this daemon runs in a pid namespace of its own and cannot see every pid"
    assert f'"why": "an older daemon\'s group (no owner lock): {blind}"' in out
    assert '"leftAloneTotal": 2' in out and '"removedAtStartTotal": 0' in out


def test_an_existing_child_group_is_adopted_when_empty_and_skipped_when_busy(
    tmp_path: Path,
) -> None:
    parents = {"memory": tmp_path / "memory" / "p", "pids": tmp_path / "pids" / "p"}
    for parent in parents.values():
        (parent / "agent-1").mkdir(parents=True)
    groups = cgroups.make_child("v1", parents, "agent-1", Limits(64 << 20, 32, 0))
    assert (groups["memory"] / "memory.limit_in_bytes").read_text() == str(64 << 20)
    assert (groups["pids"] / "pids.max").read_text() == "32"

    (parents["pids"] / "agent-2").mkdir()
    (parents["pids"] / "agent-2" / "cgroup.procs").write_text(f"{os.getpid()}\n")
    with pytest.raises(cgroups.GroupBusy, match="agent-2 exists and has processes in it"):
        cgroups.make_child("v1", parents, "agent-2", Limits(64 << 20, 32, 0))
    assert not (parents["memory"] / "agent-2").exists()  # what it made is undone
    assert (parents["pids"] / "agent-2" / "cgroup.procs").exists()  # the busy one: untouched


async def test_a_spawn_takes_the_next_name_past_a_busy_leftover(tmp_path: Path) -> None:
    base = tmp_path / "memory"
    base.mkdir()
    iso = Isolation(
        parse_settings(["--port", "0"]),
        Detected("cgroup-v1", "test", "v1", {"memory": base}, None),
        proc=str(tmp_path),
    )
    await trio.to_thread.run_sync(iso.setup)
    iso.ready = True
    try:
        assert iso.parent_name is not None and owners.is_instance(iso.parent_name)
        parent = base / iso.parent_name
        (parent / "agent-1").mkdir()
        (parent / "agent-1" / "cgroup.procs").write_text(f"{os.getpid()}\n")
        child = await iso.child()
        assert child is not None and child.name == "agent-2"
        assert iso.status()["groups"]["paths"] == {"memory": str(parent)}
        await child.aclose()
    finally:
        (parent / "agent-1" / "cgroup.procs").unlink()
        assert iso.teardown() == []
    assert not parent.exists()
    assert owners.sweep([base]).removed == []
