"""cgroup v1 and v2 file logic: find the daemon's own cgroups, make the agents' cgroups.

Pure file operations on paths given by the caller (the kernel's ``/sys/fs/cgroup`` or, in
unit tests, a directory tree of plain files), blocking: callers run them in a worker thread.

Layout (each hierarchy of v1, or the one v2 tree), below the daemon's *own* cgroup ``BASE``
(a container's or a systemd unit's; never the root of a host):

* ``BASE/acp-serve.d-<id>/`` the agents' parent: its memory limit is the aggregate ceiling;
* ``BASE/acp-serve.d-<id>/agent-<n>/`` one leaf per agent child, with the child's limits.

cgroup v2 has the "no internal processes" rule (a cgroup that delegates controllers to its
children holds no process), so the daemon first moves every process of ``BASE`` into the
leaf ``BASE/acp-serve.daemon`` and then enables ``memory pids cpu`` in
``BASE/cgroup.subtree_control`` (and in the agents' parent's).

``<id>`` is a random instance id per daemon start, and the daemon holds a lock on its
parent for its lifetime: which groups are whose, and which a daemon may remove at start, is
:mod:`serve.isolation.owners`'s business. A leaf that exists already when a child's is made
(never expected: the names are not reused) is adopted when empty, else skipped
(:class:`GroupBusy`): a spawn never fails on a leftover.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

#: cgroup v1 reports "no limit" as the largest page-aligned signed 64-bit value.
V1_UNLIMITED_AT: Final = 1 << 62
PREFIX: Final = "acp-serve."
#: The v2 leaf the daemon moves itself into (no internal processes).
DAEMON_LEAF: Final = "acp-serve.daemon"
#: v1 controllers the daemon uses (memory is required; pids and cpu when mounted).
V1_CONTROLLERS: Final = ("memory", "pids", "cpu")
#: cgroup v2 ``memory.high`` is this fraction of ``memory.max`` (throttle before the kill).
V2_HIGH_FRACTION: Final = 0.9
#: rmdir attempts while the killed tasks of a cgroup are still exiting (and their delay, s).
REMOVE_TRIES: Final = 50
REMOVE_DELAY_S: Final = 0.02
#: Tries in a row with no process in sight after which a busy cgroup is given up (its
#: members are in a pid namespace this daemon cannot see: nothing to wait for).
REMOVE_UNSEEN_TRIES: Final = 5

Version = Literal["v1", "v2"]


@dataclass(frozen=True)
class Limits:
    """One agent child's limits; 0 = none."""

    memory_max_bytes: int = 0
    pids_max: int = 0
    cpu_weight: int = 0


