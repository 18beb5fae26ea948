"""Confine an agent child before its ``exec``: its cgroups, its OOM score, its file sandbox.

Theory of operation
-------------------
A child must be inside its limits *before* it can do anything: a cgroup joined after the
child has started races with its first ``fork()`` (a grandchild started in between escapes
the limits), and a Landlock ruleset can only be applied by the process itself. Python's
``preexec_fn`` would do both in the forked child, but it runs Python code between ``fork``
and ``exec`` of a multi-threaded daemon (a lock held by another thread at the fork, e.g. the
import lock or a logging handler's, deadlocks the child), so the daemon does not use it.

Instead a child that has a :class:`Confinement` is started through a tiny wrapper: this very
file run as a script by the daemon's own interpreter in isolated mode without ``site``
(``python -I -S confine.py SPEC -- ARGV...``: about 10 ms, stdlib only, no import of our
packages). The wrapper, which already is the child (same pid, same process group, the
daemon's pipes), in this order:

1. writes its own pid into every ``cgroup.procs`` file of the spec (one per cgroup v1
   hierarchy, or the one cgroup v2 leaf), so it and everything it will start is accounted
   and limited from here on;
2. writes ``oom_score_adj`` (a kernel OOM then picks an agent before the daemon);
3. with ``pid_namespace``: puts the rest in a pid namespace of its own, with its own
   ``/proc`` and a tiny init (``acp/nsinit.py``, loaded from beside this file, has the
   three processes this takes and how signals, exit status and the kill of the whole tree
   go); the steps below then run in the agent's process (pid 2 of the namespace);
4. applies the file sandbox (``acp/landlock.py``, loaded from beside this file), which the
   kernel makes inherited by every descendant and irrevocable;
5. with ``uid``/``gid``: becomes that user (no supplementary groups), after the sandbox
   (whose rules are opened with the daemon's rights);
6. ``exec``s the agent's argv (``PATH`` lookup as ``execvp``).

A step that fails is fatal for the child (exit 126 with one ``acp-serve confine: ...`` line on
stderr, which the daemon's stderr tail keeps): a child is never started with fewer limits
than the daemon reports. ``exec`` failing (no such command) exits 127, like a shell.

The spec travels as one JSON argument, never through the environment (which the agent
would inherit).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

#: This file; run as a script by :meth:`Confinement.wrap`.
CONFINE_PY: Final = os.path.abspath(__file__)
#: Exit status of a wrapper whose confinement step failed (a shell's "cannot execute").
EXIT_CONFINE_FAILED: Final = 126
#: Exit status of a wrapper that could not ``exec`` the command (a shell's "not found").
EXIT_EXEC_FAILED: Final = 127


@dataclass(frozen=True)
class Confinement:
    """What a child gets before its ``exec`` (see the module docstring). Empty = nothing."""

    #: ``cgroup.procs`` files the child joins, in order (one per v1 hierarchy, or one v2 leaf).
    cgroup_procs: tuple[str, ...] = ()
    #: Written to ``/proc/self/oom_score_adj`` (-1000..1000); None leaves it inherited.
    oom_score_adj: int | None = None
    #: The file sandbox: the ruleset spec ``acp.landlock.apply`` takes; None = no sandbox.
    landlock: Mapping[str, Any] | None = None
    #: Extra environment for the child (e.g. its private ``TMPDIR``), set by the caller.
    env: Mapping[str, str] = field(default_factory=dict)
    #: A pid namespace (and mount namespace, for its ``/proc``) of its own, under an init.
    pid_namespace: bool = False
    #: With ``pid_namespace``: also a user namespace mapping the daemon's uid to itself (a
    #: daemon that is not root needs it for the capabilities the namespace takes).
    user_namespace: bool = False
    #: Run the agent as this uid / gid (needs root); None keeps the daemon's.
    uid: int | None = None
    gid: int | None = None

    @property
    def empty(self) -> bool:
        return (
            not self.cgroup_procs
            and self.oom_score_adj is None
            and self.landlock is None
            and not self.pid_namespace
            and self.uid is None
            and self.gid is None
        )

    def spec(self) -> dict[str, Any]:
        return {
            "cgroup_procs": list(self.cgroup_procs),
            "oom_score_adj": self.oom_score_adj,
            "landlock": dict(self.landlock) if self.landlock is not None else None,
            "pid_namespace": self.pid_namespace,
            "user_namespace": self.user_namespace,
            "uid": self.uid,
            "gid": self.gid,
        }

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """The argv that starts ``argv`` confined (``argv`` itself when there is nothing to do)."""
        if self.empty:
            return list(argv)
        spec = json.dumps(self.spec(), separators=(",", ":"))
        return [sys.executable, "-I", "-S", CONFINE_PY, spec, "--", *argv]


def _fail(msg: str) -> NoReturn:
    os.write(2, f"acp-serve confine: {msg}\n".encode("utf-8", "replace"))
    os._exit(EXIT_CONFINE_FAILED)


def _load(name: str) -> Any:
    """A stdlib-only module beside this file (``acp/landlock.py``, ``acp/nsinit.py``)."""
    here = os.path.dirname(CONFINE_PY)
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        return __import__(name)
    except ImportError as exc:
        _fail(f"cannot load {name}: {exc}")


def _apply(spec: Mapping[str, Any]) -> None:
    """The steps that hold for the whole tree: run in the wrapper itself (P)."""
    pid = str(os.getpid())
    for procs in spec.get("cgroup_procs") or ():
        try:
            with open(procs, "w") as f:
                f.write(pid)
        except OSError as exc:
            _fail(f"cannot join cgroup {procs}: {exc}")
    adj = spec.get("oom_score_adj")
    if adj is not None:
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(int(adj)))
        except OSError as exc:
            _fail(f"cannot set oom_score_adj {adj}: {exc}")


def _apply_agent(spec: Mapping[str, Any]) -> None:
    """The steps of the agent's own process: its sandbox, its uid (see the module doc)."""
    ruleset = spec.get("landlock")
    if ruleset is not None:
        landlock = _load("landlock")
        try:
            landlock.apply(ruleset)
        except Exception as exc:
            _fail(f"cannot apply the sandbox: {exc}")
    uid, gid = spec.get("uid"), spec.get("gid")
    if spec.get("pid_namespace") or uid is not None or gid is not None:
        # os.execvp imports warnings: load it while the daemon's interpreter is readable.
        import warnings  # noqa: F401

        nsinit = _load("nsinit")
        try:
            nsinit.agent_setup(
                uid, gid, as_root=os.geteuid() == 0 and bool(spec.get("pid_namespace"))
            )
        except OSError as exc:
            _fail(f"cannot run as uid {uid} gid {gid}: {exc}")


def _exec(argv: list[str]) -> NoReturn:
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(2, f"acp-serve confine: cannot run {argv[0]!r}: {exc}\n".encode())
        os._exit(EXIT_EXEC_FAILED)


def main(args: Sequence[str]) -> None:
    if len(args) < 3 or args[1] != "--":
        _fail("usage: confine.py SPEC -- ARGV...")
    try:
        spec = json.loads(args[0])
    except ValueError as exc:
        _fail(f"bad spec: {exc}")
    _apply(spec)
    argv = list(args[2:])
    if spec.get("pid_namespace"):

        def agent() -> NoReturn:
            try:
                _apply_agent(spec)
                _exec(argv)
            except BaseException as exc:  # never back into the init's code
                _fail(f"cannot start the agent: {exc!r}")

        nsinit = _load("nsinit")
        nsinit.run(agent, userns=bool(spec.get("user_namespace")), fail=_fail)
    _apply_agent(spec)
    _exec(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
