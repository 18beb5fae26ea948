"""The agents' file sandbox policy: which roots an agent child (and its terminals, and the
session shell) may read and write, and the private temp directory each one gets.

Theory of operation
-------------------
``--agent-sandbox auto|landlock|off`` (default ``auto``): :func:`resolve` says whether the
sandbox is in force (``auto``: where the kernel has Landlock; ``landlock``: required, the daemon
refuses to start without it; ``off``: never). When it is, every agent child is started through
the exec wrapper (``acp/confine.py``) with a Landlock ruleset planned by
:func:`acp.landlock.plan` (the carving rule is documented there) from:

* **write roots**: the child's workspace (read-only for an ``--untrusted-workspace``: it is
  then a read root), its private temp directory, its ``HOME``, the operator's grants
  (``--agent-allow-write DIR``, repeatable, and ``sandbox.allowWrite`` in the config file:
  validated at start by :func:`serve.settings.values.parse_allow_write`), and for the
  built-in scripted agent its conversation store (``<state>/scripted``, ``DIR/scripted``
  with ``--shared-dir``: the agent's own
  session files, which, like an agent's files under HOME, hold all of its sessions); a few
  device files
  (``/dev/null``, ``/dev/tty``, ``/dev/pts``, ``/dev/shm`` ...);
* **read**: everything else;
* **protected** (carved out of both): the state directory (journals, device-flow
  credentials, MCP sockets' folders, the scripted store of a non-default agent, every
  principal's places), the shared directory (``--shared-dir``: the principals' places and
  the scripted store there), the files the daemon trusts
  (:func:`serve.isolation.tenants.trusted_files`: the config file, the tokens and JWKS
  files, the audit log, the TLS files, the token file),
  every other workspace of the daemon, and the other children's temp directories.

With ``--auth-*`` a child's HOME and scripted store are its principal's
(:func:`tenant_setup`, :mod:`serve.isolation.tenants`), inside the state directory (the
shared directory with ``--shared-dir``): granted to that child by the more specific rule,
protected from every other child.

The private temp directory (``TMPDIR``, ``TMP``, ``TEMP``, and the variables of
:data:`AGENT_TEMP_ENV` for agents that do not honour ``TMPDIR``) is a fresh ``0700`` directory under
the daemon's own ``0700`` parent (``<state>/agent-tmp/<pid>-…``: inside the protected state
directory, granted to its one child by the more specific rule; a dead daemon's are removed at
the next start), created before the spawn and removed once the child has been reaped
(:meth:`ChildSandbox.aclose`); terminals of the agent share it; the session shell gets one of
its own for each command.

A warm pool child is spawned before its session exists, for its workspace: its roots are
fixed at spawn (the workspace, never a session's own directory), so a session that would need
more roots than its workspace (``additionalDirectories``) cannot be served by a warm child:
such a session gets a child of its own (the registry's ``SpawnAgentSource(extra_write=...)``),
whose write roots include its additional directories. Packing (``--sessions-per-agent > 1``)
puts the other sessions of one workspace *and one principal* in one child: they share its
sandbox (one workspace, one HOME, one temp directory), as ``/daemon/status``
``isolation.sandbox.shared`` says; two principals' sessions never share a child.

Agents that write outside those places: docs/agent-sandbox.md has the table, per agent kind of
the interop matrix, of what each writes, what the sandbox does about it and why (traced with
``strace -f -e trace=%file``). A child that dies at start-up because the sandbox refused it a
path is explained by :mod:`serve.isolation.denials` (:func:`denial`): the create answers
``agent_sandbox_denied`` naming the path and the flag that grants it.

Everything that lists directories runs in a worker thread (:func:`prepare`).
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import trio

from acp import landlock
from acp.confine import Confinement
from serve.isolation import denials, identity, pidns, tenants
from serve.isolation.identity import RunAs

if TYPE_CHECKING:
    from acp.client import AgentConnection
    from serve.settings import Settings

log = logging.getLogger(__name__)

#: A ruleset spec larger than this (JSON bytes) goes to the child in a file, not in its argv.
INLINE_SPEC_BYTES: Final = 32 * 1024

#: Device files every child may write (missing ones are skipped).
DEVICE_WRITES: Final = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
    "/dev/shm",
)


#: Variables pointing an agent at its private temp directory, beyond ``TMPDIR``/``TMP``/
#: ``TEMP``, for agents that ignore those: (variable, agent kind, why). Set only when the
#: agent's environment does not set them already (an operator's own value wins; it then needs
#: ``--agent-allow-write``). docs/agent-sandbox.md has the whole table.
AGENT_TEMP_ENV: Final = (
    (
        "CLAUDE_CODE_TMPDIR",
        "claude-agent-acp",
        "its Bash tool (and its bundled skills) work under $CLAUDE_CODE_TMPDIR/claude-<uid>, "
        "else /tmp/claude-<uid> whatever TMPDIR says: without it every shell command fails "
        "with EACCES",
    ),
)


@dataclass(frozen=True)
class SandboxMode:
    """What is in force: ``requested`` (the flag), ``active``, the kernel's ``abi``, and why
    it is off when it is (``reason``)."""

    requested: str
    active: bool
    abi: int
    reason: str | None = None


@functools.cache
def _abi() -> int:
    return landlock.abi_version()


def resolve(settings: Settings) -> SandboxMode:
    mode = settings.agent_sandbox
    abi = _abi()
    if mode == "off":
        return SandboxMode(mode, False, abi, "--agent-sandbox off")
    if abi < 1:
        return SandboxMode(mode, False, 0, "the kernel has no Landlock")
    return SandboxMode(mode, True, abi)


# ---- the temp directories -------------------------------------------------------------------

_parent_lock = threading.Lock()
_parents: dict[str, str] = {}

#: Under the state directory: already carved out of every child's view, so the children's
#: temp directories add no carved level of their own (``/tmp`` stays one plain rule).
TMP_SUBDIR: Final = "agent-tmp"


def temp_parent(state_dir: str) -> str:
    """This daemon's ``0700`` parent of the children's temp directories,
    ``<state>/agent-tmp/<pid>-…`` (made once; removed at exit, and a dead daemon's on the
    next start)."""
    with _parent_lock:
        parent = _parents.get(state_dir)
        if parent is None or not os.path.isdir(parent):
            base = os.path.join(state_dir, TMP_SUBDIR)
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
            os.makedirs(base, mode=0o700, exist_ok=True)
            _remove_dead(base)
            parent = tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=base)
            atexit.register(shutil.rmtree, parent, True)
            _parents[state_dir] = parent
        return parent


def _remove_dead(base: str) -> None:
    """Remove the temp directories a daemon that is gone left behind (a crash)."""
    for name in os.listdir(base):
        pid = name.split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        except PermissionError:
            pass


# ---- one child's sandbox ----------------------------------------------------------------------


@dataclass
class ChildSandbox:
    """One child's sandbox: the :class:`Confinement` part and its temp directory."""

    landlock: dict[str, Any] | None
    tmpdir: str | None
    env: dict[str, str] = field(default_factory=dict)
    roots: dict[str, list[str]] = field(default_factory=dict)
    #: Its own pid namespace and ``/proc`` (serve/isolation/pidns.py), made in a user
    #: namespace when the daemon is not root.
    pid_namespace: bool = False
    user_namespace: bool = False
    #: The principal's uid it runs as (serve/isolation/identity.py); None: the daemon's.
    run_as: RunAs | None = None

    def confinement(self, base: Confinement | None = None) -> Confinement:
        """``base`` (the cgroup part, if any) plus this sandbox."""
        base = base or Confinement()
        return Confinement(
            cgroup_procs=base.cgroup_procs,
            oom_score_adj=base.oom_score_adj,
            landlock=self.landlock,
            env={**base.env, **self.env},
            pid_namespace=self.pid_namespace,
            user_namespace=self.user_namespace,
            uid=self.run_as.uid if self.run_as is not None else None,
            gid=self.run_as.gid if self.run_as is not None else None,
        )

    async def aclose(self) -> None:
        """Remove the temp directory (after the child was reaped). Idempotent."""
        tmpdir, self.tmpdir = self.tmpdir, None
        if tmpdir is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(shutil.rmtree, tmpdir, True)


