"""Where a warm agent is taken: a pool's slots, its waiting callers, and the leases handed out.

Every child of a pool offers ``M`` slots (``--sessions-per-agent``; default 1: one child per
session, full isolation). :class:`Slots` holds the pool's children, the callers waiting for
a slot (a :class:`~actors.Reply` each, oldest first) and hands slots out:
:meth:`Slots.hand_out` gives each waiting caller, in order, a slot on the live child with a
free slot and the most sessions (:meth:`Slots.pick`: pack tightly), as an
:class:`AgentLease`. A warm spare is taken here and nowhere else; what happens when no slot
is free (spawns for the waiting callers, the memory budget) is the pool's
(:mod:`serve.agents.pool`).

Tenants: every child serves one principal, its *tenant*, for its whole life (its HOME, agent
store and sandbox are that principal's, fixed at spawn: ``serve/isolation/tenants.py``). A
waiting caller is a :class:`Waiter` naming its tenant, and gets a slot only on a child of
that tenant; the counts the warm policy reads (rooms, others, spawns in flight) are per
tenant. Without ``--auth-*`` every session is the operator's: one tenant, as before.

A slot is free while the child is not stopping and its sessions, live or dead, number fewer
than ``M``: a session the agent could not close (no ``session/close``) stays inside the
child, so its slot becomes a *dead* slot and is not given back (a child hosts at most ``M``
sessions over its life).

:class:`AgentLease` is the session's side (the :class:`serve.sessions.agent_link.AgentLease`
protocol): the connection, ``bind`` (route the session's updates and agent requests on the
child's :class:`~acp.mux.SessionMux` to its handler) and ``release``. On an exclusive child
(``M = 1``) release stops the child in the caller's task; on a shared child it unbinds the
session from the mux (which kills its terminals) and sends ``session/close`` when the agent
offers it. A lease reports to its pool through the narrow :class:`LeaseOwner` port (the pool
actor's inbox), never touching pool state from the session's task.

Pure bookkeeping but for the lease's release; owned by one pool actor.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Final, Protocol

import trio

from acp.client import AgentConnection
from acp.errors import AcpError, RemoteError
from acp.handler import ClientHandler
from acp.schema import SessionSetup
from actors import Reply
from serve.agents.child import AgentChild
from serve.agents.primed import primable

#: Bound on ``session/close`` when a session leaves a shared child (seconds).
CLOSE_SESSION_TIMEOUT_S: Final = 2.0


class LeaseOwner(Protocol):
    """What a lease tells its pool (each call a message to the pool actor)."""

    def slot_bound(self, child_id: str, lease_id: int, session_id: str) -> None: ...

    async def slot_released(self, child_id: str, lease_id: int, left_behind: bool) -> None:
        """Awaited: when it returns the pool has taken the slot back (and forgotten a child
        that has exited), so what ``/daemon/status`` shows agrees with ``agent_released``."""
        ...

    async def charge_exit(self, child_id: str, intensity: int, period_s: float) -> bool: ...


class AgentLease:
    """A session's slot on a child: the connection to talk to, and how to give it back."""

    def __init__(
        self, owner: LeaseOwner, child: AgentChild, lease_id: int, exclusive: bool
    ) -> None:
        self.owner = owner
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
        return await self.owner.charge_exit(self.child.id, intensity, period_s)

    async def take_primed(
        self, cwd: str, mcp_servers: Sequence[object], additional_directories: Sequence[str]
    ) -> SessionSetup | None:
        """The child's primed session (primed.py), once, if ``session/new`` with these
        parameters would have been the same request; a prime that does not fit is closed.

        Packed: when the child's next prime is still in flight (opened as the previous
        create adopted one, it often answers only after that session's first turn), the
        create waits for it, bounded by the connection's request timeout: its own
        ``session/new`` would queue behind it in the agent and take longer."""
        child = self.child
        if child.primed is None and child.priming and child.prime_claim is None:
            claim = child.prime_claim = trio.Event()
            try:
                with trio.move_on_after(self.conn.request_timeout_s):
                    await claim.wait()
            finally:
                if child.prime_claim is claim:  # not answered (in time): the pool keeps it
                    child.prime_claim = None
        primed, child.primed = child.primed, None
        if primed is None:
            # A packed child spawned for its caller (no spare had a prime: e.g. a principal's
            # first child, tenants.py) starts the chain when this create would have fitted.
            fits = primable(mcp_servers, additional_directories)
            self.child.reprime = not self.exclusive and fits
            return None
        if primed.fits(cwd, mcp_servers, additional_directories):
            self.child.reprime = not self.exclusive  # packed: the pool primes the next one
            return primed.setup
        await close_inside(self.conn, primed.setup.session_id)
        return None

    def bind(self, session_id: str, handler: ClientHandler) -> None:
        """Route ``session_id``'s updates and requests on this connection to ``handler``."""
        self.session_id = session_id
        self._handler = handler
        self.child.mux.bind(session_id, handler)
        self.owner.slot_bound(self.child.id, self.lease_id, session_id)

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
                left_behind = not await close_inside(self.conn, self.session_id)
            await self.owner.slot_released(self.child.id, self.lease_id, left_behind)


