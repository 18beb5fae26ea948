"""Resource isolation of agent children: memory, tasks and CPU per child, enforced by the
kernel where it can be; an aggregate ceiling for all agents below the daemon's own limit.

Theory of operation
-------------------
One :class:`Isolation` per daemon (built by the Host, ``--agent-limits``):

* **detect** (at build, read-only): cgroup v2 when the daemon's own v2 cgroup has the
  memory controller and is writable (delegated), else cgroup v1 when the daemon's own cgroup
  of the v1 ``memory`` hierarchy is writable (``pids`` and ``cpu`` too when mounted), else
  the userspace watchdog (:mod:`serve.isolation.watchdog`). ``cgroup`` refuses to start
  without a kernel backend; ``off`` does nothing.
* **run** (an actor-less service task under the root supervisor, started before the agent
  pools and stopped after them): removes the cgroups of daemons proven gone and leaves every
  other daemon's alone (:mod:`serve.isolation.owners`: a random instance id per start, a
  lock held on the group for the daemon's lifetime), claims the agents' parent
  ``<own cgroup>/acp-serve.d-<id>`` with the ceiling (the daemon's own memory limit, the
  tightest of its cgroup and their ancestors, minus ``--agent-memory-headroom-mb``), lowers
  the daemon's own ``oom_score_adj``; with the watchdog backend it samples every child's
  tree (and the ceiling); on exit it removes every cgroup it made, in every hierarchy.
* **per child** (:meth:`Isolation.child`, by each spawn point): a leaf cgroup with the
  child's limits and a :class:`~acp.confine.Confinement` that puts the child in it before
  its ``exec`` (race-free: nothing of the child runs outside), ``oom_score_adj``
  :data:`AGENT_OOM_SCORE_ADJ`. When the child is reaped, :meth:`ChildLimits.verdict` names
  an OOM kill (the kernel's counters of its cgroup and of the parent, or the watchdog's
  kill) as an :class:`OomReport`, and :meth:`ChildLimits.aclose` kills what is left of its
  tree and removes the cgroup.

What the spawn points do with the report (``agent_oom``) is the session's business
(:mod:`serve.sessions.actor`). Status (``/daemon/status`` ``isolation``) and metrics read
:meth:`Isolation.status`, which reads the cgroups' usage files (in-kernel, no disk I/O).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import trio

from acp.confine import Confinement
from acp.process import ExitInfo
from serve.isolation import cgroups, owners, watchdog
from serve.isolation.cgroups import Limits

if TYPE_CHECKING:
    from serve.settings import Settings

log = logging.getLogger(__name__)

Backend = Literal["cgroup-v2", "cgroup-v1", "watchdog", "off"]
#: Agents are the kernel OOM killer's first choice; the daemon (where permitted) its last.
AGENT_OOM_SCORE_ADJ: Final = 1000
DAEMON_OOM_SCORE_ADJ: Final = -500
MIB: Final = 1024 * 1024
#: The smallest ceiling the daemon sets (a limit minus the headroom below this: this).
MIN_CEILING_BYTES: Final = 64 * MIB
#: Children remembered by the watchdog / status at most (one per live agent child).
MAX_CHILDREN: Final = 4096
#: Child cgroup names tried per spawn past leftovers with processes in them.
CHILD_NAME_TRIES: Final = 8


class IsolationError(Exception):
    """``--agent-limits cgroup`` without a usable cgroup (the daemon refuses to start)."""


@dataclass(frozen=True)
class OomReport:
    """Why a child was killed for memory."""

    backend: str
    #: ``agent``: its own cap; ``ceiling``: the agents' aggregate ceiling; ``system``: a
    #: kernel OOM outside both (the machine, or a container limit above the ceiling).
    scope: Literal["agent", "ceiling", "system"]
    limit_bytes: int | None
    #: The peak usage the kernel recorded (cgroups), or the last measured (the watchdog).
    peak_bytes: int | None

    def event_data(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "scope": self.scope,
            "limitBytes": self.limit_bytes,
            "limitMb": self.limit_bytes // MIB if self.limit_bytes else None,
            "peakBytes": self.peak_bytes,
        }

    def message(self) -> str:
        limit = f"{self.limit_bytes // MIB} MiB" if self.limit_bytes else "no limit"
        what = {"agent": "its memory limit", "ceiling": "the agents' memory ceiling"}.get(
            self.scope, "the system's memory"
        )
        return f"the agent was killed for memory: it reached {what} ({limit})"


@dataclass(frozen=True)
class Detected:
    backend: Backend
    reason: str  # why this backend (e.g. why not a kernel one)
    version: cgroups.Version | None = None
    bases: Mapping[str, Path] = dataclasses.field(default_factory=dict)
    #: The daemon's own memory limit (its cgroup or an ancestor's), bytes; None = none.
    daemon_limit_bytes: int | None = None


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def detect(mode: str, *, proc: str = "/proc/self") -> Detected:
    """The backend ``mode`` (``auto|cgroup|watchdog|off``) gets on this machine (read-only)."""
    if mode == "off":
        return Detected("off", "--agent-limits off")
    mounts = cgroups.parse_mountinfo(_read(f"{proc}/mountinfo"))
    own = cgroups.parse_proc_cgroup(_read(f"{proc}/cgroup"))
    v2 = cgroups.v2_base(mounts, own)
    v1 = cgroups.v1_bases(mounts, own)
    limit = _daemon_limit(mounts, v2, v1)
    reasons: list[str] = []
    if mode in ("auto", "cgroup"):
        why_v2 = cgroups.v2_usable(v2) if v2 is not None else "no cgroup v2 mount"
        if why_v2 is None and v2 is not None:
            return Detected("cgroup-v2", "delegated cgroup v2", "v2", {"": v2}, limit)
        reasons.append(f"cgroup v2: {why_v2}")
        why_v1 = cgroups.v1_usable(v1)
        if why_v1 is None:
            return Detected("cgroup-v1", "writable cgroup v1 hierarchies", "v1", v1, limit)
        reasons.append(f"cgroup v1: {why_v1}")
        if mode == "cgroup":
            raise IsolationError(
                "--agent-limits cgroup: no usable cgroup (" + "; ".join(reasons) + ")"
            )
    else:
        reasons.append("--agent-limits watchdog")
    return Detected("watchdog", "; ".join(reasons), daemon_limit_bytes=limit)


def _daemon_limit(
    mounts: list[cgroups.Mount], v2: Path | None, v1: Mapping[str, Path]
) -> int | None:
    if "memory" in v1:
        top = next(
            (Path(m.point) for m in mounts if m.fstype == "cgroup" and "memory" in m.options),
            v1["memory"],
        )
        value = cgroups.memory_limit_of("v1", v1["memory"], top)
        if value is not None:
            return value
    if v2 is not None:
        top = next((Path(m.point) for m in mounts if m.fstype == "cgroup2"), v2)
        return cgroups.memory_limit_of("v2", v2, top)
    return None


def _mem_total_bytes() -> int | None:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


class ChildLimits:
    """One agent child's limits: its cgroup (or its watchdog entry), its confinement, its
    verdict after the reap. Owned by the spawn point that made it: call :meth:`aclose` once
    the child is reaped."""

    def __init__(self, isolation: Isolation, name: str, groups: Mapping[str, Path]) -> None:
        self.isolation = isolation
        self.name = name
        self.groups = dict(groups)
        self.pid: int | None = None
        self.created_at = time.time()
        self._verdict: OomReport | None = None
        self._decided = False
        self._parent_kills = isolation._parent_kills()
        #: The watchdog's: last and peak tree RSS, tree size, and its kill (if it killed).
        self.rss_bytes: int | None = None
        self.peak_bytes: int | None = None
        self.tasks: int | None = None
        self.killed: OomReport | None = None
        self.closed = False

    def confinement(self, base: Confinement | None = None) -> Confinement:
        """``base`` (the file sandbox, the env) plus this child's cgroups and OOM score."""
        base = base if base is not None else Confinement()
        version = self.isolation.version
        procs = cgroups.procs_files(version, self.groups) if version and self.groups else ()
        return dataclasses.replace(
            base,
            cgroup_procs=(*base.cgroup_procs, *procs),
            oom_score_adj=AGENT_OOM_SCORE_ADJ,
        )

    def set_cpu_weight(self, weight: int) -> bool:
        """Rewrite this child's CPU weight (cgroup v2 ``cpu.weight`` scale; v1 as
        ``cpu.shares``): True when written, False without a kernel cpu controller or when
        the kernel refused (logged). An in-kernel write, cheap enough for an actor."""
        version = self.isolation.version
        if version is None or not self.groups or self.closed:
            return False
        try:
            return cgroups.set_cpu_weight(version, self.groups, weight)
        except OSError as exc:
            log.warning("agent %s: cannot set its cpu weight to %s: %s", self.name, weight, exc)
            return False

    def attach(self, pid: int) -> None:
        """The child runs as ``pid`` (the watchdog watches its tree from now on)."""
        self.pid = pid

    def verdict(self, exit_info: ExitInfo | None) -> OomReport | None:
        """After the child exited: the OOM kill that ended it, or None. Decided once."""
        if self._decided:
            return self._verdict
        self._decided = True
        report = self.killed
        if report is None and exit_info is not None and exit_info.signal == signal.SIGKILL:
            report = self._kernel_verdict()
        if report is not None:
            self._verdict = report
            self.isolation.oom_total += 1
            log.warning("agent %s (pid %s) killed for memory: %s", self.name, self.pid, report)
        return report

    def _kernel_verdict(self) -> OomReport | None:
        iso = self.isolation
        version = iso.version
        if version is None or "memory" not in self.groups:
            return None
        own = cgroups.usage(version, self.groups)
        parent_kills = iso._parent_kills()
        if own.oom_kills == 0 and parent_kills <= self._parent_kills:
            return None
        if own.limit_hits > 0 and iso.limits.memory_max_bytes:
            return OomReport(iso.backend, "agent", iso.limits.memory_max_bytes, own.memory_peak)
        if parent_kills > self._parent_kills or iso._parent_hits():
            return OomReport(iso.backend, "ceiling", iso.ceiling_bytes, own.memory_peak)
        return OomReport(iso.backend, "system", iso.daemon_limit_bytes, own.memory_peak)

    def usage(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "pid": self.pid}
        version = self.isolation.version
        if version is not None and self.groups:
            u = cgroups.usage(version, self.groups)
            out.update(
                memoryCurrentBytes=u.memory_current,
                memoryPeakBytes=u.memory_peak,
                pidsCurrent=u.pids_current,
            )
        else:
            out.update(
                memoryCurrentBytes=self.rss_bytes,
                memoryPeakBytes=self.peak_bytes,
                pidsCurrent=self.tasks,
            )
        return out

    async def aclose(self) -> None:
        """Kill what is left of the child's tree and remove its cgroup (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self.isolation._children.pop(self.name, None)
        if self.groups:
            with trio.CancelScope(shield=True):
                errors = await trio.to_thread.run_sync(
                    cgroups.remove_group, list(self.groups.values())
                )
            for error in errors:
                log.warning("agent cgroup: %s", error)


class Isolation:
    """The daemon's agent isolation (see the module docstring)."""

    def __init__(
        self, settings: Settings, detected: Detected | None = None, *, proc: str = "/proc/self"
    ) -> None:
        self.settings = settings
        #: Where the daemon's own ``oom_score_adj`` is written (a unit test: elsewhere).
        self.proc = proc
        self.detected = detected if detected is not None else detect(settings.agent_limits)
        self.backend: Backend = self.detected.backend
        self.version = self.detected.version
        self.daemon_limit_bytes = self.detected.daemon_limit_bytes
        headroom = settings.agent_memory_headroom_mb * MIB
        self.headroom_bytes = headroom
        self.ceiling_bytes: int | None = (
            max(MIN_CEILING_BYTES, self.daemon_limit_bytes - headroom)
            if self.daemon_limit_bytes is not None and self.backend != "off"
            else None
        )
        self.limits = self._limits(settings)
        self.parents: dict[str, Path] = {}
        #: The agents' parent's name (``acp-serve.d-<id>``) once claimed, and its locks.
        self.claim: owners.Claim | None = None
        #: What the start-up sweep removed and left alone (the sweep is once per run).
        self.sweep: owners.Sweep | None = None
        #: Where ``pids_in_use`` and the pid namespaces are read (a unit test: elsewhere).
        self.procfs = "/proc"
        self.oom_total = 0
        self.ready = False
        self.setup_error: str | None = None
        self._children: dict[str, ChildLimits] = {}
        self._ids = itertools.count(1)
        self._stopped = trio.Event()

    def _limits(self, settings: Settings) -> Limits:
        if self.backend == "off":
            return Limits()
        mem_mb = settings.agent_memory_max_mb
        if mem_mb is None:  # auto: half the ceiling, else half the machine
            basis = self.ceiling_bytes or _mem_total_bytes() or 0
            memory = basis // 2 // MIB * MIB
        else:
            memory = mem_mb * MIB
        kernel = self.backend.startswith("cgroup")
        return Limits(
            memory_max_bytes=memory,
            pids_max=settings.agent_pids_max if kernel else 0,
            cpu_weight=settings.agent_cpu_weight if kernel else 0,
        )

    # ---- lifecycle ---------------------------------------------------------------------

    def setup(self) -> None:
        """Stale cgroups removed, the agents' parent made, the daemon's OOM score lowered
        (blocking: run in a worker thread)."""
        if self.backend == "off":
            return
        _write_quietly(f"{self.proc}/oom_score_adj", DAEMON_OOM_SCORE_ADJ)
        if self.version is None:
            return
        bases = dict(self.detected.bases)
        self.sweep = owners.sweep(bases.values(), proc=self.procfs)
        _log_sweep(self.sweep)
        if self.version == "v2":
            cgroups.v2_prepare_base(bases[""])
            bases = {"memory": bases[""]}  # one tree: its groups are listed once
        self.claim = owners.claim(bases, proc=self.procfs)
        self.parents = {c: base / self.claim.name for c, base in bases.items()}
        cgroups.make_parent(self.version, bases, self.claim.name, self.ceiling_bytes)

    @property
    def parent_name(self) -> str | None:
        return self.claim.name if self.claim is not None else None

    def teardown(self) -> list[str]:
        """Every hierarchy's agents' parent removed (what is left in them killed: this
        daemon's), then the locks released."""
        errors = cgroups.remove_group(self.parents.values()) if self.parents else []
        self.parents = {}
        if self.claim is not None:
            self.claim.release()
        return errors

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        """Set up, then (the watchdog backend) sample the children until :meth:`close`;
        clean up on exit."""
        self._stopped = trio.Event()
        try:
            await trio.to_thread.run_sync(self.setup)
        except OSError as exc:
            # A kernel backend that detection found usable but refused a write: the
            # watchdog takes over (a forced ``cgroup`` fails instead).
            self.setup_error = f"{exc}"
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self.teardown)
            if self.settings.agent_limits == "cgroup":
                raise
            log.warning("agent cgroups unavailable (%s): the watchdog enforces the limits", exc)
            self.backend, self.version = "watchdog", None
            self.limits = dataclasses.replace(self.limits, pids_max=0, cpu_weight=0)
        self.ready = True
        log.info(
            "agent limits: %s (%s); memory max %s, pids max %s, cpu weight %s, ceiling %s",
            self.backend,
            self.detected.reason,
            _mb(self.limits.memory_max_bytes),
            self.limits.pids_max or "none",
            self.limits.cpu_weight or "none",
            _mb(self.ceiling_bytes),
        )
        task_status.started(self)
        try:
            async with trio.open_nursery() as nursery:
                if self.backend == "watchdog":
                    nursery.start_soon(self._watch)
                await self._stopped.wait()
                nursery.cancel_scope.cancel()
        finally:
            self.ready = False
            with trio.CancelScope(shield=True):
                for child in list(self._children.values()):
                    await child.aclose()
                errors = await trio.to_thread.run_sync(self.teardown)
            for error in errors:
                log.warning("agent cgroup: %s", error)

    def close(self) -> None:
        """The supervisor's stop hook: end :meth:`run` (which then removes its cgroups)."""
        self._stopped.set()

    # ---- per child ---------------------------------------------------------------------

    async def child(self, *, cpu_weight: int | None = None) -> ChildLimits | None:
        """A new child's limits (None: ``off``, or not running). Raises OSError when its
        cgroup cannot be made: the spawn fails rather than run a child unlimited.
        ``cpu_weight``: this child's instead of ``--agent-cpu-weight`` (where the kernel's
        cpu controller is in use), e.g. a warm refill's lower priority."""
        if self.backend == "off" or not self.ready:
            return None
        if len(self._children) >= MAX_CHILDREN:
            raise OSError(f"more than {MAX_CHILDREN} agent children")
        name = f"agent-{next(self._ids)}"
        groups: dict[str, Path] = {}
        if self.version is not None:
            version = self.version
            limits = self.limits
            if cpu_weight is not None and limits.cpu_weight:
                limits = dataclasses.replace(limits, cpu_weight=cpu_weight)
            for attempt in range(CHILD_NAME_TRIES):
                try:
                    groups = await trio.to_thread.run_sync(
                        cgroups.make_child, version, self.parents, name, limits
                    )
                    break
                except cgroups.GroupBusy as exc:
                    log.warning("agent cgroup: %s: the child takes another name", exc)
                    if attempt == CHILD_NAME_TRIES - 1:
                        raise
                    name = f"agent-{next(self._ids)}"
        child = ChildLimits(self, name, groups)
        self._children[name] = child
        return child

    def ceiling_room_bytes(self) -> int | None:
        """Bytes left below the agents' aggregate ceiling (None: no ceiling): the kernel's
        count of the agents' parent cgroup, else the watchdog's last samples."""
        if self.ceiling_bytes is None:
            return None
        group = self.parents.get("memory")
        if group is not None and self.version is not None:
            used = cgroups.usage(self.version, {"memory": group}).memory_current or 0
        else:
            used = sum(c.rss_bytes or 0 for c in self._children.values())
        return self.ceiling_bytes - used

    def _parent_kills(self) -> int:
        group = self.parents.get("memory")
        if group is None or self.version is None:
            return 0
        return cgroups.oom_kills(self.version, group)

    def _parent_hits(self) -> bool:
        group = self.parents.get("memory")
        if group is None or self.version is None:
            return False
        return cgroups.usage(self.version, {"memory": group}).limit_hits > 0

    # ---- the watchdog ------------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            watched = {c.name: c.pid for c in self._children.values() if c.pid is not None}
            if watched:
                samples = await trio.to_thread.run_sync(watchdog.sample, watched)
                self._enforce(samples)
            await trio.sleep(watchdog.SAMPLE_S)

    def _enforce(self, samples: Mapping[str, watchdog.TreeSample]) -> None:
        cap = self.limits.memory_max_bytes
        total = 0
        largest: tuple[int, ChildLimits, watchdog.TreeSample] | None = None
        for name, sample in samples.items():
            child = self._children.get(name)
            if child is None or child.killed is not None:
                continue
            child.rss_bytes = sample.rss_bytes
            child.peak_bytes = max(child.peak_bytes or 0, sample.rss_bytes)
            child.tasks = len(sample.pids)
            if cap and sample.rss_bytes > cap:
                child.killed = OomReport("watchdog", "agent", cap, sample.rss_bytes)
                watchdog.kill_tree(sample.pids)
                continue
            total += sample.rss_bytes
            if largest is None or sample.rss_bytes > largest[0]:
                largest = (sample.rss_bytes, child, sample)
        if self.ceiling_bytes and total > self.ceiling_bytes and largest is not None:
            _, child, sample = largest
            child.killed = OomReport("watchdog", "ceiling", self.ceiling_bytes, sample.rss_bytes)
            watchdog.kill_tree(sample.pids)

    # ---- read models -------------------------------------------------------------------

    def children_usage(self) -> list[dict[str, Any]]:
        return [c.usage() for c in list(self._children.values()) if c.pid is not None]

    def status(self) -> dict[str, Any]:
        """``/daemon/status`` ``isolation``'s limits part (an object others extend)."""
        lim = self.limits
        ceiling: dict[str, Any] | None = None
        if self.ceiling_bytes is not None:
            ceiling = {
                "memoryMaxBytes": self.ceiling_bytes,
                "daemonLimitBytes": self.daemon_limit_bytes,
                "headroomBytes": self.headroom_bytes,
                "enforcedBy": "kernel" if self.version is not None else "watchdog",
            }
            group = self.parents.get("memory")
            if group is not None and self.version is not None:
                u = cgroups.usage(self.version, {"memory": group})
                ceiling.update(memoryCurrentBytes=u.memory_current, oomKills=u.oom_kills)
        out: dict[str, Any] = {
            "backend": self.backend,
            "reason": self.detected.reason,
            "mode": self.settings.agent_limits,
            "limits": {
                "memoryMaxBytes": lim.memory_max_bytes or None,
                "memoryHighBytes": int(lim.memory_max_bytes * cgroups.V2_HIGH_FRACTION)
                if self.version == "v2" and lim.memory_max_bytes
                else None,
                "pidsMax": lim.pids_max or None,
                "cpuWeight": lim.cpu_weight or None,
                "oomScoreAdj": AGENT_OOM_SCORE_ADJ if self.backend != "off" else None,
            },
            "ceiling": ceiling,
            "agentOomTotal": self.oom_total,
            "children": self.children_usage(),
        }
        if self.setup_error is not None:
            out["setupError"] = self.setup_error
        if self.version is not None:
            out["groups"] = self.groups_status()
        return out

    def groups_status(self) -> dict[str, Any]:
        """The agents' parent (name, paths, how ownership is proven) and what the start-up
        sweep removed and left alone, with why."""
        out: dict[str, Any] = {
            "name": self.parent_name,
            "paths": {c: str(p) for c, p in self.parents.items()},
            "ownership": "flock held on each group directory for the daemon's lifetime",
        }
        if self.sweep is not None:
            out.update(self.sweep.status())
        return out


def _log_sweep(sweep: owners.Sweep) -> None:
    """Once per start: each group removed or left alone, and why."""
    for entry in sweep.removed:
        log.info("agent cgroup %s removed (%s)", entry["path"], entry["why"])
    for entry in sweep.left_alone:
        log.warning("agent cgroup %s left alone: %s", entry["path"], entry["why"])
    if sweep.left_alone_total > len(sweep.left_alone):
        more = sweep.left_alone_total - len(sweep.left_alone)
        log.warning("%d more agent cgroups left alone", more)


def _write_quietly(path: str, value: int) -> None:
    try:
        with open(path, "w") as f:
            f.write(str(value))
    except OSError:
        pass


def _mb(value: int | None) -> str:
    return f"{value // MIB} MiB" if value else "none"


__all__ = [
    "AGENT_OOM_SCORE_ADJ",
    "ChildLimits",
    "Detected",
    "Isolation",
    "IsolationError",
    "Limits",
    "OomReport",
    "detect",
]