def _roots(
    settings: Settings,
    workspace: str,
    env: Mapping[str, str],
    tmpdir: str,
    extra_write: Sequence[str] = (),
    places: tenants.Places | None = None,
) -> dict[str, list[str]]:
    workspace = os.path.realpath(workspace)
    untrusted = {os.path.realpath(w) for w in settings.untrusted_workspaces}
    write = [tmpdir]
    read: list[str] = ["/"]
    if workspace in untrusted:
        read.append(workspace)
    else:
        write.append(workspace)
    home = env.get("HOME")
    if home and os.path.isabs(home) and os.path.isdir(home):
        write.append(home)
    write.extend(settings.agent_allow_write)  # validated at start (absolute, no protected place)
    scripted = tenants.scripted_store(settings) if places is None else places.store
    if settings.agent_is_default:
        os.makedirs(scripted, mode=0o700, exist_ok=True)
        write.append(scripted)
    # The state directory (or the shared one) holds every tenant's places: the child's own
    # are granted inside it (the specific rule wins), the others stay carved out (tenants.py).
    protected = [settings.state_dir, temp_parent(settings.state_dir)]
    if settings.shared_dir:
        protected.append(settings.shared_dir)
    protected.extend(tenants.trusted_files(settings))  # tokens, JWKS, config, audit, TLS
    for w in (*settings.workspaces, *settings.untrusted_workspaces):
        if os.path.realpath(w) != workspace:
            protected.append(w)
    for extra in extra_write:  # a session's additionalDirectories: write roots of its own
        real = os.path.realpath(extra)
        for p in protected:
            guarded = os.path.realpath(p)
            if real == guarded or real.startswith(guarded.rstrip("/") + "/"):
                raise landlock.PlanError(f"additional directory {extra} is a protected location")
        write.append(real)
    return {"read": read, "write": write, "protected": protected}


