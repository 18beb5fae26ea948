"""The agent pool of one workspace: warm children, slots, refill with backoff.

Theory of operation
-------------------
Every agent child of a workspace is spawned by its :class:`AgentPool`, an actor under the
workspace runtime's supervisor (``agents:<workspace id>``, started before the session
registry and stopped after it). A child's connection tasks run in the pool's nursery: the
pool owns every child, and stopping the pool stops them all (drain).

A child is spawned with the cwd and environment a session's child gets
(:func:`serve.sessions.agent_link.agent_env`), ``initialize``d, and then offers ``M`` slots
(``--sessions-per-agent``; default 1: one child per session, full isolation). Its
connection's handler is a :class:`acp.mux.SessionMux`, which routes updates and agent
requests by ACP ``sessionId`` to the session bound on it.

A session obtains a child with :meth:`AgentPool.acquire` (the one replaceable step of the
session's agent link): an :class:`Acquire` message whose reply is an
:class:`AgentLease` on a slot. A ready child with a free slot is taken at once (the most
loaded first, to pack tightly); otherwise the caller waits for a child being spawned, and
the pool spawns as many as the waiting callers need (``ceil(waiting / M)``), whatever the
refill state. A spawn that fails fails up to ``M`` waiting callers with its own exception
(``OSError``, :class:`~acp.errors.RequestTimeout`...), which the HTTP layer maps as before.

Warm capacity (``--warm-agents N``, default 1): the pool keeps ``N`` children with a free
slot ready ahead of need, counting spawns in flight (a child being spawned has ``M`` free
slots, less the waiting callers it will serve). With ``M = 1`` that is ``N`` idle children;
with ``M > 1`` spare slots on live children *are* the warm capacity, so a child is spawned
ahead only when fewer than ``N`` children (live or being spawned) will have room once the
waiting callers are served: an idle spare exists only while every other child is full, so
the next create never waits a whole agent start. In isolation (``M = 1``) the number of
spares adapts to the load (:mod:`serve.agents.adaptive`): ``--warm-agents`` plus the refills
the observed arrival rate keeps in flight (rate × measured spawn time), up to
``--warm-agents-max``, within the budget and the agents' memory ceiling; spares beyond that
are retired (the newest first) once arrivals pause. Children spawned ahead of need run at a
low CPU weight until a session takes them or waits for them (:mod:`serve.agents.priority`).
Warm children are not
sessions: they are not counted against session limits, and appear in ``/daemon/status``
under ``runtime.agents``. A late-bound daemon (``--bootstrap-token``) holds the warm
refill until :class:`InstallAgentEnv` (its bind) gives the tenant's environment, which every
child spawned afterwards gets on top of :func:`~serve.sessions.agent_link.agent_env`.

Failure: a spawn or ``initialize`` that fails, or a warm child that exits before any
session used it, counts as a consecutive failure. A child is stable once it has stayed up
:data:`STABLE_AFTER_S` after ``initialize``: only that is a successful start, and it resets
the count and the backoff (so an agent that dies a second after ``initialize`` is failing,
not respawned at full speed). The warm refill waits ``REFILL_BACKOFF_S * 2**(n-1)`` (capped
at :data:`MAX_REFILL_BACKOFF_S`) after each failure. After :data:`FAILING_AFTER` in a row
the pool is ``failing`` (the last error, truncated, in ``/daemon/status``; ``/readyz``
answers ``agent_unavailable`` when it is the primary workspace's pool, see
``serve/host.py``): the refill then only *probes*, one child at a time after the capped
backoff, so the pool recovers by itself once the agent works again (a probe child that
becomes stable ends ``failing``; one not needed as warm capacity is then stopped). Session
creates still try their own spawn at once (so their error reaches the caller).

Release: :meth:`AgentLease.release` ends the session's use of its slot. On an exclusive
child (``M = 1``) the child is stopped (by escalation) in the caller's task. On a shared
child the session is unbound from the mux (which kills the session's terminals) and
``session/close`` is sent when the agent offers it; an empty shared child is stopped unless
it is needed as warm capacity.

Agents without ``session/close`` (or a close that fails): the session stays inside the
child with its MCP servers, so its slot is not given back but becomes a *dead* slot
(``deadSessions``): a child hosts at most ``M`` sessions, live or dead, over its life, and a
child left with only dead slots is stopped (recycled) even when it would count as warm
capacity. ``/daemon/status`` says so (``withoutSessionClose: "recycle"``, per child
``closesSessions`` and ``deadSessions``). Recycling rather than refusing packing keeps
packing's memory saving for such agents while bounding what a child accumulates.

When a child exits, every session bound on it sees its connection close and restores
itself in place by acquiring a new slot (see ``serve/sessions/actor.py``); sessions on
other children are not involved. An idle session restored so is charged nothing: it asks
the pool (:class:`ChargeExit`), which counts each shared child's exit once in its own
restart window (the sessions' ``--agent-restart-*`` figures) and answers whether that
window still allows it; past it, the sessions' own windows count again.

Memory (``--agent-memory-budget-mb``): a sampler task measures each child's PSS (its
process tree, ``/proc/<pid>/smaps_rollup``, in a worker thread) every
:data:`SAMPLE_S` (:data:`SAMPLE_BUDGET_S` with a budget; an idle spare only every
:data:`IDLE_SAMPLE_EVERY`-th round); with a budget each child is also
measured right after ``initialize``, before the pool counts it. A new child is assumed to
cost as much as the largest child measured so far; before any child was measured the cost
is unknown, so only one child is spawned at a time until the first one is measured (callers
wait for it; none is refused or released for an unknown cost). When spawning one would pass
the budget
(stopping children do not count), the warm refill waits, and a caller that needs a child
makes the pool first ask the workspace runtime to release the least recently used idle
session (its agent is let go as with idle release, ``agent_released {reason:
"memory_budget"}``); when nothing can be released the caller gets ``503
memory_budget_exceeded`` with ``Retry-After``. Per-child memory is in ``/daemon/status``
(``runtime.agents[].children[].pssKiB``) and ``/metrics`` (``acp_serve_agent_pss_bytes``).
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import msgspec
import trio

from acp.client import AgentConnection
from acp.errors import AcpError, RemoteError
from acp.handler import ClientHandler
from acp.mux import SessionMux
from acp.process import ExitInfo
from acp.schema import SessionSetup
from actors import Actor, ActorError, Reply, RestartWindow
from serve.agents import compile_cache
from serve.agents.adaptive import WarmSizer
from serve.agents.memory import measure_trees
from serve.agents.primed import PrimedSession, discard, prime
from serve.agents.priority import RefillPriority
from serve.isolation import ChildLimits, Isolation
from serve.sessions.agent_link import agent_env, spawn_limited
from serve.sessions.errors import MemoryBudgetExceeded, SessionsUnavailable

if TYPE_CHECKING:
    from acp.schema import InitializeResult
    from serve.settings import Settings

log = logging.getLogger(__name__)

#: Consecutive spawn failures after which the pool is failing (the refill only probes).
FAILING_AFTER: Final = 3
#: Seconds a child must stay up after ``initialize`` to count as a successful start.
STABLE_AFTER_S: Final = 5.0
REFILL_BACKOFF_S: Final = 0.5
MAX_REFILL_BACKOFF_S: Final = 30.0
#: Characters of the last spawn error kept for /daemon/status.
MAX_ERROR_CHARS: Final = 300
#: Bound on ``session/close`` when a session leaves a shared child (seconds).
CLOSE_SESSION_TIMEOUT_S: Final = 2.0
#: Seconds an idle child gets after stdin EOF before SIGTERM (nothing of a turn to finish).
IDLE_EOF_GRACE_S: Final = 0.2
#: The same at daemon shutdown: none (stdin EOF and SIGTERM together; the exit must not
#: wait on an agent that ignores EOF, as qwen-code does).
SHUTDOWN_EOF_GRACE_S: Final = 0.0
#: Exited shared children whose restart charge is remembered (for their other sessions).
MAX_CHARGED: Final = 64
#: Memory sampling period without / with a budget (seconds).
SAMPLE_S: Final = 5.0
#: An idle (untaken) spare is measured once, then every this many sampling rounds.
IDLE_SAMPLE_EVERY: Final = 12
SAMPLE_BUDGET_S: Final = 1.0
#: Retry-After of ``503 memory_budget_exceeded`` (seconds).
#: Re-planning period of the adaptive warm capacity while arrivals are recent (seconds).
RESIZE_S: Final = 1.0


class AgentChild:
    """One initialized agent child and its slots (pool state; read by status pages)."""

    __slots__ = (
        "conn",
        "dead",
        "id",
        "limits",
        "mux",
        "primed",
        "ready_at",
        "slots",
        "stable",
        "stopping",
        "used",
    )

    def __init__(
        self,
        child_id: str,
        conn: AgentConnection,
        mux: SessionMux,
        limits: ChildLimits | None = None,
    ) -> None:
        self.id = child_id
        self.conn = conn
        self.mux = mux
        #: Its cgroup / watchdog entry (serve/isolation); removed once it is reaped.
        self.limits = limits
        #: lease id -> ACP session id once bound ("" before).
        self.slots: dict[int, str] = {}
        #: Sessions left inside the agent (it could not close them): dead slots.
        self.dead = 0
        self.ready_at = time.time()
        self.used = False  # a session has taken a slot at least once
        self.stopping = False
        self.stable = False  # stayed up STABLE_AFTER_S: a successful start
        #: A session opened ahead of need for the next create (primed.py), until taken.
        self.primed: PrimedSession | None = None

    @property
    def pid(self) -> int:
        return self.conn.process.pid


class AgentLease:
    """A session's slot on a child: the connection to talk to, and how to give it back."""

    def __init__(self, pool: AgentPool, child: AgentChild, lease_id: int, exclusive: bool) -> None:
        self.pool = pool
        self.child = child
        self.lease_id = lease_id
        self.exclusive = exclusive
        self.session_id: str | None = None
        self._handler: ClientHandler | None = None
        self.released = False

    @property
    def conn(self) -> AgentConnection:
        return self.child.conn

    @property
    def child_id(self) -> str:
        return self.child.id

    @property
    def shared(self) -> bool:
        return not self.exclusive

    async def charge_exit(self, intensity: int, period_s: float) -> bool:
        """Count this child's exit once against the pool's window of shared-child restarts
        (every session on the child asks; the first one counts it); True while it allows."""
        if self.exclusive:
            return False
        try:
            allowed: bool = await self.pool.ask(
                ChargeExit(self.child.id, intensity, period_s), timeout_s=5.0
            )
        except ActorError:
            return False
        return allowed

    async def take_primed(
        self, cwd: str, mcp_servers: Sequence[object], additional_directories: Sequence[str]
    ) -> SessionSetup | None:
        """The child's primed session (primed.py), once, if ``session/new`` with these
        parameters would have been the same request; a prime that does not fit is closed."""
        primed, self.child.primed = self.child.primed, None
        if primed is None:
            return None
        if primed.fits(cwd, mcp_servers, additional_directories):
            return primed.setup
        await discard(self.conn, primed)
        return None

    def bind(self, session_id: str, handler: ClientHandler) -> None:
        """Route ``session_id``'s updates and requests on this connection to ``handler``."""
        self.session_id = session_id
        self._handler = handler
        self.child.mux.bind(session_id, handler)
        self.pool._tell(Bound(self.child.id, self.lease_id, session_id))

    async def release(self, *, eof_grace_s: float | None = None) -> None:
        """Give the slot back (idempotent; bounded; safe from a cancelled scope). An
        exclusive child stopped while idle gets ``eof_grace_s`` after stdin EOF."""
        if self.released:
            return
        self.released = True
        if self.session_id is not None:
            self.child.mux.unbind(self.session_id, self._handler)
        left_behind = False  # the session stays inside the agent (no session/close)
        with trio.CancelScope(shield=True):
            if self.exclusive:
                await self.conn.aclose(grace_s=1.0, eof_grace_s=eof_grace_s)
            elif self.session_id is not None and not self.conn.closed:
                info = self.conn.info
                left_behind = True
                if info is not None and info.supports_close:
                    with trio.move_on_after(CLOSE_SESSION_TIMEOUT_S):
                        try:
                            await self.conn.close_session(
                                self.session_id, timeout_s=CLOSE_SESSION_TIMEOUT_S
                            )
                            left_behind = False
                        except (AcpError, RemoteError):
                            pass
        self.pool._tell(Release(self.child.id, self.lease_id, left_behind))