def cpu_shares(weight: int) -> int:
    """cgroup v2 ``cpu.weight`` (default 100) as v1 ``cpu.shares`` (default 1024)."""
    return max(2, min(262_144, weight * 1024 // 100))


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/<pid>/cgroup`` → controller → path (the v2 line under the key ``""``)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            out[""] = path
        for name in controllers.split(","):
            if name:
                out[name] = path
    return out


@dataclass(frozen=True)
class Mount:
    point: str
    root: str  # the mount's root inside the hierarchy (a cgroup namespace: "/")
    fstype: str  # cgroup | cgroup2
    options: frozenset[str]
    writable: bool


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup mounts of ``/proc/self/mountinfo``."""
    out: list[Mount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        rest = right.split()
        if len(fields) < 6 or len(rest) < 3 or rest[0] not in ("cgroup", "cgroup2"):
            continue
        opts = set(fields[5].split(",")) | set(rest[2].split(","))
        out.append(
            Mount(
                point=_unescape(fields[4]),
                root=_unescape(fields[3]),
                fstype=rest[0],
                options=frozenset(opts),
                writable="rw" in fields[5].split(","),
            )
        )
    return out


def _unescape(path: str) -> str:
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")


def own_dir(mount: Mount, own_path: str) -> Path:
    """The daemon's own cgroup directory under ``mount`` (``own_path`` from /proc/self/cgroup)."""
    rel = own_path
    if mount.root != "/" and (rel == mount.root or rel.startswith(mount.root + "/")):
        rel = rel[len(mount.root) :]
    return Path(mount.point) / rel.lstrip("/")


def v1_bases(mounts: Iterable[Mount], own: Mapping[str, str]) -> dict[str, Path]:
    """controller → the daemon's own cgroup directory, for the v1 controllers mounted."""
    out: dict[str, Path] = {}
    for mount in mounts:
        if mount.fstype != "cgroup":
            continue
        for name in V1_CONTROLLERS:
            if name in mount.options and name in own and name not in out:
                out[name] = own_dir(mount, own[name])
    return out


def v2_base(mounts: Iterable[Mount], own: Mapping[str, str]) -> Path | None:
    """The daemon's own cgroup v2 directory (above the daemon leaf of an earlier run)."""
    for mount in mounts:
        if mount.fstype == "cgroup2" and "" in own:
            base = own_dir(mount, own[""])
            return base.parent if base.name == DAEMON_LEAF else base
    return None


def v2_usable(base: Path) -> str | None:
    """Why the v2 tree at ``base`` cannot hold the agents' cgroups (None: it can)."""
    try:
        controllers = set((base / "cgroup.controllers").read_text().split())
    except OSError as exc:
        return f"cannot read {base}/cgroup.controllers: {exc.strerror}"
    if "memory" not in controllers:
        return f"the memory controller is not delegated to {base}"
    if not os.access(base, os.W_OK) or not os.access(base / "cgroup.subtree_control", os.W_OK):
        return f"{base} is not writable (no delegation)"
    return None


def v1_usable(bases: Mapping[str, Path]) -> str | None:
    if "memory" not in bases:
        return "no cgroup v1 memory hierarchy"
    for name, base in bases.items():
        if not os.access(base, os.W_OK):
            return f"the cgroup v1 {name} hierarchy at {base} is not writable"
    return None


# ---- reading ----------------------------------------------------------------------------


def read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def read_keyed(path: Path) -> dict[str, int]:
    """A flat keyed file (``memory.events``, ``memory.oom_control``): key → value."""
    out: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return out


def v1_limit(path: Path) -> int | None:
    """A v1 ``*.limit_in_bytes`` as bytes, None for "no limit"."""
    value = read_int(path)
    return None if value is None or value >= V1_UNLIMITED_AT else value


def memory_limit_of(version: Version, base: Path, top: Path) -> int | None:
    """The tightest memory limit on ``base`` and its ancestors up to the mount ``top``."""
    name = "memory.limit_in_bytes" if version == "v1" else "memory.max"
    best: int | None = None
    here = base
    while True:
        value = v1_limit(here / name) if version == "v1" else read_int(here / name)
        if value is not None and (best is None or value < best):
            best = value
        if here == top or here.parent == here or top not in here.parents:
            return best
        here = here.parent


# ---- writing ----------------------------------------------------------------------------


def write(path: Path, value: str | int) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def write_optional(path: Path, value: str | int) -> None:
    """Write a file the kernel may not have (no swap accounting, an older kernel)."""
    try:
        write(path, value)
    except OSError:
        if path.exists():
            raise


def v2_prepare_base(base: Path) -> None:
    """Move every process of ``base`` into the daemon leaf, then delegate the controllers."""
    leaf = base / DAEMON_LEAF
    leaf.mkdir(exist_ok=True)
    for _ in range(10):  # processes forked meanwhile: move them too
        pids = (base / "cgroup.procs").read_text().split()
        for pid in pids:
            try:
                write(leaf / "cgroup.procs", pid)
            except ProcessLookupError:
                continue
        if not pids or _is_plain_tree(base):
            break  # (a unit test's tree: the kernel would have emptied the file)
    v2_enable(base)


def _is_plain_tree(base: Path) -> bool:
    return not str(base).startswith("/sys/fs/cgroup")


def v2_enable(group: Path) -> None:
    try:
        available = set((group / "cgroup.controllers").read_text().split())
    except FileNotFoundError:  # a unit test's tree: what the parent delegates
        text = (group.parent / "cgroup.subtree_control").read_text()
        available = {c.lstrip("+") for c in text.split()}
    wanted = [c for c in ("memory", "pids", "cpu") if c in available]
    if wanted:
        write(group / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))


def make_parent(
    version: Version, bases: Mapping[str, Path], name: str, ceiling_bytes: int | None
) -> dict[str, Path]:
    """The agents' parent in every hierarchy (the ceiling on its memory)."""
    out: dict[str, Path] = {}
    for controller, base in bases.items():
        group = base / name
        group.mkdir(exist_ok=True)
        out[controller] = group
        if controller == "memory" and ceiling_bytes:
            if version == "v1":
                write(group / "memory.limit_in_bytes", ceiling_bytes)
                write_optional(group / "memory.memsw.limit_in_bytes", ceiling_bytes)
            else:
                write(group / "memory.max", ceiling_bytes)
                write_optional(group / "memory.swap.max", 0)
        if version == "v2":
            v2_enable(group)
    return out


class GroupBusy(FileExistsError):
    """A child's cgroup exists already and has processes in it: the caller takes another
    name (nothing in it is touched)."""


def make_child(
    version: Version, parents: Mapping[str, Path], name: str, limits: Limits
) -> dict[str, Path]:
    """One agent child's cgroup in every hierarchy, its limits written; controller → dir.
    An existing empty one is adopted (its limits rewritten); :class:`GroupBusy` when one
    has processes."""
    out: dict[str, Path] = {}
    try:
        for controller, parent in parents.items():
            group = parent / name
            try:
                group.mkdir()
            except FileExistsError:
                if count_members(group):
                    raise GroupBusy(f"{group} exists and has processes in it") from None
            out[controller] = group
            if version == "v1":
                _limit_v1(controller, group, limits)
            else:
                _limit_v2(group, limits)
    except BaseException:
        remove_group(out.values())
        raise
    return out


def _limit_v1(controller: str, group: Path, limits: Limits) -> None:
    if controller == "memory":
        write_optional(group / "memory.swappiness", 0)
        if limits.memory_max_bytes:
            write(group / "memory.limit_in_bytes", limits.memory_max_bytes)
            # memsw (memory + swap) at the same value: no swapping past the cap.
            write_optional(group / "memory.memsw.limit_in_bytes", limits.memory_max_bytes)
    elif controller == "pids" and limits.pids_max:
        write(group / "pids.max", limits.pids_max)
    elif controller == "cpu" and limits.cpu_weight:
        write(group / "cpu.shares", cpu_shares(limits.cpu_weight))


def _limit_v2(group: Path, limits: Limits) -> None:
    if limits.memory_max_bytes:
        write(group / "memory.high", int(limits.memory_max_bytes * V2_HIGH_FRACTION))
        write(group / "memory.max", limits.memory_max_bytes)
        write_optional(group / "memory.swap.max", 0)
        write_optional(group / "memory.oom.group", 1)
    if limits.pids_max:
        write(group / "pids.max", limits.pids_max)
    if limits.cpu_weight:
        write(group / "cpu.weight", limits.cpu_weight)


def set_cpu_weight(version: Version, groups: Mapping[str, Path], weight: int) -> bool:
    """Rewrite a child's CPU weight (v2 ``cpu.weight``, v1 ``cpu.shares``); False when it
    has no cpu controller. OSError when the kernel refuses the write."""
    if version == "v1":
        group = groups.get("cpu")
        if group is None:
            return False
        write(group / "cpu.shares", cpu_shares(weight))
        return True
    group = next(iter(groups.values()), None)
    if group is None or not (group / "cpu.weight").exists():
        return False
    write(group / "cpu.weight", weight)
    return True


def procs_files(version: Version, groups: Mapping[str, Path]) -> tuple[str, ...]:
    """The ``cgroup.procs`` files a child joins (v2: one tree, so one file)."""
    files = [str(g / "cgroup.procs") for g in groups.values()]
    return tuple(files[:1]) if version == "v2" else tuple(files)


@dataclass(frozen=True)
class Usage:
    memory_current: int | None
    memory_peak: int | None
    pids_current: int | None
    oom_kills: int
    #: Times the usage reached this cgroup's own limit (v1 ``memory.failcnt``, v2 ``max``).
    limit_hits: int


def usage(version: Version, groups: Mapping[str, Path]) -> Usage:
    mem = groups.get("memory")
    pids = groups.get("pids")
    if version == "v1":
        current = read_int(mem / "memory.usage_in_bytes") if mem else None
        peak = read_int(mem / "memory.max_usage_in_bytes") if mem else None
        kills = read_keyed(mem / "memory.oom_control").get("oom_kill", 0) if mem else 0
        hits = (read_int(mem / "memory.failcnt") or 0) if mem else 0
        if mem and not hits:  # (failcnt stays 0 on recent kernels: the peak at the limit)
            limit = v1_limit(mem / "memory.limit_in_bytes")
            hits = int(limit is not None and peak is not None and peak >= limit)
    else:
        current = read_int(mem / "memory.current") if mem else None
        peak = read_int(mem / "memory.peak") if mem else None
        events = read_keyed(mem / "memory.events") if mem else {}
        kills = events.get("oom_kill", 0) or events.get("oom_group_kill", 0)
        hits = events.get("max", 0)
    pids_now = read_int(pids / "pids.current") if pids else None
    return Usage(current, peak, pids_now, kills, hits)


def oom_kills(version: Version, group: Path) -> int:
    if version == "v1":
        return read_keyed(group / "memory.oom_control").get("oom_kill", 0)
    events = read_keyed(group / "memory.events")
    return events.get("oom_kill", 0) or events.get("oom_group_kill", 0)


# ---- removing ---------------------------------------------------------------------------


def members(group: Path) -> list[int]:
    """The processes in ``group`` and below, as this daemon's pid namespace sees them (a
    process of another namespace is not listed)."""
    out: list[int] = []
    try:
        out.extend(int(p) for p in (group / "cgroup.procs").read_text().split())
    except (OSError, ValueError):
        pass
    try:
        subs = [p for p in group.iterdir() if p.is_dir()]
    except OSError:
        return out
    for sub in subs:
        out.extend(members(sub))
    return out


def count_members(group: Path) -> int:
    return len(members(group))


def kill_members(group: Path) -> int:
    """SIGKILL every process left in ``group`` (a child's tools outliving it); how many."""
    killed = 0
    try:
        pids = (group / "cgroup.procs").read_text().split()
    except OSError:
        return 0
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, ValueError, PermissionError):
            continue
    return killed