def _shared_roots(write: Sequence[str], tmpdir: str | None) -> list[str]:
    """The write roots a principal's uid gets ACL entries on: all but its own temp directory
    and the daemon's own HOME (a principal's agents need a HOME of their own)."""
    own_home = os.environ.get("HOME")
    return [w for w in write if w != tmpdir and w != own_home]


def _grant_unsandboxed(
    settings: Settings,
    workspace: str,
    env: Mapping[str, str],
    extra_write: Sequence[str],
    run_as: RunAs,
) -> None:
    """Without the file sandbox: the uid still needs its workspace, HOME and grants."""
    write = [os.path.realpath(workspace), *extra_write, *settings.agent_allow_write]
    home = env.get("HOME")
    if home and os.path.isabs(home) and os.path.isdir(home):
        write.append(home)
    if settings.agent_is_default:  # its store: the one its environment names
        scripted = env.get("ACP_SCRIPTED_STATE_DIR") or tenants.scripted_store(settings)
        os.makedirs(scripted, mode=0o700, exist_ok=True)
        write.append(scripted)
    identity.grant(run_as, share=_shared_roots(write, None))


def _prepare_sync(
    settings: Settings,
    workspace: str,
    env: Mapping[str, str],
    extra_write: Sequence[str] = (),
    places: tenants.Places | None = None,
    run_as: RunAs | None = None,
) -> ChildSandbox:
    tmpdir = tempfile.mkdtemp(prefix="agent-", dir=temp_parent(settings.state_dir))  # 0700
    try:
        roots = _roots(settings, workspace, env, tmpdir, extra_write, places)
        if run_as is not None:  # before the spec file is written into the temp directory
            identity.grant(run_as, own=[tmpdir], share=_shared_roots(roots["write"], tmpdir))
        spec = landlock.plan(
            roots["write"], roots["protected"], read=roots["read"], extra_write=DEVICE_WRITES
        )
        # The node compile cache (serve/agents/compile_cache.py) lives in the protected state
        # directory: read-only for agents (code every later child runs; only the daemon's
        # probe writes it). A specific grant inside the carved location.
        # A child spawned before the probe made it (the warm spare at start-up) gets the
        # grant too: the directory is made here, empty, and the probe fills it in place.
        cache = settings.node_compile_cache_dir
        if cache is not None and env.get("NODE_COMPILE_CACHE") == cache:
            os.makedirs(cache, mode=0o700, exist_ok=True)
            spec["read"].append(os.path.realpath(cache))
            roots["readOnly"] = [*roots.get("readOnly", []), cache]
        if len(json.dumps(spec)) > INLINE_SPEC_BYTES:
            # Too large for one argv string (128 KiB): the wrapper reads it from a file.
            path = os.path.join(tmpdir, ".acp-serve-sandbox.json")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with open(fd, "w") as f:
                json.dump(spec, f)
            spec = {"rules_file": path}
    except BaseException:
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise
    temp_env = {"TMPDIR": tmpdir, "TMP": tmpdir, "TEMP": tmpdir}
    for name, _, _ in AGENT_TEMP_ENV:
        if name not in env:
            temp_env[name] = tmpdir
    return ChildSandbox(landlock=spec, tmpdir=tmpdir, env=temp_env, roots=roots)


async def prepare(
    settings: Settings,
    workspace: str,
    env: Mapping[str, str],
    extra_write: Sequence[str] = (),
    places: tenants.Places | None = None,
    *,
    run_as: RunAs | None = None,
) -> ChildSandbox:
    """The sandbox of a child working in ``workspace`` with environment ``env`` (its HOME),
    plus ``extra_write`` roots (a session's ``additionalDirectories``; refused when one is
    a protected location), for the tenant of ``places`` (its HOME and store; None: the
    daemon's own, single-user mode); without a ruleset and a temp directory when the sandbox
    is not in force. It has its own pid namespace where that is in force
    (serve/isolation/pidns.py), and runs as ``run_as`` (a principal's uid:
    serve/isolation/identity.py; its places are granted to that uid here).

    Raises :class:`acp.landlock.PlanError` (the spawn fails: never an unsandboxed child
    when the sandbox is in force) or ``OSError``."""
    ns = await pidns.mode(settings)
    if settings.agent_pid_namespace == "on" and not ns.active:
        raise OSError(f"--agent-pid-namespace on: {ns.reason}")
    if not resolve(settings).active:
        box = ChildSandbox(landlock=None, tmpdir=None)
        if run_as is not None:
            await trio.to_thread.run_sync(
                _grant_unsandboxed, settings, workspace, dict(env), tuple(extra_write), run_as
            )
    else:
        try:
            box = await trio.to_thread.run_sync(
                _prepare_sync,
                settings,
                workspace,
                dict(env),
                tuple(extra_write),
                places,
                run_as,
            )
        except landlock.PlanError as exc:
            raise OSError(f"cannot sandbox the agent: {exc}") from exc
    box.pid_namespace = ns.active
    box.user_namespace = ns.active and ns.user_namespace
    box.run_as = run_as
    return box


