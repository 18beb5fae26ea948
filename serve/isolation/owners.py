"""Who owns an agents' parent cgroup, proven across pid namespaces, mount namespaces and pid
reuse: the name a daemon gives its group, the lock it holds on it, and the sweep at start
that removes only the groups whose owner is provably gone.

Several daemons can share one host's cgroup hierarchies (two pods on a node with a shared
``/sys/fs/cgroup``, a daemon per scenario of a test rig, a PID-1 daemon in a container
beside a host daemon). A pid says nothing across those: a PID-1 daemon sees none of the
others' pids, and two of them are both pid 1. So:

* **Name**: ``acp-serve.d-<16 hex>``, a random 64-bit instance id drawn at each start;
  no two daemons draw the same one, whatever pid namespace they run in. (The ``d-``
  keeps older daemons, which parse ``acp-serve.<pid>``, from ever reading it as a pid.)
* **Proof of life**: the owner holds an exclusive ``flock`` on each of its group
  directories (one ``O_CLOEXEC`` fd per hierarchy, opened at creation, kept until the
  groups are removed at exit). The lock lives on the cgroupfs node itself, so every daemon
  that can see the directory sees the lock, whatever its mount, pid or cgroup namespace:
  no path outside the hierarchy has to be shared (a container's ``/run`` and state dir
  are its own; the cgroup directory is the one thing two daemons fighting over it both
  see). The kernel drops the lock when the owner's last fd closes: at exit, and on a
  SIGKILL or a crash. A daemon that takes the lock has proven the owner gone; one that
  gets ``EWOULDBLOCK`` has proven it alive.
* **Owner record**: the ``user.acp-serve.owner`` xattr of the directory (JSON: pid, pid
  namespace inode, hostname, start time), shown for groups left alone; information for
  an operator, never a proof (a kernel without cgroupfs user xattrs: no record).
* **Claim** (race-free against a concurrent sweep): ``mkdir`` (exclusive), open, ``flock``
  non-blocking, then the path must still be the opened directory. A sweeper that locked
  the new directory first (and removes it: it is empty) makes one of these steps fail;
  the claim then draws a new id.

The sweep at start, for each ``acp-serve.*`` directory below the daemon's own cgroup in
each hierarchy (the v2 leaf ``acp-serve.daemon`` is never touched):

* an **instance group** whose lock it takes is a dead daemon's: what is left in it (that
  daemon's agents and their tools) is SIGKILLed and the tree removed, the lock held until
  the ``rmdir``. A locked one is a live daemon's: left alone, silently counted.
* a **legacy group** ``acp-serve.<pid>[.<n>]`` (an older daemon: no lock, a pid of
  unknown namespace) is removed only when both hold: no process is in its tree (nothing
  is signalled), and the pid is provably in use by nobody: this daemon sees every pid of
  the host (its ``/proc`` is the initial pid namespace's) and no process has that pid at
  any level of its ``NSpid``. Otherwise it is left alone (a PID-1 daemon in a container
  never removes one; nor does anyone remove ``acp-serve.1``, pid 1 being always in use):
  logged once at start and listed in ``/daemon/status`` ``isolation.groups.leftAlone``
  with the reason, for the operator to remove by hand.
* any other ``acp-serve.*`` name: left alone, listed.

Blocking file operations: callers run them in a worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import os
import secrets
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from serve.isolation import cgroups

#: The instance id's marker after :data:`cgroups.PREFIX` (never digits: not a legacy pid).
INSTANCE_MARK: Final = "d-"
#: The owner record's extended attribute.
OWNER_XATTR: Final = "user.acp-serve.owner"
#: The initial pid namespace's inode (the kernel's ``PROC_PID_INIT_INO``).
PROC_PID_INIT_INO: Final = 0xEFFFFFFC
#: Claims tried with a fresh id before giving up (a collision needs a concurrent sweeper).
CLAIM_TRIES: Final = 8
#: Entries kept in each list of the sweep's report (the rest are counted).
REPORT_MAX: Final = 64
#: Bytes of an owner record read at most.
RECORD_MAX_BYTES: Final = 1024


class ClaimError(OSError):
    """No agents' parent could be claimed (:data:`CLAIM_TRIES` ids collided)."""


def new_name() -> str:
    return f"{cgroups.PREFIX}{INSTANCE_MARK}{secrets.token_hex(8)}"


