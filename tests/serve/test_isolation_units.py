"""serve/isolation: the cgroup v1/v2 file logic, backend detection and the OOM verdict,
against directory trees of plain files (where the kernel cannot be used: cgroup v2 here has
no controllers). The real-kernel tests are in test_agent_limits.py."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
import trio

from acp.confine import Confinement
from acp.process import ExitInfo
from serve.isolation import (
    AGENT_OOM_SCORE_ADJ,
    MIB,
    ChildLimits,
    Detected,
    Isolation,
    IsolationError,
    cgroups,
    detect,
)
from serve.isolation.cgroups import Limits
from serve.settings import Settings, SettingsError, parse_settings

MOUNTINFO_V1 = """\
30 25 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec - tmpfs tmpfs ro,mode=755
33 30 0:29 / {root}/memory rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,memory
34 30 0:30 / {root}/pids rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,pids
35 30 0:31 / {root}/cpu rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu
36 30 0:32 / {root}/unified rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw
"""
MOUNTINFO_V2 = "40 25 0:33 / {root} rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw\n"
PROC_CGROUP_V1 = "9:name=systemd:/\n8:pids:/\n4:memory:/pod/c1\n1:cpu:/\n0::/\n"


def killed(sig: int = signal.SIGKILL) -> ExitInfo:
    return ExitInfo(returncode=-sig, exit_code=None, signal=sig, stderr_tail="")


def settings(*args: str) -> Settings:
    return parse_settings(["--port", "0", *args])


def fake_proc(tmp: Path, mountinfo: str, cgroup: str) -> Path:
    proc = tmp / "proc-self"
    proc.mkdir()
    (proc / "mountinfo").write_text(mountinfo)
    (proc / "cgroup").write_text(cgroup)
    return proc


def v2_tree(tmp: Path, controllers: str = "cpuset cpu io memory pids") -> Path:
    root = tmp / "cg2"
    root.mkdir()
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("")
    (root / "cgroup.procs").write_text("1\n7\n")
    (root / "memory.max").write_text("1073741824\n")  # the pod's container: 1 GiB
    return root


# ---- parsing ----------------------------------------------------------------------------


def test_proc_cgroup_lines_map_controllers_to_paths() -> None:
    own = cgroups.parse_proc_cgroup("4:memory:/pod/c1\n2:cpu,cpuacct:/x\n0::/unit.scope\n")
    assert own == {"memory": "/pod/c1", "cpu": "/x", "cpuacct": "/x", "": "/unit.scope"}


def test_mountinfo_finds_the_cgroup_mounts_and_their_mode(tmp_path: Path) -> None:
    mounts = cgroups.parse_mountinfo(MOUNTINFO_V1.format(root="/sys/fs/cgroup"))
    kinds = {(m.point, m.fstype) for m in mounts}
    assert ("/sys/fs/cgroup/memory", "cgroup") in kinds
    assert ("/sys/fs/cgroup/unified", "cgroup2") in kinds
    assert all(m.point != "/sys/fs/cgroup" for m in mounts)  # the tmpfs is not one
    bases = cgroups.v1_bases(mounts, cgroups.parse_proc_cgroup(PROC_CGROUP_V1))
    assert bases["memory"] == Path("/sys/fs/cgroup/memory/pod/c1")
    assert bases["pids"] == Path("/sys/fs/cgroup/pids")


def test_cpu_weight_maps_to_v1_shares() -> None:
    assert cgroups.cpu_shares(100) == 1024
    assert cgroups.cpu_shares(50) == 512
    assert cgroups.cpu_shares(1) == 10
    assert cgroups.cpu_shares(10_000) == 102_400


# ---- detection --------------------------------------------------------------------------


def test_a_delegated_v2_tree_is_chosen_first(tmp_path: Path) -> None:
    root = v2_tree(tmp_path)
    proc = fake_proc(tmp_path, MOUNTINFO_V2.format(root=root), "0::/\n")
    found = detect("auto", proc=str(proc))
    assert found.backend == "cgroup-v2" and found.bases == {"": root}
    assert found.daemon_limit_bytes == 1 << 30


def test_without_the_memory_controller_v2_is_refused_with_the_reason(tmp_path: Path) -> None:
    root = v2_tree(tmp_path, controllers="cpu pids")
    proc = fake_proc(tmp_path, MOUNTINFO_V2.format(root=root), "0::/\n")
    found = detect("auto", proc=str(proc))
    assert found.backend == "watchdog"
    assert f"the memory controller is not delegated to {root}" in found.reason
    # The limit is still known (read-only): the watchdog enforces the ceiling.
    assert found.daemon_limit_bytes == 1 << 30
    with pytest.raises(IsolationError, match="--agent-limits cgroup: no usable cgroup"):
        detect("cgroup", proc=str(proc))


def test_v1_is_chosen_when_v2_has_no_controllers(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    for name in ("memory/pod/c1", "pids", "cpu", "unified"):
        (root / name).mkdir(parents=True)
    (root / "unified" / "cgroup.controllers").write_text("\n")
    (root / "memory" / "pod" / "memory.limit_in_bytes").write_text("536870912\n")
    (root / "memory" / "pod" / "c1" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    proc = fake_proc(tmp_path, MOUNTINFO_V1.format(root=root), PROC_CGROUP_V1)
    found = detect("auto", proc=str(proc))
    assert found.backend == "cgroup-v1"
    assert set(found.bases) == {"memory", "pids", "cpu"}
    # The tightest limit of the daemon's cgroup and its ancestors (the pod's 512 MiB).
    assert found.daemon_limit_bytes == 512 * MIB
    assert detect("watchdog", proc=str(proc)).backend == "watchdog"
    assert detect("off", proc=str(proc)).backend == "off"


# ---- the v2 file logic --------------------------------------------------------------------


async def test_v2_daemon_moves_into_a_leaf_and_children_get_their_limit_files(
    tmp_path: Path,
) -> None:
    root = v2_tree(tmp_path)
    s = settings("--agent-memory-max-mb", "100", "--agent-pids-max", "64")
    iso = Isolation(s, Detected("cgroup-v2", "test", "v2", {"": root}, 1 << 30), proc=str(tmp_path))
    # The ceiling: the container's limit minus the headroom (256 MiB by default).
    assert iso.ceiling_bytes == (1024 - 256) * MIB
    await trio.to_thread.run_sync(iso.setup)
    iso.ready = True
    # No internal processes: the base's processes went into the daemon's leaf, then the
    # controllers were delegated.
    assert (root / cgroups.DAEMON_LEAF / "cgroup.procs").exists()
    assert (tmp_path / "oom_score_adj").read_text() == "-500"  # the daemon: picked last
    assert (root / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert iso.parent_name is not None
    parent = root / iso.parent_name
    assert (parent / "memory.max").read_text() == str((1024 - 256) * MIB)

    child = await iso.child()
    assert child is not None
    leaf = parent / child.name
    assert (leaf / "memory.max").read_text() == str(100 * MIB)
    assert (leaf / "memory.high").read_text() == str(int(100 * MIB * 0.9))
    assert (leaf / "memory.swap.max").read_text() == "0"
    assert (leaf / "memory.oom.group").read_text() == "1"
    assert (leaf / "pids.max").read_text() == "64"
    assert (leaf / "cpu.weight").read_text() == "100"

    # The confinement: one cgroup.procs (one tree), the OOM score, the sandbox kept.
    base = Confinement(landlock={"rw": ["/tmp"]}, env={"TMPDIR": "/tmp/x"})
    conf = child.confinement(base)
    assert conf.cgroup_procs == (str(leaf / "cgroup.procs"),)
    assert conf.oom_score_adj == AGENT_OOM_SCORE_ADJ
    assert conf.landlock == {"rw": ["/tmp"]} and conf.env == {"TMPDIR": "/tmp/x"}

    # The verdict: a SIGKILL after an OOM kill at the child's own max is "agent".
    (leaf / "memory.events").write_text("low 0\nhigh 12\nmax 3\noom 1\noom_kill 1\n")
    (leaf / "memory.peak").write_text(str(100 * MIB))
    assert child.verdict(killed(signal.SIGTERM)) is None  # decided once: not an OOM
    child._decided = False
    report = child.verdict(killed())
    assert report is not None
    assert (report.scope, report.limit_bytes, report.peak_bytes) == ("agent", 100 * MIB, 100 * MIB)
    assert report.event_data()["limitMb"] == 100
    assert iso.oom_total == 1
    assert iso.status()["limits"]["memoryHighBytes"] == int(100 * MIB * 0.9)

    await child.aclose()
    assert not leaf.exists()
    assert iso.teardown() == []
    assert not parent.exists()


async def test_a_kill_at_the_ceiling_is_named_ceiling(tmp_path: Path) -> None:
    root = v2_tree(tmp_path)
    iso = Isolation(
        settings("--agent-memory-max-mb", "600"),
        Detected("cgroup-v2", "test", "v2", {"": root}, 1 << 30),
        proc=str(tmp_path),
    )
    await trio.to_thread.run_sync(iso.setup)
    iso.ready = True
    assert iso.parent_name is not None
    parent = root / iso.parent_name
    child = await iso.child()
    assert child is not None
    (parent / child.name / "memory.events").write_text("max 0\noom_kill 1\n")
    (parent / "memory.events").write_text("max 5\noom_kill 1\n")
    report = child.verdict(killed())
    assert report is not None and report.scope == "ceiling"
    assert report.limit_bytes == iso.ceiling_bytes
    await child.aclose()
    iso.teardown()


def test_v1_child_limits_and_shares(tmp_path: Path) -> None:
    parents = {}
    for name in ("memory", "pids", "cpu"):
        parents[name] = tmp_path / name / "acp-serve.1"
        parents[name].mkdir(parents=True)
    groups = cgroups.make_child("v1", parents, "agent-1", Limits(64 * MIB, 32, 50))
    assert (groups["memory"] / "memory.limit_in_bytes").read_text() == str(64 * MIB)
    assert (groups["memory"] / "memory.memsw.limit_in_bytes").read_text() == str(64 * MIB)
    assert (groups["pids"] / "pids.max").read_text() == "32"
    assert (groups["cpu"] / "cpu.shares").read_text() == "512"
    assert cgroups.procs_files("v1", groups) == tuple(
        str(groups[c] / "cgroup.procs") for c in ("memory", "pids", "cpu")
    )
    (groups["memory"] / "memory.max_usage_in_bytes").write_text(str(64 * MIB))
    (groups["memory"] / "memory.oom_control").write_text("oom_kill_disable 0\noom_kill 2\n")
    u = cgroups.usage("v1", groups)
    assert (u.oom_kills, u.limit_hits, u.memory_peak) == (2, 1, 64 * MIB)
    assert cgroups.remove_group(groups.values()) == []
    assert not any(g.exists() for g in groups.values())


# ---- settings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--agent-limits", "kernel"], "must be one of auto|cgroup|watchdog|off"),
        (["--agent-memory-max-mb", "-1"], "must be an integer in [0, 4194304] (MiB)"),
        (["--agent-pids-max", "x"], "must be an integer in [0, 4194304]"),
        (["--agent-cpu-weight", "10001"], "must be an integer in [0, 10000] (0 = none)"),
        (["--agent-memory-headroom-mb", "1.5"], "must be an integer in [0, 1048576] (MiB)"),
    ],
)
def test_bad_limit_flags_are_refused_with_the_flag_named(args: list[str], message: str) -> None:
    with pytest.raises(SettingsError) as err:
        parse_settings(["--port", "0", *args])
    assert args[0] in str(err.value) and message in str(err.value)


def test_auto_memory_max_is_half_the_ceiling(tmp_path: Path) -> None:
    iso = Isolation(
        settings(),
        Detected("cgroup-v1", "test", "v1", {"memory": tmp_path}, 2048 * MIB),
    )
    assert iso.ceiling_bytes == (2048 - 256) * MIB
    assert iso.limits == Limits((2048 - 256) // 2 * MIB, 4096, 100)
    off = Isolation(settings("--agent-limits", "off"), Detected("off", "off"))
    assert off.limits == Limits() and off.ceiling_bytes is None


def test_the_watchdog_kills_a_tree_over_its_cap_and_the_largest_over_the_ceiling() -> None:
    from serve.isolation.watchdog import TreeSample

    iso = Isolation(
        settings("--agent-limits", "watchdog", "--agent-memory-max-mb", "100"),
        Detected("watchdog", "test", daemon_limit_bytes=(256 + 150) * MIB),
    )
    assert iso.ceiling_bytes == 150 * MIB  # 406 MiB minus the 256 MiB headroom
    iso.ready = True
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    try:
        kids = []
        for n, proc in enumerate(procs):
            child = ChildLimits(iso, f"agent-{n}", {})  # what Isolation.child() makes
            iso._children[child.name] = child
            assert child.confinement().cgroup_procs == ()
            child.attach(proc.pid)
            kids.append(child)
        # Over its own cap: that tree is killed, the others are not.
        iso._enforce(
            {
                kids[0].name: TreeSample(120 * MIB, (procs[0].pid,)),
                kids[1].name: TreeSample(90 * MIB, (procs[1].pid,)),
                kids[2].name: TreeSample(10 * MIB, (procs[2].pid,)),
            }
        )
        assert procs[0].wait(timeout=10) == -signal.SIGKILL
        assert procs[1].poll() is None and procs[2].poll() is None
        report = kids[0].verdict(killed())
        assert report is not None and (report.scope, report.peak_bytes) == ("agent", 120 * MIB)
        # Together over the ceiling (150 MiB): the largest tree goes.
        iso._enforce(
            {
                kids[1].name: TreeSample(95 * MIB, (procs[1].pid,)),
                kids[2].name: TreeSample(60 * MIB, (procs[2].pid,)),
            }
        )
        assert procs[1].wait(timeout=10) == -signal.SIGKILL
        assert procs[2].poll() is None
        report = kids[1].verdict(killed())
        assert report is not None and report.scope == "ceiling"
        assert iso.oom_total == 2
        # A child that exits on its own has no verdict.
        procs[2].terminate()
        assert kids[2].verdict(killed(signal.SIGTERM)) is None
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