async def tenant_setup(
    settings: Settings, tenant: str | None, env: Mapping[str, str]
) -> tuple[dict[str, str], tenants.Places | None]:
    """``env`` for a child of ``tenant`` and its places (made in a worker thread; in
    single-user mode ``env`` as it is and None: the daemon's own HOME and store)."""
    if tenant is None or not tenants.multi_user(settings):
        return dict(env), None
    box = await trio.to_thread.run_sync(tenants.places, settings, tenant)
    assert box is not None
    out = tenants.tenant_env(env, box)
    if "ACP_SCRIPTED_STATE_DIR" in out:
        out["ACP_SCRIPTED_STATE_DIR"] = box.store
    return out, box


#: The roots of each live (or recently closed) child's sandbox, for :func:`denial`.
_roots_of: weakref.WeakKeyDictionary[AgentConnection, dict[str, list[str]]] = (
    weakref.WeakKeyDictionary()
)


def register(conn: AgentConnection, box: ChildSandbox) -> None:
    """Remember ``conn``'s roots (forgotten with the connection) for :func:`denial`."""
    if box.roots:
        _roots_of[conn] = box.roots


def denial(conn: AgentConnection) -> denials.Denial | None:
    """When ``conn``'s child has exited: the path its sandbox refused it, as its stderr
    says (None: no sandbox, still running, or not a refusal of ours). Blocking (``stat``
    calls): run it in a worker thread."""
    roots = _roots_of.get(conn)
    info = conn.process.exit_info
    if roots is None or info is None:
        return None
    writable = {**roots, "write": [*roots.get("write", ()), *DEVICE_WRITES]}
    return denials.explain(info.stderr_tail, writable)


async def remove_when_closed(conn: AgentConnection, box: ChildSandbox) -> None:
    """Remove ``box``'s temp directory once ``conn``'s child has been reaped (or at once when
    the owning nursery is cancelled)."""
    try:
        await conn.wait_closed()
    finally:
        await box.aclose()


def status(settings: Settings) -> dict[str, Any]:
    """``/daemon/status`` ``isolation.sandbox``."""
    mode = resolve(settings)
    out: dict[str, Any] = {
        "mode": mode.requested,
        "active": mode.active,
        "backend": "landlock" if mode.active else None,
        "landlockAbi": mode.abi or None,
        # Packed sessions share their child's sandbox (one workspace per child).
        "shared": settings.sessions_per_agent > 1,
    }
    if mode.reason:
        out["reason"] = mode.reason
    # The operator's grants (--agent-allow-write, sandbox.allowWrite; also in roots.write).
    out["allowWrite"] = list(settings.agent_allow_write)
    if mode.active:
        home = os.environ.get("HOME")
        write = [*settings.workspaces]
        if home:
            write.append(home)
        if settings.agent_is_default:
            write.append(tenants.scripted_store(settings))
        write.extend(settings.agent_allow_write)
        protected = [settings.state_dir, *tenants.trusted_files(settings)]
        if settings.shared_dir:
            protected.insert(1, settings.shared_dir)
        out["roots"] = {
            "read": ["/"],
            "readOnly": list(settings.untrusted_workspaces),
            "write": write,
            # no I/O here: the parent once made, else where it will be
            "tmpdirParent": _parents.get(settings.state_dir)
            or os.path.join(settings.state_dir, TMP_SUBDIR),
            "protected": protected,
        }
        out["agentTempEnv"] = [
            {"variable": name, "agent": agent, "why": why} for name, agent, why in AGENT_TEMP_ENV
        ]
        # --auth-*: each principal's agents get their own HOME and store (tenants.py).
        out["perPrincipal"] = tenants.multi_user(settings)
        out["rule"] = (
            "each child writes its own workspace, its own TMPDIR and HOME and the granted "
            "directories; the other "
            "workspaces and TMPDIRs and the protected paths are neither readable nor writable"
        )
    return out
