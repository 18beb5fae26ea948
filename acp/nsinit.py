"""An agent child in a pid namespace of its own: its own ``/proc``, a tiny init, its uid.

Stdlib only: imported as ``acp.nsinit`` by the daemon (constants) and as a plain top-level
``nsinit`` by the exec wrapper ``acp/confine.py``, which runs without our packages.

Theory of operation
-------------------
A process can never change its own pid namespace: ``unshare(CLONE_NEWPID)`` only puts the
*next* child in a new one, as its pid 1. So a confined child with ``pid_namespace`` is three
processes::

    daemon ── P  the wrapper, the daemon's own child (its pid is the agent's pid for the
               │ daemon: cgroup, OOM score, stderr pipe, exit status, process group)
               └── C  pid 1 of the new namespace: a Python init (reaps, forwards signals)
                    └── A  the agent (pid 2 inside), exec'd after its sandbox and uid

1. **P** has already joined the cgroups and set the OOM score (``confine.py``). It calls
   ``unshare(CLONE_NEWPID | CLONE_NEWNS)`` (plus ``CLONE_NEWUSER`` with an identity map of
   its own uid when it is not root, so that it holds the capabilities this needs), forks
   **C**, points its stdin/stdout at ``/dev/null`` (the agent's pipes are then held by the
   agent alone) and waits for C. A signal P gets (the daemon's ``killpg`` of P's group:
   SIGTERM, SIGINT, SIGHUP ...) is forwarded to C. When C has exited, P ends the way the
   agent ended: with its exit status, or killed by the same signal (C reports the agent's
   wait status through a pipe, since a pid 1 cannot kill itself with a signal).
2. **C** asks the kernel for ``SIGKILL`` when P dies (``PR_SET_PDEATHSIG``; and checks that
   P did not die before), makes every mount private, mounts a fresh ``/proc`` (which shows
   this namespace's processes only), leaves P's process group (``setsid``: the daemon's group
   kill reaches P, which forwards), forks **A**, and then only waits: every process of the
   namespace orphaned on the way is re-parented to C and reaped by it; a forwarded signal
   goes to every process of the namespace (``kill(-1, sig)``). The forwarded signals are
   blocked from before the fork until each process has its handlers: one sent meanwhile
   waits and is forwarded then (the agent gets them unblocked, with default handlers).
   When A exits, the rest of the namespace gets SIGTERM and :data:`LEFTOVER_GRACE_S` to go,
   C reports A's status to P and exits, and the kernel SIGKILLs whatever is left (the end
   of a namespace's pid 1 ends all of it, even a descendant that left every process group).
3. **A** restores the default signal dispositions, applies the file sandbox, drops to the
   spec's uid and gid when given (``setgroups([])``, ``setresgid``, ``setresuid``: after the
   sandbox, whose rules are opened with the daemon's rights), and ``exec``s the agent.

So SIGKILL of P (the daemon's escalation, a chaos test's ``kill -9 <agentPid>``) kills C
(its parent-death signal), and C's death kills the whole namespace: nothing survives. The
daemon reaps P as before and C as an adopted orphan (it is a child subreaper).

A root agent (no uid given) would keep ``CAP_SYS_ADMIN`` and could unmount the new
``/proc`` to see the daemon's: A drops that capability from its bounding set (as the
sandbox drops ``CAP_SYS_PTRACE``), so after the ``exec`` the agent has neither.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Final, NoReturn

#: Signals P forwards to C and C to the namespace (the rest keep their default).
FORWARDED: Final = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGWINCH,
)
#: After the agent exited: how long the rest of the namespace has after SIGTERM (seconds).
LEFTOVER_GRACE_S: Final = 0.5

_MS_NOSUID: Final = 2
_MS_NODEV: Final = 4
_MS_NOEXEC: Final = 8
_MS_REC: Final = 16384
_MS_PRIVATE: Final = 1 << 18
_PR_SET_PDEATHSIG: Final = 1
_PR_CAPBSET_DROP: Final = 24
_CAP_SYS_ADMIN: Final = 21

Fail = Callable[[str], NoReturn]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount_proc(libc: ctypes.CDLL) -> None:
    _check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make mounts private")
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    _check(libc.mount(b"proc", b"/proc", b"proc", flags, None), "mount /proc")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _unshare(userns: bool) -> None:
    flags = os.CLONE_NEWPID | os.CLONE_NEWNS
    uid, gid = os.getuid(), os.getgid()
    if userns:
        flags |= os.CLONE_NEWUSER
    os.unshare(flags)
    if userns:  # an identity map of our own uid: the agent's files keep their owner
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")


def drop_to(uid: int | None, gid: int | None) -> None:
    """Become ``uid``/``gid`` for good (no supplementary groups); nothing when both are None."""
    if gid is not None or uid is not None:
        gid = gid if gid is not None else (uid if uid is not None else os.getgid())
        os.setgroups([])
        os.setresgid(gid, gid, gid)
    if uid is not None:
        os.setresuid(uid, uid, uid)


def _status_of(wait_status: int) -> int:
    """``waitpid``'s status as Popen's return code (negative: killed by that signal)."""
    return os.waitstatus_to_exitcode(wait_status)


def _end_like(code: int) -> NoReturn:
    """End this process with exit status ``code``, or killed by signal ``-code``."""
    if code >= 0:
        os._exit(code)
    sig = -code
    try:
        import resource  # the agent's core dump already happened (or not); not ours

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, OSError, ValueError):
        pass
    try:
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    except (OSError, ValueError):
        pass
    os.kill(os.getpid(), sig)
    time.sleep(0.1)  # a stop signal, or one the kernel ignores: exit like a shell reports it
    os._exit(128 + sig)


def run(agent: Callable[[], NoReturn], *, userns: bool, fail: Fail) -> NoReturn:
    """Run ``agent`` (which applies the sandbox, the uid, and ``exec``s) as pid 2 of a new pid
    namespace under an init; this process (P) waits and ends as the agent did."""
    try:
        _unshare(userns)
    except OSError as exc:
        fail(f"cannot make a pid namespace: {exc}")
    status_r, status_w = os.pipe()  # C -> P: the agent's wait status
    alive_r, alive_w = os.pipe()  # P holds the write end: C sees EOF once P is gone
    # Held until each process has its handlers (a signal sent meanwhile waits, then goes on).
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    init = os.fork()
    if init == 0:
        os.close(status_r)
        os.close(alive_w)
        _init(agent, status_w, alive_r, fail)
    os.close(status_w)
    os.close(alive_r)
    _quiet_stdio()

    def forward(sig: int, _frame: object) -> None:
        try:
            os.kill(init, sig)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    _, wait_status = os.waitpid(init, 0)  # EINTR: retried after the handler ran (PEP 475)
    report = b""
    while chunk := os.read(status_r, 64):
        report += chunk
    try:
        code = int(report) if report else _status_of(wait_status)
    except ValueError:
        code = _status_of(wait_status)
    _end_like(code)


def _quiet_stdio() -> None:
    """Point stdin and stdout at ``/dev/null``: the agent alone holds the daemon's pipes, so
    they close when it exits (stderr stays, for this wrapper's own messages)."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)


def _init(agent: Callable[[], NoReturn], status_w: int, alive_r: int, fail: Fail) -> NoReturn:
    """C: pid 1 of the namespace (see the module docstring)."""
    libc = _libc()
    try:
        _check(libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")
        os.set_blocking(alive_r, False)
        try:
            if os.read(alive_r, 1) == b"":
                os._exit(1)  # P died before the death signal was armed
        except BlockingIOError:
            pass
        _mount_proc(libc)
        os.setsid()
    except OSError as exc:
        fail(f"cannot set up the pid namespace: {exc}")
    main = os.fork()
    if main == 0:
        os.close(status_w)
        os.close(alive_r)
        agent()
    _quiet_stdio()

    def forward(sig: int, _frame: object) -> None:
        try:
            os.kill(-1, sig)  # from pid 1: every process of the namespace but itself
        except OSError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    while True:
        try:
            pid, wait_status = os.waitpid(-1, 0)
        except ChildProcessError:  # cannot happen while the agent lives
            wait_status = 0
            break
        if pid == main:
            break
    code = _status_of(wait_status)
    _end_rest()
    os.write(status_w, str(code).encode())
    os._exit(0)


def _end_rest() -> None:
    """SIGTERM what is left of the namespace and reap it for a short grace; the kernel
    SIGKILLs the rest when this init exits."""
    try:
        os.kill(-1, signal.SIGTERM)
    except OSError:
        return  # nobody left
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            return
        if pid == 0:
            time.sleep(0.01)


def agent_setup(uid: int | None, gid: int | None, *, as_root: bool) -> None:
    """In A, after the sandbox: a root agent loses ``CAP_SYS_ADMIN`` (it could unmount the
    namespace's ``/proc``), then it becomes ``uid``/``gid`` when given."""
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)  # blocked by run(): not for the agent
    if as_root and uid is None:
        libc = _libc()
        if libc.prctl(_PR_CAPBSET_DROP, _CAP_SYS_ADMIN, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            if err != errno.EPERM:
                raise OSError(err, f"drop CAP_SYS_ADMIN: {os.strerror(err)}")
    drop_to(uid, gid)


def probe() -> int:
    """Exit 0 when this process could run an agent in a pid namespace (the daemon's start-up
    check: ``python -I -S nsinit.py [--userns]``)."""
    userns = "--userns" in sys.argv[1:]

    def fail(msg: str) -> NoReturn:
        os.write(2, f"{msg}\n".encode())
        os._exit(126)

    def agent() -> NoReturn:
        os._exit(0 if os.getpid() == 2 and os.path.exists("/proc/2") else 3)

    run(agent, userns=userns, fail=fail)


if __name__ == "__main__":
    probe()
