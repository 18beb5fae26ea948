"""The agent pool of one workspace: the actor that owns its children and plans their spawns.

Theory of operation
-------------------
Every agent child of a workspace is spawned by its :class:`AgentPool`, an actor under the
workspace runtime's supervisor (``agents:<workspace id>``, started before the session
registry and stopped after it). A child's connection tasks run in the pool's nursery: the
pool owns every child, and stopping the pool stops them all (drain). The parts:

* :mod:`serve.agents.child` — one child: its record, its start (spawn with a session's cwd
  and environment, then ``initialize``), its watch and its stop;
* :mod:`serve.agents.slots` — each child offers ``M`` slots (``--sessions-per-agent``), given
  to the waiting callers (most loaded child first) as :class:`~serve.agents.slots.AgentLease`;
* :mod:`serve.agents.memory_budget` — each child's PSS against ``--agent-memory-budget-mb``;
* :mod:`serve.agents.spawn_health` — consecutive failures, the refill's backoff, ``failing``;
* :mod:`serve.agents.warm` (with :mod:`serve.agents.adaptive`) — how much to keep warm and
  what to retire; :mod:`serve.agents.priority` — the spares' low CPU weight until taken;
* :mod:`serve.agents.exit_charge` — a shared child's exit, charged once to its sessions'
  restart window; :mod:`serve.agents.pool_view` — what ``/daemon/status`` shows of a pool;
* :mod:`serve.agents.messages` — what the actor receives; this module — the actor: it
  applies each message and re-plans (:meth:`AgentPool._plan`).

A session obtains a child with :meth:`AgentPool.acquire` (the one replaceable step of the
session's agent link): an :class:`~serve.agents.messages.Acquire` whose reply is an
:class:`AgentLease` on a slot. A ready child with a free slot is taken at once; otherwise
the caller waits for a child being spawned, and the pool spawns as many as the waiting
callers need (``ceil(waiting / M)``), whatever the refill state. A spawn that fails fails up
to ``M`` waiting callers with its own exception (``OSError``,
:class:`~acp.errors.RequestTimeout`...), which the HTTP layer maps as before.

Warm capacity (``--warm-agents N``, default 1): how many children with a free slot the pool
keeps ready ahead of need, and which idle ones it retires, is a policy of its own
(:mod:`serve.agents.warm`: ``N`` idle children in isolation, adapting to the arrivals up to
``--warm-agents-max``; in packed mode the live children's free slots, and a spare child for
full ones only with ``--packed-spare``); the pool carries it out. Children spawned ahead of
need run at a low CPU weight until a session takes them or waits for them
(:mod:`serve.agents.priority`). Warm children are not sessions: they are not counted against
session limits, and appear in ``/daemon/status`` under ``runtime.agents``. A late-bound
daemon (``--bootstrap-token``) holds the warm refill until
:class:`~serve.agents.messages.InstallAgentEnv` (its bind) gives the tenant's environment,
which every child spawned afterwards gets on top of
:func:`~serve.sessions.agent_link.agent_env`.

Tenants (``--auth-*``): a child serves one principal all its life (:mod:`serve.agents.slots`).
The warm capacity is ``warm_tenant``'s (the operator's at start, then the latest creator's).

Failure (:mod:`serve.agents.spawn_health`): while the pool is ``failing`` the refill only
*probes*, one child at a time after the capped backoff, so the pool recovers by itself once
the agent works again (a stable probe child ends ``failing``; one not needed as warm is
then stopped). Session creates still spawn their own at once (their error reaches the
caller), unless the sandbox refused the agent a path: they get that refusal, no spawn.

Release: an empty shared child is stopped unless it is needed as warm capacity; a used
exclusive child never goes back to warm. A child left with only dead slots (sessions the
agent cannot close, :mod:`serve.agents.slots`) is stopped (recycled) even when it would
count as warm capacity. ``/daemon/status`` says so (``withoutSessionClose: "recycle"``, per
child ``closesSessions`` and ``deadSessions``). Recycling rather than refusing packing
keeps packing's memory saving for such agents while bounding what a child accumulates.

When a child exits, every session bound on it sees its connection close and restores
itself in place by acquiring a new slot (see ``serve/sessions/actor.py``); sessions on
other children are not involved. An idle session restored so is charged nothing: it asks
the pool (:class:`~serve.agents.messages.ChargeExit`), which counts each shared child's
exit once in its own restart window (the sessions' ``--agent-restart-*`` figures) and
answers whether that window still allows it; past it, the sessions' own windows count again.

Memory (:mod:`serve.agents.memory_budget`): when spawning one more child would pass the budget the
warm refill waits, and a caller that needs a child makes the pool ask the workspace runtime
(``releaser``) to release the least recently used idle session; when nothing can be
released the callers no spawn in flight will serve get ``memory_budget_exceeded``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import trio

from acp.errors import ChannelClosed
from acp.handler import ClientHandler
from actors import Actor, ActorError, Reply
from serve.agents import compile_cache
from serve.agents.child import (
    IDLE_EOF_GRACE_S,
    SHUTDOWN_EOF_GRACE_S,
    AgentChild,
    start_child,
    stop_child,
    watch_child,
)
from serve.agents.exit_charge import ExitCharges
from serve.agents.memory_budget import MemoryBudget, measure_one, sample_memory
from serve.agents.messages import (
    Abandon,
    Acquire,
    Bound,
    ChargeExit,
    Drain,
    Exited,
    InstallAgentEnv,
    Lowered,
    Measured,
    PoolMsg,
    Primed,
    Refill,
    Release,
    Resize,
    RoomResult,
    Spawned,
    SpawnFailed,
    Stable,
)
from serve.agents.pool_view import pool_status
from serve.agents.primed import prime
from serve.agents.priority import RefillPriority
from serve.agents.slots import AgentLease, Slots, Waiter, close_inside, give_back
from serve.agents.spawn_health import STABLE_AFTER_S, SpawnHealth
from serve.agents.warm import WarmPolicy
from serve.isolation import ChildLimits, Isolation, sandbox
from serve.isolation.tenants import OPERATOR_TENANT, multi_user
from serve.sessions.agent_link import agent_env
from serve.sessions.errors import AgentSandboxDenied, AgentStartFailing, SessionsUnavailable

if TYPE_CHECKING:
    from acp.schema import InitializeResult
    from serve.settings import Settings

__all__ = ["AgentLease", "AgentPool", "Drain", "InstallAgentEnv"]

log = logging.getLogger(__name__)

#: Re-planning period of the adaptive warm capacity while arrivals are recent (seconds).
RESIZE_S: Final = 1.0
#: Bound on the pool's answer to a lease given back (seconds): past it the lease goes on
#: (the pool takes the slot when it reads the message; only ``/daemon/status`` lags).
RELEASE_ANSWER_S: Final = 1.0


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
        #: How much to keep warm and what to retire (warm.py, adaptive.py).
        self.warm = WarmPolicy(
            settings.warm_agents,
            settings.warm_agents_max,
            settings.sessions_per_agent,
            packed_spare=settings.packed_spare,
        )
        self._resize_scheduled = False
        #: Refills run at a lower CPU weight until a session takes them (priority.py).
        self.priority = RefillPriority(settings.agent_cpu_weight)
        #: A late-bound daemon spawns no warm child before its bind: a child would start
        #: without the tenant's environment and credentials (:class:`InstallAgentEnv`).
        self.unbound = settings.bootstrap
        self.extra_env: dict[str, str] = {}
        #: The children, their slots and the waiting callers (slots.py).
        self.slots = Slots(settings.sessions_per_agent)
        self.per_agent = self.slots.per_agent
        self.children = self.slots.children
        self.spawning = 0
        #: The tenant the warm capacity is for (the module docstring); one without --auth-*.
        self.warm_tenant = OPERATOR_TENANT
        self.tenants = multi_user(settings)
        self.health = SpawnHealth(workspace)
        self.spawned_total = 0
        self.exited_total = 0
        self.draining = False
        #: The inbox is read (``on_start`` to ``on_stop``): a lease given back waits only then.
        self.serving = False
        #: What a child the pool stops gets after stdin EOF (none at daemon shutdown).
        self._eof_grace_s = IDLE_EOF_GRACE_S
        self._refill_scheduled = False
        self._ids = itertools.count(1)
        self._nursery: trio.Nursery | None = None
        self.budget = MemoryBudget(settings.agent_memory_budget_mb)
        #: From the workspace runtime: release the least recently used idle session (True
        #: when one let its agent go), and whether any session could be released.
        self.releaser = releaser
        self.has_releasable = has_releasable
        #: Restarts of shared children, each exit counted once (``ChargeExit``).
        self.exit_charges = ExitCharges()
        #: The ``initialize`` result of the last child that came up (a warm spare's too;
        #: None: none yet): read by ``/capabilities`` (which agents can fork).
        self.agent_info: InitializeResult | None = None

    # ---- read models -------------------------------------------------------------------

    @property
    def failing(self) -> bool:
        return self.health.failing

    @property
    def failures(self) -> int:
        return self.health.failures

    def warm_count(self) -> int:
        """Children with room for another session (idle ones when ``M = 1``)."""
        return self.slots.warm_count()

    def fits_new_child(self) -> bool:
        return self.budget.fits_new_child(self.children.values(), self.spawning)

    def refusal(self, tenant: str | None = None) -> Exception | None:
        """For a released session's next prompt: the 503 to answer at once, or None when a
        slot is free, a child fits the budget, or an idle session can make room."""
        free = self.slots.pick(tenant if tenant and self.tenants else OPERATOR_TENANT) is not None
        if free or self.fits_new_child() or self.budget.cost_unknown():
            return None
        if self.has_releasable is not None and self.has_releasable():
            return None
        self.budget.refusals += 1
        return self.budget.error(self.children.values(), self.spawning)

    def status(self) -> dict[str, Any]:
        return pool_status(self)

    # ---- the session's step ------------------------------------------------------------

    async def acquire(
        self,
        nursery: trio.Nursery | None = None,
        *,
        cwd: str | None = None,
        handler: ClientHandler | None = None,
        timeout_s: float | None = None,
        tenant: str | None = None,
    ) -> AgentLease:
        """A slot on an initialized child of ``tenant`` (waits for a spawn when none is free).

        The :class:`~serve.sessions.agent_link.AgentSource` step: the child's tasks run in
        the pool's nursery, not ``nursery``; its cwd is the workspace's; ``handler`` is
        reached through :meth:`AgentLease.bind`; ``initialize`` used the daemon's
        ``--initialize-timeout-ms``."""
        if cwd is not None and cwd != self.workspace:
            raise ValueError(f"agent pool of {self.workspace} asked for a child in {cwd}")
        one = tenant if tenant and self.tenants else OPERATOR_TENANT  # one without --auth-*
        reply: Reply[AgentLease] = await self.ask(Acquire(one), timeout_s=math.inf)
        try:
            return await reply.wait()
        except BaseException:
            # Cancelled while waiting: a lease resolved later is given back by the pool.
            self._tell(Abandon(reply))
            raise

    async def install_env(self, env: dict[str, str]) -> None:
        """See :class:`InstallAgentEnv`."""
        await self.ask(InstallAgentEnv(dict(env)), timeout_s=10.0)

    # ---- the leases' port (serve.agents.slots.LeaseOwner) ------------------------------

    def slot_bound(self, child_id: str, lease_id: int, session_id: str) -> None:
        self._tell(Bound(child_id, lease_id, session_id))

    async def slot_released(self, child_id: str, lease_id: int, left_behind: bool) -> None:
        msg = Release(child_id, lease_id, left_behind)
        if not self.serving:  # stopping: nobody would answer (on_stop stops every child)
            self._tell(msg)
            return
        try:
            await self.ask(msg, timeout_s=RELEASE_ANSWER_S)
        except ActorError:
            log.debug("agent pool %s did not answer the release of %s", self.name, child_id)

    async def charge_exit(self, child_id: str, intensity: int, period_s: float) -> bool:
        try:
            allowed: bool = await self.ask(ChargeExit(child_id, intensity, period_s), timeout_s=5.0)
        except ActorError:
            return False
        return allowed

    def _tell(self, msg: PoolMsg) -> None:
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
            nursery.start_soon(
                sample_memory,
                self.budget,
                self.children.values,
                lambda pss_kib: self._tell(Measured(pss_kib)),
            )
            if not self.unbound:
                self._probe_compile_cache()
            try:
                await super().run(task_status=task_status)
            finally:
                self._nursery = None
                nursery.cancel_scope.cancel()

    async def on_start(self) -> None:
        self.serving = True
        self._plan()

    async def on_stop(self) -> None:
        """Drain: fail waiting callers, stop every child (bounded)."""
        self.serving = False
        self._drain("Agent pool stopped")
        with trio.move_on_after(5):
            async with trio.open_nursery() as nursery:
                for child in list(self.children.values()):
                    child.stopping = True
                    child.answer_claim()
                    nursery.start_soon(stop_child, child.conn, child.limits, self._eof_grace_s)
        self.children.clear()

    def _drain(self, why: str) -> None:
        self.draining = True
        for reply in list(self.slots.waiters):
            reply.fail(SessionsUnavailable(why, "daemon_draining"))
        self.slots.waiters.clear()

    def _probe_compile_cache(self) -> None:
        """One probe child populates the node compile cache when it needs it (primary
        workspace only; a late-bound daemon's after its bind, with the tenant's env)."""
        if self._nursery is not None and self.workspace == self.settings.primary_workspace:
            env = {**agent_env(self.settings), **self.extra_env}
            probe = functools.partial(compile_cache.warm_up, self.settings, cwd=self.workspace)
            self._nursery.start_soon(functools.partial(probe, env=env))

    # ---- handling ----------------------------------------------------------------------

    async def handle(self, msg: PoolMsg) -> Reply[AgentLease] | bool | None:
        waiters = self.slots.waiters
        match msg:
            case Acquire(tenant=tenant):
                reply = Waiter(tenant)
                if self.draining:
                    reply.fail(SessionsUnavailable("Agent pool is draining", "daemon_draining"))
                    return reply
                if (denied := self.health.refusal()) is not None:  # deterministic: at once
                    reply.fail(denied)
                    self._plan()  # the probes go on
                    return reply
                self.warm.sizer.arrival(trio.current_time())
                if self.tenants and tenant != self.warm_tenant:  # warm for the latest creator
                    self.warm_tenant = tenant  # (the spares of the one before are stopped)
                    for spare in [c for c in self.children.values() if c.tenant != tenant]:
                        if not spare.slots and not spare.stopping:
                            self._stop_child(spare)
                waiters.append(reply)
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
                    if child.conn.process.exited:  # (an exclusive lease stopped it: gone now)
                        self._forget(cid)
                self._serve_waiters()
                self._plan()
            case Drain():
                self._drain("Agent pool is draining")
                self._eof_grace_s = SHUTDOWN_EOF_GRACE_S
                for child in list(self.children.values()):
                    if not child.slots and not child.stopping:
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
                    self._reprime(child)
            case Primed(child_id=cid, primed=primed):
                child = self.children.get(cid)
                if child is None:
                    return None  # (a prime inside a child that is gone went with it)
                child.priming = False
                if primed is None or child.stopping or child.conn.closed:
                    pass  # (a prime inside a child that is going goes with it)
                elif child.primed is None and (
                    child.prime_claim is not None or self.slots.free(child) > 0
                ):
                    child.primed = primed  # (a claim: the create holds a slot already)
                elif self._nursery is not None:  # full meanwhile: not needed
                    self._nursery.start_soon(close_inside, child.conn, primed.setup.session_id)
                child.answer_claim()
            case Spawned(child=child, pss_kib=pss_kib, spawn_s=spawn_s):
                self.spawning -= 1
                self.slots.spawning_for[child.tenant] -= 1
                self.spawned_total += 1
                self.warm.sizer.spawned(spawn_s)
                if pss_kib:
                    self.budget.measured(child.id, pss_kib)
                if self.draining:
                    self._stop_child(child)
                    return None
                self.children[child.id] = child
                self.agent_info = child.conn.info or self.agent_info
                assert self._nursery is not None
                self._nursery.start_soon(self._watch, child)
                self._nursery.start_soon(self._later, STABLE_AFTER_S, Stable(child.id))
                self._serve_waiters()
                self._plan()
            case SpawnFailed(error=error, child_id=failed_id, tenant=tenant):
                self.spawning -= 1
                self.slots.spawning_for[tenant] -= 1
                self.priority.forget(failed_id)
                self.health.failed(error)
                if self.health.failing and isinstance(error, ChannelClosed | OSError):
                    error = AgentStartFailing(error, self.health.failures)  # deterministic
                for waiter in [w for w in waiters if w.tenant == tenant][: self.per_agent]:
                    waiters.remove(waiter)
                    waiter.fail(error)
                self._plan()
            case Exited(child_id=cid, exit_info=info, denied=denied):
                child = self._forget(cid)
                # (A used child's exit is its sessions' business: they restart in place
                # within their own restart window; it may also be a session's release.)
                if child is not None and not child.stopping and not child.used:
                    when = "" if child.stable else f" within {STABLE_AFTER_S:g} s of initialize"
                    self.health.failed(
                        denied
                        or RuntimeError(
                            f"warm agent exited{when} (code {info.exit_code}, signal {info.signal})"
                        )
                    )
                self._plan()
            case Stable(child_id=cid):
                child = self.children.get(cid)
                if child is not None and not child.stopping and not child.conn.closed:
                    child.stable = True
                    self.health.stable()
                    if not child.slots and not self._keeps_empty(child):
                        # A probe (or a spawn whose caller left) that is not needed as warm.
                        self._stop_child(child)
                    self._plan()
            case Refill():
                self._refill_scheduled = False
                self._plan()
            case Resize():
                self._resize_scheduled = False
                self._plan()
            case Lowered(child_id=cid, limits=limits):
                self.priority.lowered(cid, limits)
                if waiters:  # a caller waits for the spawns in flight
                    self.priority.restore(cid)
            case Measured(pss_kib=measured):
                for cid, kib in measured.items():
                    if cid in self.children:
                        self.budget.measured(cid, kib)
                if self.budget.kib:
                    self._plan()
            case RoomResult(released=released):
                self.budget.making_room = False
                if released:
                    self.budget.releases += 1
                    self._serve_waiters()
                    self._plan()
                else:
                    # Nothing could be released: the callers no spawn in flight will serve
                    # get the 503 now (the newest first; the oldest keep their place).
                    capacity = self.spawning * self.per_agent
                    while len(waiters) > capacity:
                        self.budget.refusals += 1
                        waiters.pop().fail(self.budget.error(self.children.values(), self.spawning))
            case Abandon(reply=reply):
                try:
                    waiters.remove(reply)
                except ValueError:
                    if reply.done and self._nursery is not None:
                        self._nursery.start_soon(give_back, reply)
            case ChargeExit(child_id=cid, intensity=intensity, period_s=period_s):
                return self.exit_charges.charge(cid, intensity, period_s)
        return None

    def _reprime(self, child: AgentChild) -> None:
        """Packed: the create that adopted a child's prime makes the pool open the next
        one, while the child has a free slot (primed.py; a create that does not fit stops
        the chain: its prime is closed and none follows)."""
        if not child.reprime or child.priming or self._nursery is None or self.draining:
            return
        child.reprime = False
        if child.primed is not None or child.stopping or self.slots.free(child) <= 0:
            return
        child.priming = True
        self._nursery.start_soon(self._prime_next, child)

    async def _prime_next(self, child: AgentChild) -> None:
        timeout_s = self.settings.initialize_timeout_ms / 1000
        self._tell(Primed(child.id, await prime(child.conn, self.workspace, timeout_s)))

    def _serve_waiters(self) -> None:
        # a session's agent runs at the normal weight
        self.slots.hand_out(self, lambda child: self.priority.restore(child.id))

    def _forget(self, cid: str) -> AgentChild | None:
        """The child ``cid`` has exited: the pool stops counting it (once)."""
        child = self.children.pop(cid, None)
        if child is not None:
            self.exited_total += 1
            child.answer_claim()
        self.priority.forget(cid)
        self.budget.forget(cid)
        return child

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
            self._stop_child(child)
            return
        if self.per_agent == 1:
            # The lease closed it; a used exclusive child never goes back to warm.
            self._stop_child(child)
            return
        if not self._keeps_empty(child):
            self._stop_child(child)

    def _plan(self) -> None:
        """Spawn what waiting callers need, then refill the warm capacity."""
        if self.draining or self._nursery is None:
            return
        if self.slots.waiters:  # callers wait for the spawns in flight: none of them runs lowered
            self.priority.restore_all()
        for tenant in self.slots.tenants_waiting():  # each tenant's callers, their own children
            needed = math.ceil(self.slots.waiting(tenant) / self.per_agent)
            while self.slots.spawning_for[tenant] < needed:
                if not self.fits_new_child():
                    if not self.budget.cost_unknown():  # (unknown: the first measurement)
                        self._make_room()
                    return
                self._spawn(tenant)
        warm = self.warm_tenant
        if self.unbound or (not self.warm.minimum and not self.failing):
            return
        now = trio.current_time()
        backoff_until = self.health.backoff_until
        if now < backoff_until:
            if not self._refill_scheduled:
                self._refill_scheduled = True
                self._nursery.start_soon(self._later, backoff_until - now, Refill())
            return
        if self.failing:
            # Probe: one child at a time, until one becomes stable (or fails again).
            unproven = any(not c.stable and not c.stopping for c in self.children.values())
            if not self.spawning and not unproven and self.fits_new_child():
                self._spawn(warm, refill=True)
            return
        spare = self.slots.rooms_after_waiters(warm)
        floor = self.warm.floor(self.others())
        while spare < floor and self.fits_new_child():
            self._spawn(warm, refill=True)
            spare += 1
        if self.warm.adaptive:
            self._plan_adaptive(now, spare)

    def others(self, besides: AgentChild | None = None) -> int:
        """The warm tenant's children live or being spawned, besides ``besides``."""
        return self.slots.others(self.warm_tenant, besides)

    def _keeps_empty(self, child: AgentChild) -> bool:
        if child.tenant != self.warm_tenant:  # (another tenant's spare: not warm capacity)
            return False
        rooms = self.slots.rooms_besides(child)
        return self.warm.keeps_empty(rooms, self.others(child), trio.current_time())

    def _plan_adaptive(self, now: float, spare: int) -> None:
        """Isolation above the minimum: as many spares as arrivals x spawn time want
        (within --warm-agents-max, the budget and the agents' ceiling); the policy retires
        those beyond it once arrivals paused (adaptive.QUIET_S)."""
        wanted = self.warm.sizer.wanted(now)
        while (
            spare < wanted
            and self.fits_new_child()
            and self.budget.fits_ceiling(self.isolation, self.spawning)
        ):
            self._spawn(self.warm_tenant, refill=True)
            spare += 1
        mine = [c for c in self.children.values() if c.tenant == self.warm_tenant]
        for child in self.warm.retire(now, spare, mine):
            self._stop_child(child)
        if not self.warm.sizer.settled(now) and not self._resize_scheduled and self._nursery:
            self._resize_scheduled = True
            self._nursery.start_soon(self._later, RESIZE_S, Resize())

    def _make_room(self) -> None:
        """Ask the runtime to release the least recently used idle session (a task)."""
        if self.budget.making_room or self._nursery is None:
            return
        self.budget.making_room = True
        self._nursery.start_soon(self._room_task)

    # ---- tasks -------------------------------------------------------------------------

    async def _room_task(self) -> None:
        released = False
        if self.releaser is not None:
            try:
                released = await self.releaser()
            except Exception:
                log.exception("releasing an idle session for the memory budget failed")
        self._tell(RoomResult(released))

    async def _later(self, delay_s: float, msg: PoolMsg) -> None:
        """``msg`` to the pool itself after ``delay_s`` (a re-plan, a child's stability)."""
        await trio.sleep(delay_s)
        self._tell(msg)

    def _spawn(self, tenant: str, *, refill: bool = False) -> None:
        """Spawn a child of ``tenant``; a ``refill`` (ahead of need) at the refill weight."""
        assert self._nursery is not None
        self.spawning += 1
        self.slots.spawning_for[tenant] += 1
        child_id = f"agent-{next(self._ids)}"
        self._nursery.start_soon(self._spawn_child, child_id, tenant, refill)

    async def _spawn_child(self, child_id: str, tenant: str, refill: bool = False) -> None:
        assert self._nursery is not None
        started = trio.current_time()

        def lowered(limits: ChildLimits | None) -> None:
            self._tell(Lowered(child_id, limits))

        # Its file sandbox and its limits (spawn_limited), the tenant's env after a bind.
        outcome = await start_child(
            self._nursery,
            self.settings,
            self.isolation,
            child_id=child_id,
            cwd=self.workspace,
            env={**agent_env(self.settings), **self.extra_env},
            cpu_weight=self.priority.spawn_weight(refill),
            eof_grace_s=lambda: self._eof_grace_s,
            lowered=lowered,
            tenant=tenant,
        )
        if isinstance(outcome, Exception):
            self._tell(SpawnFailed(outcome, child_id, tenant))
            return
        if refill:  # ahead of need: its first session/new too (primed.py)
            init_timeout = self.settings.initialize_timeout_ms / 1000
            outcome.primed = await prime(outcome.conn, self.workspace, init_timeout)
        pss_kib = 0
        if self.budget.kib:  # its cost before the pool counts it (one /proc scan)
            pss_kib = await measure_one(outcome.pid)
        spawn_s = trio.current_time() - started
        self._tell(Spawned(outcome, pss_kib, spawn_s))

    async def _watch(self, child: AgentChild) -> None:
        info = await watch_child(child)
        denied = None
        if not child.used and not child.stable:  # died at start-up: the sandbox? (stat calls)
            found = await trio.to_thread.run_sync(sandbox.denial, child.conn)
            if found is not None:
                denied = AgentSandboxDenied(found.message(), found.path, found.flag)
        self._tell(Exited(child.id, info, denied))

    def _stop_child(self, child: AgentChild) -> None:
        """Mark ``child`` stopping and stop it in a task of the pool."""
        child.stopping = True
        if self._nursery is not None:
            self._nursery.start_soon(stop_child, child.conn, child.limits, self._eof_grace_s)
