"""The agents' cgroups of real daemons on this machine's cgroup v1 hierarchies, for tests:
where a process's own cgroups are, which groups a daemon owns (its owner record), and a
clean-up that removes the groups a test saw (killing only what is in them)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from serve.isolation import cgroups, owners

CG = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu")


def own_dir(controller: str, pid: int | str = "self") -> Path:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return CG / controller / path.lstrip("/")
    raise AssertionError(f"no {controller} cgroup")


def instance_groups(base_pid: int | str = "self") -> list[Path]:
    """Every instance group (``acp-serve.d-<id>``) below ``base_pid``'s own cgroups."""
    out: list[Path] = []
    for controller in CONTROLLERS:
        base = own_dir(controller, base_pid)
        out.extend(p for p in sorted(base.iterdir()) if owners.is_instance(p.name))
    return out


def groups_of(daemon_pid: int, base_pid: int | str = "self") -> list[Path]:
    """The agents' parents of the daemon whose own pid (in its namespace) is
    ``daemon_pid`` and which runs in this process's pid namespace, from its owner record."""
    ns = os.stat("/proc/self/ns/pid").st_ino
    out = []
    for group in instance_groups(base_pid):
        record = owners.read_record(group)
        if record and record.get("pid") == daemon_pid and record.get("pidNs") == ns:
            out.append(group)
    return out


def status_groups(isolation: dict[str, Any]) -> list[Path]:
    """The agents' parents a daemon's ``/daemon/status`` ``isolation`` names."""
    return [Path(p) for p in isolation["groups"]["paths"].values()]


def remove(groups: Iterable[Path], *, kill: bool = True) -> None:
    """A test's clean-up: remove each group that is still there; ``kill``: SIGKILL what is
    in it first (only for the groups of the test's own daemons)."""
    for group in groups:
        if group.exists():
            cgroups.remove_group([group], kill=kill)


def record(group: Path) -> dict[str, Any]:
    value = json.loads(os.getxattr(group, owners.OWNER_XATTR))
    assert isinstance(value, dict)
    return value
