"""Workspace runtimes: one agent pool and one session registry per workspace, behind one facade.

Above both ``serve.sessions`` and ``serve.agents`` (it composes them; the pool implements
the sessions' ``AgentSource`` port), below the Host, which builds it.

Every workspace given with ``--workspace`` (the first is the primary) or
``--untrusted-workspace`` gets its own :class:`SessionRegistry` actor, with its own session
supervisor, running as its own child of the root supervisor (``sessions:<workspace id>``,
permanent). A registry that crashes, or a workspace whose agents crash-loop, is that
workspace's trouble only: the other registries keep serving.

:class:`WorkspaceRuntimes` is what the rest of the daemon calls ``daemon.registry``: it
routes creations to the right workspace (by the message's ``workspace``), finds a session
by id across all of them, and enforces the daemon-wide ``--max-total-sessions`` across
registries (each registry enforces ``--max-sessions`` for its own workspace).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import trio

from actors import ActorError, ChildSpec, Restart, SupervisorEvent
from serve.access.owner_records import OwnerRecords
from serve.access.roles import SessionAccess
from serve.agents.pool import AgentPool, Drain
from serve.sessions.messages import ReleaseAgent
from serve.sessions.registry import RegistryMsg, SessionRegistry, Ticket

if TYPE_CHECKING:
    from serve.config import RestartIntensity
    from serve.events.log import Tap
    from serve.isolation import Isolation
    from serve.journal import JournalBackend
    from serve.mcp.pool import McpPool
    from serve.permissions.effects import EffectGate
    from serve.permissions.mediator import PermissionMediator
    from serve.sessions.actor import SessionActor
    from serve.sessions.agent_link import AgentSource
    from serve.settings import Settings


def workspace_id(path: str) -> str:
    """A stable id per canonical workspace path."""
    return "ws_" + hashlib.sha256(os.fsencode(path)).hexdigest()[:16]


class IdleRelease(NamedTuple):
    """What a pool may ask of its workspace's sessions for the memory budget."""

    #: Release the least recently used idle session; True when one let its agent go.
    release: Callable[[], Awaitable[bool]]
    #: Whether any session could let its agent go now.
    available: Callable[[], bool]


class WorkspaceRuntime:
    """One workspace: its canonical path, id, trust, agent pool and session registry."""

    def __init__(
        self,
        path: str,
        *,
        primary: bool,
        trusted: bool,
        agents: Callable[[IdleRelease], AgentPool],
        registry: Callable[[AgentSource], SessionRegistry],
    ) -> None:
        """``agents`` builds the pool given how it may release idle sessions, ``registry``
        the session registry given where its sessions get their agents (that pool): every
        part gets its collaborators as constructor arguments; the pool reaches the
        registry's sessions through this runtime's methods."""
        self.path = path
        self.id = workspace_id(path)
        self.primary = primary
        self.trusted = trusted
        self.agents = agents(IdleRelease(self.release_lru_idle, self.has_releasable))
        self.registry = registry(self.agents)

    def has_releasable(self) -> bool:
        return bool(self._releasable())

    def _releasable(self) -> list[SessionActor]:
        """Live sessions that could let their agent go now, least recently used first."""
        candidates = [s for s in self.registry.live() if s.releasable]
        candidates.sort(key=lambda s: s.last_agent_use)
        return candidates

    async def release_lru_idle(self) -> bool:
        """For the pool's memory budget: release the least recently used idle session."""
        for session in self._releasable():
            try:
                if await session.call(ReleaseAgent("memory_budget"), timeout_s=10):
                    return True
            except Exception:  # closing meanwhile, or busy: the next one
                continue
        return False

    def descriptor(self) -> dict[str, Any]:
        return {"id": self.id, "cwd": self.path, "primary": self.primary, "trusted": self.trusted}


