"""The file sandbox of an agent child: a Linux Landlock ruleset, planned by the daemon, applied
by the child itself before its ``exec``.

Stdlib only: this module is imported as ``acp.landlock`` by the daemon (ABI detection,
:func:`plan`) and as a plain top-level ``landlock`` by the exec wrapper ``acp/confine.py``
(:func:`apply`), which runs without our packages on its path.

Theory of operation
-------------------
Landlock is an allow-list: once a process restricts itself, every file access of a handled
kind is denied unless a rule on the accessed file *or any directory above it* grants it;
rights of nested rules add up (a rule can never take away what a rule above granted). It is
inherited by every descendant and cannot be undone, and needs no privilege (only
``no_new_privs``, which :func:`apply` sets: a setuid program then does not gain privileges).
Landlock also keeps a sandboxed process from ptrace-reading (``/proc/PID/environ``, ``mem``)
a process outside its sandbox, the daemon, unless it has ``CAP_SYS_PTRACE``: an agent run as
root would, so :func:`apply` drops that capability from the bounding set before the ``exec``.

A child gets two kinds of grants (:func:`plan`):

* **read** (read files, list directories, execute) on ``/``: the agent reads whatever it needs
  to run, wherever it lives (npm caches, virtualenvs, ``/opt``, a checkout);
* **write** (every handled right: create, remove, rename, write, truncate, and read) on its
  write roots: its workspace(s), its private temp directory, its HOME, a few device files.

minus the **protected** locations (the daemon's state directory, its config file, the other
workspaces, the other children's temp directories), which no grant may cover. Because a rule on
a directory covers everything beneath it, a grant root ``R`` with protected paths beneath it is
not granted as a whole but **carved**: the planner walks down from ``R`` along the paths that
lead to protected locations only; at every directory on such a path (a *carved level*) each
existing entry that is neither protected nor leads to one gets its own rule with the grant's
rights, an entry that leads to a protected path is carved in turn, and a protected entry gets
no rule. A carved level itself gets no rule. So, with the default state directory
``~/.local/state/acp-serve`` and HOME a write root:

* ``~/.qwen``, ``~/.npm``, ``~/.local/share``, ``~/.local/state/other`` ... (everything that
  existed at spawn) are readable and writable;
* ``~``, ``~/.local`` and ``~/.local/state`` (the carved levels) cannot be listed, and no entry
  can be created, removed or renamed directly in them (that right would reach the state
  directory beneath them); a path through them still resolves (``open("~/.qwen/x")`` works);
* the state directory cannot be listed, read or written.

**Files created later at a carved level** (by anyone, after the child started) have no rule:
they are invisible to that child (EACCES) until it is spawned again; entries of non-carved
directories are covered by their directory's rule whenever they are created. A grant root
*inside* a protected location (the scripted agent's store inside the state directory) is simply
granted: the most specific rule wins because rights add up.

Symlinks: every path is resolved (``realpath``) before it is planned, so an entry that is a
symlink into a protected location gets no rule, and a rule never lands on a target the planner
did not check.

Rights handled: every file-system right of the kernel's ABI except ``IOCTL_DEV`` (ABI 5, left
unhandled: terminals need ``ioctl`` on ttys). ABI 1 has no ``REFER``: a rename or link across
directories is then always refused (EXDEV); ABI 2 adds it, ABI 3 ``TRUNCATE``. The network and
the scopes (ABI 4, 6) are not restricted. ABI 7 adds nothing for files.

Bounds: a plan holds at most :data:`MAX_RULES` rules (a carved level with more entries, e.g. a
``/tmp`` with tens of thousands of files holding a workspace, is refused with
:class:`PlanError` rather than sandboxed partly).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

#: Rules one plan may hold (each is one ``open`` + one syscall in the child).
MAX_RULES: Final = 16384

# Syscall numbers: the same on every architecture (the unified table, Linux 5.13+).
_SYS_CREATE_RULESET: Final = 444
_SYS_ADD_RULE: Final = 445
_SYS_RESTRICT_SELF: Final = 446
_CREATE_RULESET_VERSION: Final = 1 << 0
_RULE_PATH_BENEATH: Final = 1
_PR_SET_NO_NEW_PRIVS: Final = 38
_PR_CAPBSET_DROP: Final = 24
_CAP_SYS_PTRACE: Final = 19

EXECUTE: Final = 1 << 0
WRITE_FILE: Final = 1 << 1
READ_FILE: Final = 1 << 2
READ_DIR: Final = 1 << 3
REMOVE_DIR: Final = 1 << 4
REMOVE_FILE: Final = 1 << 5
MAKE_CHAR: Final = 1 << 6
MAKE_DIR: Final = 1 << 7
MAKE_REG: Final = 1 << 8
MAKE_SOCK: Final = 1 << 9
MAKE_FIFO: Final = 1 << 10
MAKE_BLOCK: Final = 1 << 11
MAKE_SYM: Final = 1 << 12
REFER: Final = 1 << 13  # ABI 2
TRUNCATE: Final = 1 << 14  # ABI 3
IOCTL_DEV: Final = 1 << 15  # ABI 5 (not handled, see the module docstring)

_ABI1: Final = (1 << 13) - 1
#: Rights that apply to a file (a rule on a non-directory may hold only these).
FILE_RIGHTS: Final = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
READ_RIGHTS: Final = EXECUTE | READ_FILE | READ_DIR


class PlanError(Exception):
    """The sandbox cannot be planned (too many rules)."""


class LandlockError(OSError):
    """A Landlock syscall failed."""


# ---- the kernel -----------------------------------------------------------------------------


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _syscall(libc: ctypes.CDLL, nr: int, *args: object) -> int:
    libc.syscall.restype = ctypes.c_long
    res = int(libc.syscall(ctypes.c_long(nr), *args))
    if res < 0:
        err = ctypes.get_errno()
        raise LandlockError(err, os.strerror(err))
    return res


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is not available (not built, not
    enabled in the LSM list, or no such syscall)."""
    try:
        return _syscall(_libc(), _SYS_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(_CREATE_RULESET_VERSION))  # fmt: skip
    except (OSError, AttributeError):
        return 0


