"""The agents' cgroups of real daemons on this machine's cgroup v1 hierarchies, for tests:
where a process's own cgroups are, which groups a daemon owns (its owner record), a
clean-up that removes the groups a test saw (killing only what is in them), and a cgroup of
a test's own to start its daemons in (:func:`private_base`).

Why a test's daemons need one: a daemon's start-up sweep judges the ``acp-serve.*`` groups
below its own cgroup, and removes those whose owner it proves gone. Daemons of other test
runs on the same host share the test process's cgroups; one of them starting between a
test's SIGKILL of its daemon and the start of the test's next daemon removes the dead
daemon's groups first (rightly: it proves the owner gone as well), and the test's next
daemon then has nothing to report. Below a cgroup named ``acp-test-…`` (never
``acp-serve.``: no sweep judges it) only the test's own daemons see each other's groups.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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


#: The name of a test's own cgroup starts so (not ``acp-serve.``: no daemon sweeps it).
PRIVATE_PREFIX = "acp-test-"


@dataclass(frozen=True)
class PrivateBase:
    """A test's own cgroup in each hierarchy of :data:`CONTROLLERS` (controller → dir),
    below the test process's own."""

    dirs: dict[str, Path]

    def launcher(self) -> tuple[str, ...]:
        """For :func:`~tests.support.daemon.spawn_daemon`: the daemon moves itself into
        these cgroups before it starts (also as PID 1 of a pid namespace of its own: a
        pid written to ``cgroup.procs`` is read in the writer's namespace)."""
        procs = [str(d / "cgroup.procs") for d in self.dirs.values()]
        code = (
            "import os, sys\n"
            f"for procs in {procs!r}:\n"
            "    with open(procs, 'w') as f:\n"
            "        f.write(str(os.getpid()))\n"
            "from serve.__main__ import main\n"
            "sys.exit(main(sys.argv[1:]))\n"
        )
        return ("-c", code)


@contextmanager
def private_base() -> Iterator[PrivateBase]:
    """A :class:`PrivateBase`, removed at the end with whatever is left in it (only the
    test's own daemons and their agents can be)."""
    name = f"{PRIVATE_PREFIX}{secrets.token_hex(6)}"
    dirs: dict[str, Path] = {}
    try:
        for controller in CONTROLLERS:
            group = own_dir(controller) / name
            group.mkdir()
            dirs[controller] = group
        yield PrivateBase(dirs)
    finally:
        remove(dirs.values())