def remove_group(groups: Iterable[Path], *, kill: bool = True) -> list[str]:
    """Remove each group (children first); the errors. ``kill``: SIGKILL what is left in
    it first (only ever for groups this daemon made, or proven abandoned)."""
    errors: list[str] = []
    for group in groups:
        errors.extend(_remove_tree(group, kill))
    return errors


def _remove_tree(group: Path, kill: bool) -> list[str]:
    if not group.is_dir():
        return []
    errors: list[str] = []
    for sub in sorted((p for p in group.iterdir() if p.is_dir()), reverse=True):
        errors.extend(_remove_tree(sub, kill))
    plain = _is_plain_tree(group)
    unseen = 0
    for attempt in range(REMOVE_TRIES):
        if kill and not plain:
            unseen = 0 if kill_members(group) else unseen + 1
        try:
            if plain:  # a unit test's tree: its "interface files" are plain files
                for f in group.iterdir():
                    if f.is_file():
                        f.unlink()
            group.rmdir()
            return errors
        except FileNotFoundError:
            return errors
        except OSError as exc:
            # (a child left behind keeps it busy for ever: no point waiting)
            hopeless = errors or not kill or unseen >= REMOVE_UNSEEN_TRIES
            if attempt == REMOVE_TRIES - 1 or hopeless:
                errors.append(f"cannot remove {group}: {exc.strerror}")
                return errors
            time.sleep(REMOVE_DELAY_S)
    return errors
