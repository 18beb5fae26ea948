"""The confinement wrapper (acp/confine.py): a real child joins its cgroup before its exec,
gets its OOM score, and fails closed when a step cannot be done."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from acp.confine import EXIT_CONFINE_FAILED, EXIT_EXEC_FAILED, Confinement

PIDS_V1 = Path("/sys/fs/cgroup/pids")


def _run(confine: Confinement, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(confine.wrap(argv), capture_output=True, text=True, timeout=30)


def test_empty_confinement_is_the_command_itself() -> None:
    assert Confinement().wrap(["true"]) == ["true"]


@pytest.mark.skipif(
    os.geteuid() != 0 or not (PIDS_V1 / "cgroup.procs").exists(),
    reason="needs root and a writable cgroup v1 pids hierarchy",
)
def test_child_is_in_its_cgroup_from_its_first_instruction() -> None:
    group = PIDS_V1 / f"acp-serve-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        c = Confinement(cgroup_procs=(str(group / "cgroup.procs"),), oom_score_adj=500)
        # The exec'd command and its own child (sh's subshell) are both inside.
        r = _run(c, ["sh", "-c", "grep pids: /proc/self/cgroup; cat /proc/self/oom_score_adj"])
        assert r.returncode == 0, r.stderr
        lines = r.stdout.split()
        assert lines[0].endswith("/" + group.name)
        assert lines[1] == "500"
    finally:
        group.rmdir()


def test_a_step_that_fails_refuses_to_start_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    c = Confinement(cgroup_procs=(str(tmp_path / "no-such-cgroup" / "cgroup.procs"),))
    r = _run(c, ["sh", "-c", f"touch {marker}"])
    assert r.returncode == EXIT_CONFINE_FAILED
    assert "acp-serve confine: cannot join cgroup" in r.stderr
    assert not marker.exists()


def test_a_missing_command_exits_127() -> None:
    c = Confinement(oom_score_adj=0)
    r = _run(c, ["/no/such/agent"])
    assert r.returncode == EXIT_EXEC_FAILED
    assert "cannot run '/no/such/agent'" in r.stderr
