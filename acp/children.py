"""Every child process of the daemon: spawned through here, adopted orphans reaped here.

Theory of operation
-------------------
The daemon makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``, see
:func:`become_subreaper`), and in a container it is PID 1 anyway: either way every orphaned
descendant (an agent's grandchild whose parent exited) is re-parented to the daemon, and
unless someone waits for it, it stays a zombie for the life of the pod.

Two kinds of children therefore exist:

* **ours**: processes the daemon spawned with :func:`open_process` (agents, terminals, shell
  commands, preflight probes). trio waits for each of them by pid, so nobody else may: a
  stray ``waitpid`` would steal the exit status (``Popen`` then reports exit code 0).
  :func:`open_process` records each one (a weak reference to its ``trio.Process``) until
  trio has collected its status.
* **adopted**: everything else whose parent is the daemon. :func:`reap_adopted` collects the
  exit status of those that have exited (``waitpid(pid, WNOHANG)`` per pid, never
  ``waitpid(-1)``), and :func:`run_reaper` does so every ``interval_s`` seconds.

The ownership check and the ``waitpid`` run in the trio thread with no checkpoint between
them, and a pid is recorded before :func:`open_process` returns, so no status of ours can be
taken in between. Scanning ``/proc`` for the daemon's children runs in a worker thread.

Descendants that leave an agent's process group (``setsid()``) cannot be found by the group
kill. Each agent gets a marker in its environment (:func:`agent_marker`), which descendants
inherit; :func:`marked_descendants` finds the daemon's descendants that carry it, so the
agent's teardown can kill them too.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import subprocess
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import trio
import trio.lowlevel

from acp import procfs

log = logging.getLogger(__name__)

#: Environment variable carrying an agent's marker to all of its descendants.
MARKER_ENV: Final = "ACP_SERVE_AGENT_MARKER"
#: How often :func:`run_reaper` collects exited adopted children (seconds).
REAP_INTERVAL_S: Final = 1.0

_ours: dict[int, weakref.ref[trio.Process]] = {}


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux), so orphaned descendants are re-parented
    to it and can be reaped; returns whether it worked. A daemon-wide decision: the entry
    point calls it once at start-up."""
    try:
        import ctypes  # lazy: only the daemon's start-up needs ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_child_subreaper = 36
        return bool(libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def become_undumpable() -> bool:
    """Make this process non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``): its ``/proc/<pid>/``
    ``environ``, ``mem`` and ``maps`` then need ``CAP_SYS_PTRACE``, which agents do not have
    (a root agent loses it before its exec), so an agent running as the daemon's uid cannot
    read the daemon's token from its environment or memory. Children are unaffected: an
    ``exec`` makes a process dumpable again. Costs the daemon its core dumps. Returns whether
    it worked."""
    try:
        import ctypes  # lazy: only the daemon's start-up needs ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_dumpable = 4
        return bool(libc.prctl(pr_set_dumpable, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


async def open_process(
    command: Sequence[str],
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    stdin: int | None = None,
    stdout: int | None = None,
    stderr: int | None = None,
    start_new_session: bool = False,
) -> trio.Process:
    """``trio.lowlevel.open_process``, recording the child as ours (see the module doc)."""
    proc = await trio.lowlevel.open_process(
        command,
        cwd=cwd,
        env=env,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=start_new_session,
    )
    _ours[proc.pid] = weakref.ref(proc)
    return proc


async def run_process(
    command: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run ``command`` to completion as one of ours (stdin ``/dev/null``, stdout and stderr
    captured); cancelling it kills the child and waits for it."""
    proc = await open_process(
        list(command),
        env=None if env is None else dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out = bytearray()
    err = bytearray()

    async def drain(stream: trio.abc.ReceiveStream | None, into: bytearray) -> None:
        if stream is not None:
            async with stream:
                while chunk := await stream.receive_some(65536):
                    into += chunk

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain, proc.stdout, out)
            nursery.start_soon(drain, proc.stderr, err)
            await proc.wait()
    except BaseException:
        with trio.CancelScope(shield=True):
            proc.kill()
            await proc.wait()
        raise
    assert proc.returncode is not None
    return subprocess.CompletedProcess(list(command), proc.returncode, bytes(out), bytes(err))


def is_ours(pid: int) -> bool:
    """True while trio may still wait for ``pid`` (a child spawned by :func:`open_process`)."""
    ref = _ours.get(pid)
    if ref is None:
        return False
    proc = ref()
    if proc is None or proc.returncode is not None:
        del _ours[pid]
        return False
    return True


def children_of(pid: int) -> list[int]:
    """Pids whose parent is ``pid``, zombies included (blocking, run it in a thread): its
    ``/proc/<pid>/task/*/children``, else a ``/proc`` scan (:mod:`acp.procfs`)."""
    found = procfs.children(pid)
    if found is not None:
        return found
    return [child for child, parent in _parents().items() if parent == pid]


def _parents() -> dict[int, int]:
    return {pid: ppid for pid, _state, ppid, _pgid in procfs.stats()}


def reap(pids: Iterable[int]) -> list[tuple[int, int]]:
    """Collect the exit status of each exited pid of ``pids`` that is not ours (never
    blocks); returns ``(pid, status)`` of those reaped."""
    reaped: list[tuple[int, int]] = []
    for pid in pids:
        if is_ours(pid):
            continue
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue  # not our child (any more)
        except OSError as exc:
            if exc.errno != errno.EINTR:
                log.debug("waitpid(%d): %s", pid, exc)
            continue
        if done:
            reaped.append((done, status))
    return reaped


#: Threads for leftover-process scans (``/proc`` walks), apart from trio's default limiter
#: so that slow file work elsewhere cannot delay a session's teardown, nor the reverse.
PROCESS_SCAN_THREADS = 2
_scan_limiters: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("scan_threads")


def scan_limiter() -> trio.CapacityLimiter:
    try:
        return _scan_limiters.get()
    except LookupError:
        limiter = trio.CapacityLimiter(PROCESS_SCAN_THREADS)
        _scan_limiters.set(limiter)
        return limiter


async def reap_adopted() -> list[tuple[int, int]]:
    """Reap every exited adopted child of this process."""
    candidates = await trio.to_thread.run_sync(children_of, os.getpid(), limiter=scan_limiter())
    reaped = reap(candidates)  # in the trio thread: no checkpoint after the ownership check
    for pid, status in reaped:
        log.debug("reaped adopted process %d (status %#x)", pid, status)
    return reaped


async def run_reaper(
    interval_s: float = REAP_INTERVAL_S,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Reap adopted children every ``interval_s`` seconds, until cancelled."""
    task_status.started()
    while True:
        await reap_adopted()
        await trio.sleep(interval_s)


def agent_marker() -> str:
    """A fresh marker value for one agent's environment (:data:`MARKER_ENV`)."""
    return secrets.token_hex(8)


def marked_descendants(root: int, marker: str) -> list[int]:
    """Live descendants of ``root`` whose environment holds ``MARKER_ENV=marker`` (blocking:
    a ``/proc`` scan; run it in a thread). Zombies are left to the reaper."""
    parents = _parents()
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    needle = f"{MARKER_ENV}={marker}".encode()
    found: list[int] = []
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, ()))
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(pid)
    return found


__all__ = [
    "MARKER_ENV",
    "REAP_INTERVAL_S",
    "agent_marker",
    "become_subreaper",
    "children_of",
    "is_ours",
    "marked_descendants",
    "open_process",
    "reap",
    "reap_adopted",
    "run_process",
    "run_reaper",
]
