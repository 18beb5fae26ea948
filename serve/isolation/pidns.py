"""Agents in pid namespaces of their own: whether the daemon can, and what it does.

Theory of operation
-------------------
``--agent-pid-namespace auto|on|off`` (default ``auto``). When in force, every agent child,
every terminal command the daemon runs for an agent, and every session shell command is
started in a new pid namespace with its own ``/proc`` under a tiny init (``acp/nsinit.py``
has the three processes and how signals, exit status and the kill of the tree go): from
inside, ``/proc`` lists that tree only, so neither the daemon (``/proc/<pid>/cmdline``,
``environ``) nor another tenant's processes can be seen at all.

Whether the kernel allows it is found once, by a probe (:func:`probe`: the wrapper run for
real with an agent that checks it is pid 2 and sees its own ``/proc``): as root directly;
otherwise inside a user namespace that maps the daemon's uid to itself (unprivileged user
namespaces; a kernel or a container that forbids them, or a ``/proc`` with masked paths,
which the kernel then refuses to mount again, fails the probe). ``auto`` without it runs
agents as before (and ``/daemon/status`` ``isolation.pidNamespace`` says why); ``on``
without it refuses to start.

Terminals and the session shell get a namespace of their own each rather than the agent's:
they are the daemon's children (the daemon runs them for the agent, kills them by process
group, reads their exit status), and joining the agent's namespace would need its mount
namespace too (for the right ``/proc``); the agent sees its own processes, a terminal sees
its command's. The same uid, sandbox and cgroups apply to them as to the agent.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import trio

from acp import nsinit

if TYPE_CHECKING:
    from serve.settings import Settings

from serve.settings.values import PID_NAMESPACE_MODES as MODES

#: The probe's bound (seconds): a wrapper start plus two forks.
PROBE_TIMEOUT_S: Final = 10.0
NSINIT_PY: Final = os.path.abspath(nsinit.__file__)


@dataclass(frozen=True)
class PidNamespaceMode:
    """What is in force: ``requested`` (the flag), ``active``, ``user_namespace`` (the
    namespace is made inside a user namespace: the daemon is not root), why not (``reason``)."""

    requested: str
    active: bool
    user_namespace: bool = False
    reason: str | None = None


@functools.cache
def probe(userns: bool) -> str | None:
    """None when an agent can run in a pid namespace (with a user namespace: ``userns``),
    else why not. Blocking (a child process, about 30 ms); cached for the daemon's life."""
    argv = [sys.executable, "-I", "-S", NSINIT_PY, *(["--userns"] if userns else [])]
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the probe failed: {exc}"
    if done.returncode == 0:
        return None
    why = done.stderr.decode("utf-8", "replace").strip().splitlines()
    return why[-1] if why else f"the probe exited with status {done.returncode}"


def resolve(requested: str) -> PidNamespaceMode:
    """The mode ``requested`` gets on this machine (blocking: the probe, once)."""
    if requested == "off":
        return PidNamespaceMode(requested, False, reason="--agent-pid-namespace off")
    if not hasattr(os, "unshare"):
        return PidNamespaceMode(requested, False, reason="no unshare(2) on this platform")
    userns = os.geteuid() != 0
    why = probe(userns)
    if why is not None:
        how = "in a user namespace" if userns else "as root"
        return PidNamespaceMode(requested, False, userns, f"cannot make one {how}: {why}")
    return PidNamespaceMode(requested, True, userns)


_resolved: dict[str, PidNamespaceMode] = {}


def current(settings: Settings) -> PidNamespaceMode | None:
    """The mode once resolved (None before the first spawn or start-up check: no I/O)."""
    return _resolved.get(settings.agent_pid_namespace)


def resolve_now(settings: Settings) -> PidNamespaceMode:
    """Resolve (blocking, once per mode): the daemon's start-up calls it before the event loop."""
    mode = _resolved.get(settings.agent_pid_namespace)
    if mode is None:
        mode = _resolved[settings.agent_pid_namespace] = resolve(settings.agent_pid_namespace)
    return mode


async def mode(settings: Settings) -> PidNamespaceMode:
    """:func:`resolve_now` in a worker thread when not yet known."""
    known = current(settings)
    if known is not None:
        return known
    return await trio.to_thread.run_sync(resolve_now, settings)


def status(settings: Settings) -> dict[str, Any]:
    """``/daemon/status`` ``isolation.pidNamespace``."""
    known = current(settings)
    out: dict[str, Any] = {"mode": settings.agent_pid_namespace}
    if known is None:
        out["active"] = None  # not probed yet (no agent spawned)
        return out
    out["active"] = known.active
    if known.active:
        out["via"] = "user namespace" if known.user_namespace else "root"
        out["procfs"] = "own /proc per child: its tree only"
        out["init"] = "acp/nsinit.py: pid 1 reaps and forwards signals"
        out["terminals"] = "a namespace of their own each (same uid, sandbox, cgroups)"
    if known.reason:
        out["reason"] = known.reason
    return out


__all__ = ["MODES", "PidNamespaceMode", "current", "mode", "probe", "resolve", "resolve_now"]