class WorkspaceRuntimes:
    """The workspace set: one :class:`WorkspaceRuntime` (and session registry) per workspace.

    The shared parts every registry hands to its sessions (the effect gate, the journal, the
    MCP pool, the retire hook) are constructor arguments, given once by the Host builder.
    """

    def __init__(
        self,
        settings: Settings,
        mediator: PermissionMediator,
        restart: RestartIntensity | None = None,
        *,
        effects: EffectGate | None = None,
        journal: JournalBackend | None = None,
        mcp_pool: McpPool | None = None,
        retire_hook: Callable[[SessionActor], None] | None = None,
        isolation: Isolation | None = None,
        event_tap: Tap | None = None,
    ) -> None:
        self.settings = settings
        self.isolation = isolation
        self.event_tap = event_tap
        self.effects = effects
        self.journal = journal
        self.mcp_pool = mcp_pool
        #: Who owns the sessions that left their registries (serve/access/owner_records.py).
        self.owners = OwnerRecords()
        self.runtimes: dict[str, WorkspaceRuntime] = {}
        paths = [(p, True) for p in settings.workspaces] + [
            (p, False) for p in settings.untrusted_workspaces
        ]
        for index, (path, trusted) in enumerate(paths):
            self.runtimes[path] = self._runtime(
                path, index == 0, trusted, mediator, restart, retire_hook
            )

    def _runtime(
        self,
        path: str,
        primary: bool,
        trusted: bool,
        mediator: PermissionMediator,
        restart: RestartIntensity | None,
        retire_hook: Callable[[SessionActor], None] | None,
    ) -> WorkspaceRuntime:
        def agents(idle: IdleRelease) -> AgentPool:
            return AgentPool(
                self.settings,
                path,
                name=f"agents:{workspace_id(path)}",
                isolation=self.isolation,
                releaser=idle.release,
                has_releasable=idle.available,
            )

        def registry(source: AgentSource) -> SessionRegistry:
            return SessionRegistry(
                self.settings,
                mediator,
                name=f"sessions:{workspace_id(path)}",
                restart=restart,
                effects=self.effects,
                journal=self.journal,
                mcp_pool=self.mcp_pool,
                retire_hook=retire_hook,
                total_count=self.total_count,
                owned_count=self.owned,
                agent_source=source,
                isolation=self.isolation,
                owners=self.owners,
                event_tap=self.event_tap,
            )

        return WorkspaceRuntime(
            path, primary=primary, trusted=trusted, agents=agents, registry=registry
        )

    # ---- structure ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[WorkspaceRuntime]:
        return iter(self.runtimes.values())

    def __len__(self) -> int:
        return len(self.runtimes)

    @property
    def primary(self) -> WorkspaceRuntime:
        return next(iter(self.runtimes.values()))

    def child_specs(self) -> list[ChildSpec]:
        """Per workspace its agent pool, then its registry (stopped in reverse order)."""
        specs: list[ChildSpec] = []
        for rt in self:
            specs.append(
                ChildSpec(
                    f"agents:{rt.id}",
                    rt.agents.run,
                    Restart.PERMANENT,
                    shutdown_grace_s=5.0,
                    stop=rt.agents.close,
                )
            )
            specs.append(
                ChildSpec(
                    f"sessions:{rt.id}",
                    rt.registry.run,
                    Restart.PERMANENT,
                    shutdown_grace_s=5.0,
                    stop=rt.registry.close,
                )
            )
        return specs

    def agents_failing(self) -> list[WorkspaceRuntime]:
        """Workspaces whose agent command keeps failing (for /readyz and /daemon/status)."""
        return [rt for rt in self if rt.agents.failing]

    def by_ref(self, ref: str) -> WorkspaceRuntime | None:
        """A workspace by id or by (canonical) absolute path."""
        for rt in self:
            if ref == rt.id:
                return rt
        candidate = ref if ref.startswith("/") else "/" + ref
        try:
            candidate = os.path.realpath(candidate)
        except (OSError, ValueError):
            return None
        return self.runtimes.get(candidate)

    def registry_for(self, workspace: str) -> SessionRegistry:
        return self.runtimes[workspace].registry

    # ---- where sessions get their agents ----------------------------------------------

    @property
    def agent_source(self) -> AgentSource | None:
        """Where sessions get their agents (each workspace's pool; None: each spawns its own)."""
        return self.primary.registry.agent_source

    # ---- the registry facade -----------------------------------------------------------

    async def ask(self, msg: RegistryMsg, *, timeout_s: float = 30.0) -> Ticket:
        return await self.registry_for(msg.workspace).ask(msg, timeout_s=timeout_s)

    def get(self, session_id: str) -> SessionActor | None:
        for rt in self:
            session = rt.registry.get(session_id)
            if session is not None:
                return session
        return None

    def live(self, workspace: str | None = None) -> list[SessionActor]:
        if workspace is not None:
            rt = self.runtimes.get(workspace)
            return rt.registry.live() if rt is not None else []
        return [s for rt in self for s in rt.registry.live()]

    def all_sessions(self) -> list[SessionActor]:
        """Every session still registered, closing ones included (for counters)."""
        return [s for rt in self for s in rt.registry.sessions.values()]

    def access_of(self, session_id: str) -> SessionAccess | None:
        """The access record of ``session_id``: its actor's while it is registered (a
        closing one included), else the one kept when it left; None: none on record here."""
        for rt in self:
            session = rt.registry.sessions.get(session_id)
            if session is not None:
                return session.access
        return self.owners.get(session_id)

    def known_client_ids(
        self, workspace: str | None = None, principal: str | None = None
    ) -> set[str]:
        """The client ids registered on the live sessions (of ``workspace``; by
        ``principal`` when given: another principal's id is not this one's to present)."""
        out: set[str] = set()
        for session in self.live(workspace):
            out.update(session.clients if principal is None else session.clients.of(principal))
        return out

    def total_count(self) -> int:
        return sum(rt.registry.local_count() for rt in self)

    def owned(self, owner: str) -> int:
        """Sessions of ``owner`` daemon-wide, in flight included (its quota)."""
        return sum(rt.registry.owned(owner) for rt in self)

    @property
    def supervisor_events(self) -> list[SupervisorEvent]:
        return [e for rt in self for e in rt.registry.supervisor.events]

    def drain_agents(self) -> None:
        """Daemon shutdown: every pool stops its spare children now (``Drain``), while the
        sessions close, instead of after them."""
        for rt in self:
            try:
                rt.agents.tell_nowait(Drain())
            except ActorError:  # stopped, or its inbox is full: its on_stop stops them
                pass

    async def close_all(self, reason: str = "daemon_shutdown") -> None:
        async with trio.open_nursery() as nursery:
            for rt in self:
                nursery.start_soon(rt.registry.close_all, reason)