# ---- messages ---------------------------------------------------------------------------


class Acquire(msgspec.Struct, frozen=True):
    """Answered with a :class:`Reply` that resolves to an :class:`AgentLease`."""


class Release(msgspec.Struct, frozen=True):
    child_id: str
    lease_id: int
    #: The session could not be closed in the agent (no ``session/close``, or it failed):
    #: it stays inside the child, and its slot is not given back (a dead slot).
    left_behind: bool = False


class Bound(msgspec.Struct, frozen=True):
    child_id: str
    lease_id: int
    session_id: str


class ChargeExit(msgspec.Struct, frozen=True):
    """A session restoring itself after its shared child exited: answered True while the
    window of shared-child restarts allows (each child's exit counted once)."""

    child_id: str
    intensity: int
    period_s: float


class _Spawned(msgspec.Struct, frozen=True):
    child: Any  # AgentChild
    pss_kib: int = 0  # measured after initialize (with a budget), 0: not measured
    spawn_s: float = -1.0  # spawn to the initialize reply (seconds)


class _SpawnFailed(msgspec.Struct, frozen=True):
    error: Any  # Exception
    child_id: str = ""


class _Lowered(msgspec.Struct, frozen=True):
    """A refill's process runs (not yet initialized) at the refill CPU weight."""

    child_id: str
    limits: Any  # ChildLimits