async def close_inside(conn: AgentConnection, session_id: str) -> bool:
    """``session/close`` a session on a child that lives on, bounded by
    :data:`CLOSE_SESSION_TIMEOUT_S`; False when the agent cannot close sessions, refused, or
    did not answer in time (the session stays inside the agent)."""
    info = conn.info
    if conn.closed or info is None or not info.supports_close:
        return False
    with trio.move_on_after(CLOSE_SESSION_TIMEOUT_S):
        try:
            await conn.close_session(session_id, timeout_s=CLOSE_SESSION_TIMEOUT_S)
            return True
        except (AcpError, RemoteError):
            pass
    return False


async def give_back(reply: Reply[AgentLease]) -> None:
    """Release the lease a caller that stopped waiting was given after all."""
    try:
        lease = await reply.wait()
    except Exception:
        return
    await lease.release()


class Waiter(Reply[AgentLease]):
    """A caller waiting for a slot on a child of ``tenant``."""

    __slots__ = ("tenant",)

    def __init__(self, tenant: str) -> None:
        super().__init__()
        self.tenant = tenant


class Slots:
    """A pool's children, the callers waiting for a slot, and the handout."""

    def __init__(self, per_agent: int) -> None:
        self.per_agent = max(1, per_agent)
        self.children: dict[str, AgentChild] = {}
        self.waiters: deque[Waiter] = deque()
        #: Spawns in flight per tenant (the pool's ``spawning`` is their sum).
        self.spawning_for: Counter[str] = Counter()
        self._leases = itertools.count(1)

    def waiting(self, tenant: str) -> int:
        return sum(1 for w in self.waiters if w.tenant == tenant)

    def tenants_waiting(self) -> list[str]:
        """The tenants of the waiting callers, oldest caller first."""
        return list(dict.fromkeys(w.tenant for w in self.waiters))

    def others(self, tenant: str, besides: AgentChild | None = None) -> int:
        """``tenant``'s children live or being spawned, besides ``besides`` (warm.py's
        "others")."""
        live = sum(
            1
            for c in self.children.values()
            if c.tenant == tenant and c is not besides and not c.stopping and not c.conn.closed
        )
        return live + self.spawning_for[tenant]

    @property
    def exclusive(self) -> bool:
        """One session per child (``M = 1``)."""
        return self.per_agent == 1

    def free(self, child: AgentChild) -> int:
        """Free slots on ``child`` (none while it stops; dead slots are taken)."""
        return 0 if child.stopping else self.per_agent - len(child.slots) - child.dead

    def warm_count(self) -> int:
        """Children with room for another session (idle ones when ``M = 1``)."""
        return sum(1 for c in self.children.values() if self.free(c) > 0)

    def rooms_besides(self, child: AgentChild) -> int:
        """Children of ``child``'s tenant other than ``child`` with a free slot."""
        return sum(
            1
            for c in self.children.values()
            if c is not child and c.tenant == child.tenant and self.free(c) > 0
        )

    def pick(self, tenant: str) -> AgentChild | None:
        """``tenant``'s live child with a free slot and the most sessions (pack tightly)."""
        best: AgentChild | None = None
        for child in self.children.values():
            if self.free(child) <= 0 or child.conn.closed or child.tenant != tenant:
                continue
            if best is None or len(child.slots) > len(best.slots):
                best = child
        return best

    def hand_out(self, owner: LeaseOwner, taken: Callable[[AgentChild], None]) -> None:
        """Give the waiting callers, oldest first, a slot each while one is free;
        ``taken(child)`` for each slot handed out (a session's agent leaves the refill
        CPU weight)."""
        kept: list[Waiter] = []
        while self.waiters:
            reply = self.waiters.popleft()
            child = self.pick(reply.tenant)
            if child is None:  # (none of its tenant free: it keeps its place)
                kept.append(reply)
                continue
            lease_id = next(self._leases)
            child.slots[lease_id] = ""
            child.used = True
            taken(child)
            reply.set(AgentLease(owner, child, lease_id, exclusive=self.exclusive))
        self.waiters.extend(kept)

    def rooms_after_waiters(self, tenant: str) -> int:
        """``tenant``'s children, live or being spawned, that will still have a free slot
        once its waiting callers are served (the most loaded first, as :meth:`pick` does; a
        child being spawned offers ``M`` slots): the warm capacity counted ahead."""
        free = sorted(
            self.free(c)
            for c in self.children.values()
            if c.tenant == tenant and self.free(c) > 0 and not c.conn.closed
        )
        free += [self.per_agent] * self.spawning_for[tenant]
        waiting = self.waiting(tenant)
        rooms = 0
        for slots in free:
            taken = min(slots, waiting)
            waiting -= taken
            rooms += slots > taken
        return rooms