def is_instance(name: str) -> bool:
    tail = name[len(cgroups.PREFIX) :] if name.startswith(cgroups.PREFIX) else ""
    hexpart = tail[len(INSTANCE_MARK) :]
    return (
        tail.startswith(INSTANCE_MARK)
        and len(hexpart) == 16
        and all(c in "0123456789abcdef" for c in hexpart)
    )


def legacy_pid(name: str) -> int | None:
    """The daemon pid in an older daemon's ``acp-serve.<pid>[.<n>]`` (None: not one)."""
    if not name.startswith(cgroups.PREFIX):
        return None
    parts = name[len(cgroups.PREFIX) :].split(".")
    if len(parts) > 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0])


# ---- the lock ---------------------------------------------------------------------------


def _open_dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def try_lock(path: Path) -> int | None:
    """An fd of ``path`` holding its exclusive flock, or None when another holds it.
    OSError when the directory cannot be opened (gone, no permission)."""
    fd = _open_dir(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    return fd


def _same_dir(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def owner_record(proc: str = "/proc") -> dict[str, Any]:
    record: dict[str, Any] = {
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "startedAt": int(time.time()),
    }
    with contextlib.suppress(OSError):
        record["pidNs"] = os.stat(f"{proc}/self/ns/pid").st_ino
    return record


def read_record(path: Path) -> dict[str, Any] | None:
    try:
        raw = os.getxattr(path, OWNER_XATTR)[:RECORD_MAX_BYTES]
        value = json.loads(raw)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


@dataclass
class Claim:
    """This daemon's agents' parent: its name and the locks it holds (controller → fd)."""

    name: str
    locks: dict[str, int] = field(default_factory=dict)

    def release(self) -> None:
        for fd in self.locks.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.locks = {}


def claim(bases: Mapping[str, Path], *, proc: str = "/proc") -> Claim:
    """A fresh agents' parent directory in every hierarchy of ``bases``, each locked for
    this daemon's lifetime (see the module docstring). OSError when a base refuses."""
    record = json.dumps(owner_record(proc)).encode()
    for _ in range(CLAIM_TRIES):
        name = new_name()
        got = Claim(name)
        try:
            for controller, base in bases.items():
                group = base / name
                group.mkdir()
                fd = try_lock(group)
                if fd is None or not _same_dir(fd, group):
                    if fd is not None:
                        os.close(fd)
                    raise FileExistsError(errno.EEXIST, "taken by a sweeper", str(group))
                got.locks[controller] = fd
                with contextlib.suppress(OSError):
                    os.setxattr(group, OWNER_XATTR, record)
        except (FileExistsError, FileNotFoundError):
            # Another daemon's sweep took the new directory (or, never seen, the id was
            # drawn twice): what this claim made is removed, a new id drawn.
            _abandon(bases, got)
            continue
        except BaseException:
            _abandon(bases, got)
            raise
        return got
    raise ClaimError(errno.EEXIST, f"no free agents' cgroup name after {CLAIM_TRIES} tries")


def _abandon(bases: Mapping[str, Path], got: Claim) -> None:
    groups = [bases[c] / got.name for c in got.locks]
    got.release()
    cgroups.remove_group(groups, kill=False)


# ---- the sweep --------------------------------------------------------------------------


@dataclass
class Sweep:
    """What the start-up sweep did: removed (owner proven gone) and left alone (why)."""

    removed: list[dict[str, Any]] = field(default_factory=list)
    left_alone: list[dict[str, Any]] = field(default_factory=list)
    #: Groups of live daemons (their owner holds the lock): left alone, counted.
    live: int = 0
    removed_total: int = 0
    left_alone_total: int = 0

    def remove(self, path: Path, why: str, killed: int) -> None:
        self.removed_total += 1
        if len(self.removed) < REPORT_MAX:
            self.removed.append({"path": str(path), "why": why, "killed": killed})

    def leave(self, path: Path, why: str) -> None:
        self.left_alone_total += 1
        if len(self.left_alone) < REPORT_MAX:
            entry: dict[str, Any] = {"path": str(path), "why": why}
            owner = read_record(path)
            if owner is not None:
                entry["owner"] = owner
            self.left_alone.append(entry)

    def status(self) -> dict[str, Any]:
        return {
            "removedAtStart": self.removed,
            "removedAtStartTotal": self.removed_total,
            "leftAlone": self.left_alone,
            "leftAloneTotal": self.left_alone_total,
            "liveOthers": self.live,
        }


def sweep(bases: Iterable[Path], *, proc: str = "/proc") -> Sweep:
    """Judge every ``acp-serve.*`` group under each base (see the module docstring)."""
    out = Sweep()
    legacy = _LegacyJudge(proc)
    for base in bases:
        try:
            entries = sorted(p for p in base.iterdir() if p.name.startswith(cgroups.PREFIX))
        except OSError:
            continue
        for group in entries:
            if group.name == cgroups.DAEMON_LEAF or not group.is_dir():
                continue
            if is_instance(group.name):
                _judge_instance(group, out)
            elif (pid := legacy_pid(group.name)) is not None:
                _judge_legacy(group, pid, legacy, out)
            else:
                out.leave(group, "not a name this daemon gives its groups")
    return out


def _judge_instance(group: Path, out: Sweep) -> None:
    try:
        fd = try_lock(group)
    except FileNotFoundError:
        return  # removed meanwhile (by its owner or another sweeper)
    except OSError as exc:
        out.leave(group, f"cannot open it to test its owner's lock: {exc.strerror}")
        return
    if fd is None:
        out.live += 1
        return
    try:
        if not _same_dir(fd, group):
            return  # replaced meanwhile: judged at the next start
        killed = cgroups.count_members(group)
        errors = cgroups.remove_group([group], kill=True)
        unseen = bool(errors) and cgroups.count_members(group) == 0
    finally:
        os.close(fd)
    if unseen:
        # (a daemon in a pid namespace of its own: the members are outside it)
        why = "its owner is gone but processes this daemon cannot see are still in it"
        out.leave(group, f"{why} ({errors[0]})")
    elif errors:
        out.leave(group, "its owner is gone but it cannot be removed: " + errors[0])
    else:
        out.remove(group, "its owner is gone (its lock was free)", killed)


class _LegacyJudge:
    """Whether an older daemon's pid is provably in use by nobody on this host (each
    answer read once per sweep)."""

    def __init__(self, proc: str) -> None:
        self.proc = proc

    @functools.cached_property
    def blind(self) -> str | None:
        """Why this daemon cannot see every pid of the host (None: it can)."""
        return _why_blind(self.proc)

    @functools.cached_property
    def _in_use(self) -> set[int]:
        return pids_in_use(self.proc)

    def in_use(self, pid: int) -> bool:
        return pid in self._in_use


def _why_blind(proc: str) -> str | None:
    """None when this daemon is in the initial pid namespace and ``proc`` is that
    namespace's (its ``self`` is this daemon's own pid): then it lists every process."""
    try:
        own = os.stat(f"{proc}/self/ns/pid").st_ino
        self_pid = os.readlink(f"{proc}/self")
    except OSError as exc:
        return f"its pid namespace cannot be read ({exc.strerror})"
    if own != PROC_PID_INIT_INO:
        return "this daemon runs in a pid namespace of its own and cannot see every pid"
    if self_pid != str(os.getpid()):
        return f"{proc} is not its pid namespace's and cannot show every pid"
    return None


def pids_in_use(proc: str = "/proc") -> set[int]:
    """Every pid any process has in any pid namespace (``NSpid`` of each process)."""
    out: set[int] = set()
    for entry in _proc_entries(proc):
        try:
            with open(f"{proc}/{entry}/status") as f:
                for line in f:
                    if line.startswith("NSpid:"):
                        out.update(int(p) for p in line.split()[1:])
                        break
        except (OSError, ValueError):
            out.add(int(entry))  # (exited meanwhile: its pid counts as used)
    return out


def _proc_entries(proc: str) -> Iterator[str]:
    try:
        with os.scandir(proc) as it:
            yield from (e.name for e in it if e.name.isdigit())
    except OSError:
        return


def _judge_legacy(group: Path, pid: int, judge: _LegacyJudge, out: Sweep) -> None:
    members = cgroups.count_members(group)
    if members:
        procs = f"{members} process" + ("es" if members != 1 else "")
        out.leave(group, f"an older daemon's group (no owner lock) with {procs} in it")
        return
    blind = judge.blind
    if blind is not None:
        out.leave(group, f"an older daemon's group (no owner lock): {blind}")
        return
    if judge.in_use(pid):
        out.leave(group, f"an older daemon's group (no owner lock): pid {pid} is in use")
        return
    errors = cgroups.remove_group([group], kill=False)
    if errors:
        out.leave(group, "an older daemon's group, empty, cannot be removed: " + errors[0])
    else:
        out.remove(group, f"an older daemon's empty group: pid {pid} is in use by nobody", 0)