class _Resize(msgspec.Struct, frozen=True):
    """Re-plan the adaptive warm capacity (its arrivals age out of the window)."""


class _Exited(msgspec.Struct, frozen=True):
    child_id: str
    exit_info: Any  # ExitInfo


class _Refill(msgspec.Struct, frozen=True):
    pass


class _Stable(msgspec.Struct, frozen=True):
    child_id: str


class InstallAgentEnv(msgspec.Struct, frozen=True):
    """Late binding (``POST /daemon/bind``): the tenant's variables, added to every child
    spawned from now on; the warm refill held since start (``--bootstrap-token``) begins.
    Answered with ``None`` once installed."""

    env: dict[str, str]


class Drain(msgspec.Struct, frozen=True):
    """Daemon shutdown: take no more callers, and stop every child no session is on (warm
    spares) at once, while the sessions close, instead of after them; the children left
    are stopped when the pool stops, without the EOF grace."""


class _Measured(msgspec.Struct, frozen=True):
    pss_kib: dict[str, int]  # child id -> KiB


class _RoomResult(msgspec.Struct, frozen=True):
    released: bool


class _Abandon(msgspec.Struct, frozen=True):
    """A caller stopped waiting (cancelled): forget its reply, or give back its lease."""

    reply: Any  # Reply[AgentLease]


PoolMsg = (
    Acquire
    | Release
    | Bound
    | ChargeExit
    | _Spawned
    | _SpawnFailed
    | _Exited
    | _Refill
    | _Stable
    | InstallAgentEnv
    | Drain
    | _Abandon
    | _Measured
    | _RoomResult
    | _Lowered
    | _Resize
)