def handled_rights(abi: int) -> int:
    """The file-system rights a ruleset of ``abi`` handles (all but ``IOCTL_DEV``)."""
    rights = _ABI1
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    return rights


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def apply(spec: Mapping[str, Any]) -> None:
    """Restrict the calling process (and all it will start) to ``spec`` (from :func:`plan`):
    ``{"read": [paths], "write": [paths]}``, or ``{"rules_file": path}`` naming a file that
    holds it (a plan too large for one argv string). A path that no longer exists is skipped
    (it needs no rule). Raises on any other failure: the caller must not run the agent then."""
    if "rules_file" in spec:  # a large plan travels in a file (argv has a 128 KiB limit)
        with open(spec["rules_file"], "rb") as f:
            spec = json.loads(f.read())
    libc = _libc()
    abi = abi_version()
    if abi < 1:
        raise LandlockError(errno.EOPNOTSUPP, "Landlock is not available in this kernel")
    handled = handled_rights(abi)
    attr = _RulesetAttr(handled)
    ruleset = _syscall(libc, _SYS_CREATE_RULESET, ctypes.byref(attr),
                       ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))  # fmt: skip
    try:
        grants = [(p, READ_RIGHTS) for p in spec.get("read") or ()]
        grants += [(p, handled) for p in spec.get("write") or ()]
        for path, rights in grants:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except (FileNotFoundError, NotADirectoryError):
                continue
            try:
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    rights &= FILE_RIGHTS
                rule = _PathBeneathAttr(rights & handled, fd)
                _syscall(libc, _SYS_ADD_RULE, ctypes.c_int(ruleset),
                         ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                         ctypes.c_uint32(0))  # fmt: skip
            except LandlockError as exc:
                raise LandlockError(exc.errno, f"cannot add the rule for {path}: {exc.strerror}")
            finally:
                os.close(fd)
        # Root keeps CAP_SYS_PTRACE, with which Landlock lets it read any process's
        # /proc/PID/environ and mem (the daemon's token): drop it from the bounding set, so
        # the exec'd agent never has it. Without CAP_SETPCAP (not root) it is not held.
        if libc.prctl(_PR_CAPBSET_DROP, _CAP_SYS_PTRACE, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            if err != errno.EPERM:
                raise LandlockError(err, f"prctl(PR_CAPBSET_DROP): {os.strerror(err)}")
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise LandlockError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
        _syscall(libc, _SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)


# ---- the plan ---------------------------------------------------------------------------------


def _real(path: str) -> str:
    return os.path.realpath(path)


def _within(path: str, root: str) -> bool:
    """``path`` is ``root`` or beneath it (both real, absolute)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def _carve(
    root: str, protected: Sequence[str], out: list[str], budget: list[int], seen: set[str]
) -> None:
    if any(_within(root, p) for p in protected):
        return  # protected itself (or inside a protected location)
    if not any(_within(p, root) for p in protected):
        out.append(root)
        budget[0] -= 1
        if budget[0] < 0:
            raise PlanError(f"the sandbox needs more than {MAX_RULES} rules")
        return
    if root in seen:
        return  # a symlink loop back to a carved level
    seen.add(root)
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return  # cannot be listed: nothing beneath gets a rule (denied)
    if len(names) > budget[0]:
        raise PlanError(
            f"the sandbox needs more than {MAX_RULES} rules: {root} has {len(names)} entries "
            "and holds a protected location (move the workspaces or the state directory)"
        )
    for name in names:
        # Resolved first: a symlink into a protected location gets no rule, one above it is
        # carved at its target.
        _carve(_real(os.path.join(root, name)), protected, out, budget, seen)


def plan(
    write: Iterable[str],
    protected: Iterable[str],
    *,
    read: Iterable[str] = ("/",),
    extra_write: Iterable[str] = (),
) -> dict[str, Any]:
    """The ruleset spec of a child (see the module docstring): ``read`` roots readable and
    ``write`` roots writable, both carved around ``protected``; ``extra_write`` (device files
    such as ``/dev/null``) granted as they are when they are not protected.

    Blocking (it lists directories): call it from a worker thread. Raises :class:`PlanError`
    beyond :data:`MAX_RULES` rules."""
    prot = sorted({_real(p) for p in protected})
    writes = sorted({_real(w) for w in write})
    # A write root is never protected for its own child, however the lists overlap.
    prot = [p for p in prot if p not in writes]
    budget = [MAX_RULES]
    read_rules: list[str] = []
    for r in sorted({_real(r) for r in read}):
        _carve(r, prot, read_rules, budget, set())
    write_rules: list[str] = []
    for w in writes:
        sub = [p for p in prot if _within(p, w) and p != w]
        if sub:
            _carve(w, sub, write_rules, budget, set())
        else:
            write_rules.append(w)  # inside a protected location: the specific grant wins
            budget[0] -= 1
    for dev in extra_write:
        real = _real(dev)
        if os.path.exists(real) and not any(_within(real, p) for p in prot):
            write_rules.append(real)
            budget[0] -= 1
    if budget[0] < 0:
        raise PlanError(f"the sandbox needs more than {MAX_RULES} rules")
    return {"read": read_rules, "write": write_rules}