class AgentPool(Actor[PoolMsg]):
    """The agent children of one workspace (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        workspace: str,
        *,
        name: str = "agents",
        isolation: Isolation | None = None,
        releaser: Callable[[], Awaitable[bool]] | None = None,
        has_releasable: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(name, inbox_size=1024)
        self.settings = settings
        self.isolation = isolation
        self.workspace = workspace
        self.warm_target = settings.warm_agents
        #: The adaptive part: arrivals x spawn time, up to --warm-agents-max (adaptive.py).
        self.sizer = WarmSizer(settings.warm_agents, settings.warm_agents_max)
        self._resize_scheduled = False
        #: Refills run at a lower CPU weight until a session takes them (priority.py).
        self.priority = RefillPriority(settings.agent_cpu_weight)
        #: A late-bound daemon spawns no warm child before its bind: a child would start
        #: without the tenant's environment and credentials (:class:`InstallAgentEnv`).
        self.unbound = settings.bootstrap
        self.extra_env: dict[str, str] = {}
        self.per_agent = max(1, settings.sessions_per_agent)
        self.children: dict[str, AgentChild] = {}
        self.spawning = 0
        self.waiters: deque[Reply[AgentLease]] = deque()
        self.failures = 0
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.spawned_total = 0
        self.exited_total = 0
        self.draining = False
        #: What a child the pool stops gets after stdin EOF (none at daemon shutdown).
        self._eof_grace_s = IDLE_EOF_GRACE_S
        self._backoff_until = 0.0  # trio clock
        self._refill_scheduled = False
        self._ids = itertools.count(1)
        self._leases = itertools.count(1)
        self._nursery: trio.Nursery | None = None
        self.budget_kib = settings.agent_memory_budget_mb * 1024
        self.pss_kib: dict[str, int] = {}
        self._largest_kib = 0  # the largest child measured: what a new one is assumed to cost
        self._making_room = False
        self.budget_refusals = 0
        self.budget_releases = 0
        #: From the workspace runtime: release the least recently used idle session (True
        #: when one let its agent go), and whether any session could be released.
        self.releaser = releaser
        self.has_releasable = has_releasable
        #: Restarts of shared children, each exit counted once (``ChargeExit``), and the
        #: answers given per exited child (the last :data:`MAX_CHARGED` children).
        self.child_restarts: RestartWindow | None = None
        self._charged: dict[str, bool] = {}
        #: The ``initialize`` result of the last child that came up (a warm spare's too):
        #: what the workspace's agent is and can do before any session exists (None: no
        #: child initialized yet). Read by ``/capabilities`` (which agents can fork).
        self.agent_info: InitializeResult | None = None

    # ---- read models -------------------------------------------------------------------

    @property
    def failing(self) -> bool:
        return self.failures >= FAILING_AFTER

    def free_slots(self, child: AgentChild) -> int:
        return 0 if child.stopping else self.per_agent - len(child.slots) - child.dead

    def warm_count(self) -> int:
        """Children with room for another session (idle ones when ``M = 1``)."""
        return sum(1 for c in self.children.values() if self.free_slots(c) > 0)

    def used_kib(self) -> int:
        """Measured PSS of the live children plus the assumed cost of spawns in flight."""
        live = sum(
            self.pss_kib.get(c.id, self._largest_kib)
            for c in self.children.values()
            if not c.stopping
        )
        return live + self.spawning * self._largest_kib

    def cost_unknown(self) -> bool:
        """With a budget, before any child was measured: spawns go one at a time."""
        return bool(self.budget_kib) and not self._largest_kib

    def fits_new_child(self) -> bool:
        if not self.budget_kib:
            return True
        if self.cost_unknown():
            return self.spawning == 0
        return self.used_kib() + self._largest_kib <= self.budget_kib

    def budget_error(self) -> Exception:
        used_mb = round(self.used_kib() / 1024)
        return MemoryBudgetExceeded(
            f"Agent memory budget exceeded ({used_mb} of {self.budget_kib // 1024} MiB in "
            "use) and no idle session can be released",
            "memory_budget_exceeded",
            budgetMb=self.budget_kib // 1024,
            usedMb=used_mb,
        )

    def refusal(self) -> Exception | None:
        """For a released session's next prompt: the 503 to answer at once, or None when a
        slot is free, a child fits the budget, or an idle session can make room."""
        if self._pick() is not None or self.fits_new_child() or self.cost_unknown():
            return None
        if self.has_releasable is not None and self.has_releasable():
            return None
        self.budget_refusals += 1
        return self.budget_error()

    def status(self) -> dict[str, Any]:
        children = [
            {
                "id": c.id,
                "pid": c.pid,
                "state": "stopping"
                if c.stopping
                else "warm"
                if not c.slots
                else "full"
                if self.free_slots(c) == 0
                else "shared",
                "sessions": sum(1 for sid in c.slots.values() if sid),
                "primed": c.primed is not None,
                "closesSessions": c.conn.info is not None and c.conn.info.supports_close,
                "deadSessions": c.dead,
                # oversized lines naming no session on it (acp/mux.py; logged, not reported)
                "unattributedDroppedLines": c.mux.unattributed_drops,
                "slots": self.per_agent,
                "readyAt": _iso(c.ready_at),
                "pssKiB": self.pss_kib.get(c.id),
                "limits": c.limits.usage() if c.limits is not None else None,
            }
            for c in self.children.values()
        ]
        out: dict[str, Any] = {
            "workspaceCwd": self.workspace,
            "warmTarget": self.warm_target,
            # the adaptive pool: the most spares, and how many it keeps now (adaptive.py)
            "warmMax": self.sizer.maximum if self.per_agent == 1 else self.warm_target,
            "warmWanted": self._wanted_rooms(),
            # children spawned ahead of need still at the refill CPU weight (priority.py)
            "lowPriority": self.priority.count(),
            "sessionsPerAgent": self.per_agent,
            # what happens to a session the agent cannot close (no session/close): it keeps
            # its slot, and a child holding only such sessions is stopped
            "withoutSessionClose": "recycle",
            "warm": self.warm_count(),
            "spawning": self.spawning,
            "waiting": len(self.waiters),
            "failing": self.failing,
            "consecutiveFailures": self.failures,
            "spawnedTotal": self.spawned_total,
            "exitedTotal": self.exited_total,
            "memoryBudgetMb": self.budget_kib // 1024 or None,
            "memoryUsedKiB": sum(
                self.pss_kib.get(c.id, 0) for c in self.children.values() if not c.stopping
            ),
            "budgetReleases": self.budget_releases,
            "budgetRefusals": self.budget_refusals,
            "children": children,
        }
        if self.last_error is not None:
            out["lastError"] = self.last_error
            out["lastErrorAt"] = _iso(self.last_error_at or time.time())
        return out

    # ---- the session's step ------------------------------------------------------------

    async def acquire(
        self,
        nursery: trio.Nursery | None = None,
        *,
        cwd: str | None = None,
        handler: ClientHandler | None = None,
        timeout_s: float | None = None,
    ) -> AgentLease:
        """A slot on an initialized child (waits for a spawn when none is free).

        The :class:`~serve.sessions.agent_link.AgentSource` step: the child's tasks run in
        the pool's nursery, not ``nursery``; its cwd is the workspace's; ``handler`` is
        reached through :meth:`AgentLease.bind`; ``initialize`` used the daemon's
        ``--initialize-timeout-ms``."""
        if cwd is not None and cwd != self.workspace:
            raise ValueError(f"agent pool of {self.workspace} asked for a child in {cwd}")
        reply: Reply[AgentLease] = await self.ask(Acquire(), timeout_s=math.inf)
        try:
            return await reply.wait()
        except BaseException:
            # Cancelled while waiting: a lease resolved later is given back by the pool.
            self._tell(_Abandon(reply))
            raise

    async def install_env(self, env: dict[str, str]) -> None:
        """See :class:`InstallAgentEnv`."""
        await self.ask(InstallAgentEnv(dict(env)), timeout_s=10.0)

    def _tell(self, msg: Any) -> None:
        try:
            self.tell_nowait(msg)
        except ActorError:
            log.debug("agent pool %s gone; dropped %s", self.name, type(msg).__name__)

    # ---- lifecycle ---------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[Actor[PoolMsg]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.draining = False
            self._eof_grace_s = IDLE_EOF_GRACE_S
            nursery.start_soon(self._sample_memory)
            if not self.unbound:
                self._probe_compile_cache()
            try:
                await super().run(task_status=task_status)
            finally:
                self._nursery = None
                nursery.cancel_scope.cancel()

    async def on_start(self) -> None:
        self._plan()

    async def on_stop(self) -> None:
        """Drain: fail waiting callers, stop every child (bounded)."""
        self._drain("Agent pool stopped")
        with trio.move_on_after(5):
            async with trio.open_nursery() as nursery:
                for child in list(self.children.values()):
                    child.stopping = True
                    nursery.start_soon(_aclose, child.conn, child.limits, self._eof_grace_s)
        self.children.clear()

    def _drain(self, why: str) -> None:
        self.draining = True
        for reply in list(self.waiters):
            reply.fail(SessionsUnavailable(why, "daemon_draining"))
        self.waiters.clear()

    def _probe_compile_cache(self) -> None:
        """One probe child populates the node compile cache when it needs it (primary
        workspace only; a late-bound daemon's after its bind, with the tenant's env)."""
        if self._nursery is None or self.workspace != self.settings.primary_workspace:
            return
        self._nursery.start_soon(
            functools.partial(
                compile_cache.warm_up,
                self.settings,
                cwd=self.workspace,
                env={**agent_env(self.settings), **self.extra_env},
            )
        )

    # ---- handling ----------------------------------------------------------------------

    async def handle(self, msg: PoolMsg) -> Any:
        match msg:
            case Acquire():
                reply: Reply[AgentLease] = Reply()
                if self.draining:
                    reply.fail(SessionsUnavailable("Agent pool is draining", "daemon_draining"))
                    return reply
                self.sizer.arrival(trio.current_time())
                self.waiters.append(reply)
                self._serve_waiters()
                self._plan()
                return reply
            case Release(child_id=cid, lease_id=lid, left_behind=left_behind):
                child = self.children.get(cid)
                if child is not None:
                    child.slots.pop(lid, None)
                    if left_behind:
                        child.dead += 1
                    self._after_release(child)
                self._serve_waiters()
                self._plan()
            case Drain():
                self._drain("Agent pool is draining")
                self._eof_grace_s = SHUTDOWN_EOF_GRACE_S
                for child in list(self.children.values()):
                    if not child.slots and not child.stopping:
                        child.stopping = True
                        self._stop_child(child)
                return None
            case InstallAgentEnv(env=env):
                self.extra_env = dict(env)
                if self.unbound:
                    self._probe_compile_cache()
                self.unbound = False
                self._plan()
                return None
            case Bound(child_id=cid, lease_id=lid, session_id=sid):
                child = self.children.get(cid)
                if child is not None and lid in child.slots:
                    child.slots[lid] = sid
            case _Spawned(child=child, pss_kib=pss_kib, spawn_s=spawn_s):
                self.spawning -= 1
                self.spawned_total += 1
                self.sizer.spawned(spawn_s)
                if pss_kib:
                    self.pss_kib[child.id] = pss_kib
                    self._largest_kib = max(self._largest_kib, pss_kib)
                if self.draining:
                    child.stopping = True
                    self._stop_child(child)
                    return None
                self.children[child.id] = child
                self.agent_info = child.conn.info or self.agent_info
                assert self._nursery is not None
                self._nursery.start_soon(self._watch, child)
                self._nursery.start_soon(self._stable_later, child.id)
                self._serve_waiters()
                self._plan()
            case _SpawnFailed(error=error, child_id=failed_id):
                self.spawning -= 1
                self.priority.forget(failed_id)
                self._note_failure(error)
                for _ in range(self.per_agent):
                    if not self.waiters:
                        break
                    self.waiters.popleft().fail(error)
                self._plan()
            case _Exited(child_id=cid, exit_info=info):
                child = self.children.pop(cid, None)
                self.priority.forget(cid)
                self.pss_kib.pop(cid, None)
                self.exited_total += 1
                # (A used child's exit is its sessions' business: they restart in place
                # within their own restart window; it may also be a session's release.)
                if child is not None and not child.stopping and not child.used:
                    when = "" if child.stable else f" within {STABLE_AFTER_S:g} s of initialize"
                    self._note_failure(
                        RuntimeError(
                            f"warm agent exited{when} (code {info.exit_code}, signal {info.signal})"
                        )
                    )
                self._plan()
            case _Stable(child_id=cid):
                child = self.children.get(cid)
                if child is not None and not child.stopping and not child.conn.closed:
                    child.stable = True
                    self.failures = 0
                    self._backoff_until = 0.0
                    others = sum(
                        1 for c in self.children.values() if c is not child and self.free_slots(c)
                    )
                    if not child.slots and others >= self._wanted_rooms():
                        # A probe (or a spawn whose caller left) that is not needed as warm.
                        child.stopping = True
                        self._stop_child(child)
                    self._plan()
            case _Refill():
                self._refill_scheduled = False
                self._plan()
            case _Resize():
                self._resize_scheduled = False
                self._plan()
            case _Lowered(child_id=cid, limits=limits):
                self.priority.lowered(cid, limits)
                if self.waiters:  # a caller waits for the spawns in flight
                    self.priority.restore(cid)
            case _Measured(pss_kib=measured):
                for cid, kib in measured.items():
                    if cid in self.children:
                        self.pss_kib[cid] = kib
                        self._largest_kib = max(self._largest_kib, kib)
                if self.budget_kib:
                    self._plan()
            case _RoomResult(released=released):
                self._making_room = False
                if released:
                    self.budget_releases += 1
                    self._serve_waiters()
                    self._plan()
                else:
                    # Nothing could be released: the callers no spawn in flight will serve
                    # get the 503 now (the newest first; the oldest keep their place).
                    capacity = self.spawning * self.per_agent
                    while len(self.waiters) > capacity:
                        self.budget_refusals += 1
                        self.waiters.pop().fail(self.budget_error())
            case _Abandon(reply=reply):
                try:
                    self.waiters.remove(reply)
                except ValueError:
                    if reply.done and self._nursery is not None:
                        self._nursery.start_soon(_give_back, reply)
            case ChargeExit(child_id=cid, intensity=intensity, period_s=period_s):
                if cid not in self._charged:
                    if self.child_restarts is None:
                        self.child_restarts = RestartWindow(intensity, period_s)
                    allowed = self.child_restarts.allows()
                    if allowed:
                        self.child_restarts.count()
                    self._charged[cid] = allowed
                    while len(self._charged) > MAX_CHARGED:
                        del self._charged[next(iter(self._charged))]
                return self._charged[cid]
        return None

    def _serve_waiters(self) -> None:
        while self.waiters:
            child = self._pick()
            if child is None:
                return
            reply = self.waiters.popleft()
            lease_id = next(self._leases)
            child.slots[lease_id] = ""
            child.used = True
            self.priority.restore(child.id)  # a session's agent runs at the normal weight
            reply.set(AgentLease(self, child, lease_id, exclusive=self.per_agent == 1))

    def _pick(self) -> AgentChild | None:
        """The live child with a free slot and the most sessions (pack tightly)."""
        best: AgentChild | None = None
        for child in self.children.values():
            if self.free_slots(child) <= 0 or child.conn.closed:
                continue
            if best is None or len(child.slots) > len(best.slots):
                best = child
        return best

    def _after_release(self, child: AgentChild) -> None:
        if child.slots or child.stopping:
            return
        if child.dead:
            # Only sessions it could not close are left in it: recycle it, warm or not.
            log.info(
                "recycling agent child %s (pid %s): it holds only %d session(s) it cannot close",
                child.id,
                child.pid,
                child.dead,
            )
            child.stopping = True
            self._stop_child(child)
            return
        if self.per_agent == 1:
            # The lease closed it; a used exclusive child never goes back to warm.
            child.stopping = True
            self._stop_child(child)
            return
        others = sum(1 for c in self.children.values() if c is not child and self.free_slots(c) > 0)
        if others >= self._wanted_rooms():
            child.stopping = True
            self._stop_child(child)

    def _plan(self) -> None:
        """Spawn what waiting callers need, then refill the warm capacity."""
        if self.draining or self._nursery is None:
            return
        needed = math.ceil(len(self.waiters) / self.per_agent)
        if needed:  # callers wait for the spawns in flight: none of them runs lowered
            self.priority.restore_all()
        while self.spawning < needed:
            if not self.fits_new_child():
                if not self.cost_unknown():  # (unknown: wait for the first measurement)
                    self._make_room()
                return
            self._spawn()
        if self.unbound or (not self.warm_target and not self.failing):
            return
        now = trio.current_time()
        if now < self._backoff_until:
            if not self._refill_scheduled:
                self._refill_scheduled = True
                self._nursery.start_soon(self._refill_later, self._backoff_until - now)
            return
        if self.failing:
            # Probe: one child at a time, until one becomes stable (or fails again).
            unproven = any(not c.stable and not c.stopping for c in self.children.values())
            if not self.spawning and not unproven and self.fits_new_child():
                self._spawn(refill=True)
            return
        spare = self._rooms_after_waiters()
        while spare < self.warm_target and self.fits_new_child():
            self._spawn(refill=True)
            spare += 1
        if self.sizer.adaptive and self.per_agent == 1:  # (packed: live children's room)
            self._plan_adaptive(now, spare)

    def _wanted_rooms(self) -> int:
        """Children with room to keep (the adaptive size counts in rooms when ``M = 1``)."""
        if self.per_agent > 1 or not self.sizer.adaptive:
            return self.warm_target
        return self.sizer.wanted(trio.current_time())

    def _plan_adaptive(self, now: float, spare: int) -> None:
        """Isolation (``M = 1``) above the minimum: as many spares as arrivals x spawn time
        want (within --warm-agents-max, the budget and the agents' ceiling); spares beyond
        that are retired once arrivals paused (adaptive.QUIET_S), the newest first."""
        wanted = self.sizer.wanted(now)
        while spare < wanted and self.fits_new_child() and self._fits_ceiling():
            self._spawn(refill=True)
            spare += 1
        if self.sizer.quiet(now):
            for child in reversed(list(self.children.values())):
                if spare <= wanted:
                    break
                if child.slots or child.used or child.stopping or child.conn.closed:
                    continue
                child.stopping = True
                self._stop_child(child)
                spare -= 1
        if not self.sizer.settled(now) and not self._resize_scheduled and self._nursery:
            self._resize_scheduled = True
            self._nursery.start_soon(self._resize_later)

    def _fits_ceiling(self) -> bool:
        """Room below the agents' memory ceiling for one more child of the largest size
        measured (an unknown size: no child beyond the minimum)."""
        room = self.isolation.ceiling_room_bytes() if self.isolation is not None else None
        if room is None:
            return True
        largest = self._largest_kib * 1024
        return bool(largest) and room - self.spawning * largest >= largest

    async def _resize_later(self) -> None:
        await trio.sleep(RESIZE_S)
        self._tell(_Resize())

    def _rooms_after_waiters(self) -> int:
        """Children, live or being spawned, that will still have a free slot once the
        waiting callers are served (the most loaded first, as :meth:`_pick` does; a child
        being spawned offers ``M`` slots): the warm capacity counted ahead."""
        free = sorted(
            self.free_slots(c)
            for c in self.children.values()
            if self.free_slots(c) > 0 and not c.conn.closed
        )
        free += [self.per_agent] * self.spawning
        waiting = len(self.waiters)
        rooms = 0
        for slots in free:
            taken = min(slots, waiting)
            waiting -= taken
            rooms += slots > taken
        return rooms

    def _make_room(self) -> None:
        """Ask the runtime to release the least recently used idle session (a task)."""
        if self._making_room or self._nursery is None:
            return
        self._making_room = True
        self._nursery.start_soon(self._room_task)

    async def _room_task(self) -> None:
        released = False
        if self.releaser is not None:
            try:
                released = await self.releaser()
            except Exception:
                log.exception("releasing an idle session for the memory budget failed")
        self._tell(_RoomResult(released))

    async def _sample_memory(self) -> None:
        period = SAMPLE_BUDGET_S if self.budget_kib else SAMPLE_S
        rounds = 0
        while True:
            # An idle spare is measured every IDLE_SAMPLE_EVERY-th round only: reading a
            # node child's smaps_rollup costs ~10 ms of CPU (a page-table walk under its
            # mmap lock) and an untaken child hardly changes; a taken one every round.
            rounds += 1
            pids = {
                c.id: c.pid
                for c in self.children.values()
                if not c.stopping
                and (c.used or c.id not in self.pss_kib or rounds % IDLE_SAMPLE_EVERY == 0)
            }
            if pids:
                by_pid = await trio.to_thread.run_sync(measure_trees, list(pids.values()))
                self._tell(_Measured({cid: by_pid.get(pid, 0) for cid, pid in pids.items()}))
            await trio.sleep(period)

    async def _stable_later(self, child_id: str) -> None:
        await trio.sleep(STABLE_AFTER_S)
        self._tell(_Stable(child_id))

    async def _refill_later(self, delay_s: float) -> None:
        await trio.sleep(delay_s)
        self._tell(_Refill())

    def _note_failure(self, error: BaseException) -> None:
        self.failures += 1
        self.last_error = _truncate(f"{type(error).__name__}: {error}")
        self.last_error_at = time.time()
        backoff = min(MAX_REFILL_BACKOFF_S, REFILL_BACKOFF_S * 2 ** (self.failures - 1))
        self._backoff_until = trio.current_time() + backoff
        if self.failing:
            log.error(
                "agent command keeps failing in %s (%d in a row): %s; probing with backoff",
                self.workspace,
                self.failures,
                self.last_error,
            )
        else:
            log.warning("agent spawn failed in %s: %s", self.workspace, self.last_error)

    # ---- tasks -------------------------------------------------------------------------

    def _spawn(self, *, refill: bool = False) -> None:
        """Spawn a child; a ``refill`` (ahead of need) at the refill CPU weight."""
        assert self._nursery is not None
        self.spawning += 1
        self._nursery.start_soon(self._spawn_child, f"agent-{next(self._ids)}", refill)

    async def _spawn_child(self, child_id: str, refill: bool = False) -> None:
        settings = self.settings
        init_timeout = settings.initialize_timeout_ms / 1000
        mux = SessionMux()
        assert self._nursery is not None
        started = trio.current_time()
        weight = self.priority.spawn_weight(refill)
        try:
            # Its file sandbox and its limits (spawn_limited), the tenant's env after a bind.
            conn, limits = await spawn_limited(
                self._nursery,
                settings,
                self.isolation,
                cwd=self.workspace,
                env={**agent_env(settings), **self.extra_env},
                handler=mux,
                request_timeout_s=init_timeout,
                cpu_weight=weight,
            )
        except OSError as exc:
            self._tell(_SpawnFailed(exc, child_id))
            return
        if weight is not None:
            self._tell(_Lowered(child_id, limits))
        try:
            await conn.initialize(timeout_s=init_timeout)
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                # Nothing to finish before initialize answered (a pool stopped mid-spawn
                # does not wait out a full EOF grace on an agent that ignores EOF).
                await conn.aclose(grace_s=1.0, eof_grace_s=self._eof_grace_s)
                if limits is not None:
                    await limits.aclose()
            if not isinstance(exc, Exception):
                raise
            self._tell(_SpawnFailed(exc, child_id))
            return
        child = AgentChild(child_id, conn, mux, limits)
        if refill:  # ahead of need: its first session/new too (primed.py)
            child.primed = await prime(conn, self.workspace, init_timeout)
        pss_kib = 0
        if self.budget_kib:  # its cost before the pool counts it (one /proc scan)
            measured = await trio.to_thread.run_sync(measure_trees, [conn.process.pid])
            pss_kib = measured.get(conn.process.pid, 0)
        spawn_s = trio.current_time() - started
        self._tell(_Spawned(child, pss_kib, spawn_s))

    async def _watch(self, child: AgentChild) -> None:
        try:
            info: ExitInfo = await child.conn.wait_closed()
            if child.limits is not None:
                child.limits.verdict(info)  # read before its cgroup goes (agent_oom)
        finally:
            if child.limits is not None:
                await child.limits.aclose()
        self._tell(_Exited(child.id, info))

    def _stop_child(self, child: AgentChild) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(_aclose, child.conn, child.limits, self._eof_grace_s)


async def _give_back(reply: Reply[AgentLease]) -> None:
    try:
        lease = await reply.wait()
    except Exception:
        return
    await lease.release()


async def _aclose(
    conn: AgentConnection,
    limits: ChildLimits | None = None,
    eof_grace_s: float = IDLE_EOF_GRACE_S,
) -> None:
    """Stop a child the pool holds: warm, spare or drained, so nothing of a turn is running;
    an agent that ignores stdin EOF gets only ``eof_grace_s`` before SIGTERM."""
    await conn.aclose(grace_s=1.0, eof_grace_s=eof_grace_s)
    if limits is not None:
        await limits.aclose()


def _truncate(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def _iso(epoch_s: float) -> str:
    from datetime import UTC, datetime

    moment = datetime.fromtimestamp(epoch_s, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
