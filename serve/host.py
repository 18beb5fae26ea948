"""The Host: every long-lived part of one daemon, typed, built once.

:func:`serve.runtime.build.build_host` builds it (and the ordered list of the root
supervisor's children that run its actors); :class:`serve.runtime.daemon.Daemon` runs it;
the HTTP layer reads it (``serve.http.context.daemon()`` returns it). Nothing sets an
attribute of the Host after it is built except through the parts it names here: the
config cell (``POST /workspace/reload`` swaps it), the lifecycle state (the daemon's run
and drain), and the front's statistics (the HTTP front's own counters).

Dependency position: it imports the domain packages (their types) and the front's rate
limiter type; the HTTP layer and the runtime import it; domain packages never do.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from actors import Supervisor, SupervisorEvent
from serve.workspaces.files.set import WorkspaceSet

if TYPE_CHECKING:
    from serve.access.audit import AuditLog
    from serve.access.quotas import Quotas
    from serve.access.tokens_file import TokensFile
    from serve.config import ConfigCell, DaemonConfig
    from serve.deviceflow.poller import DeviceFlowPoller
    from serve.isolation import Isolation
    from serve.journal import JournalBackend
    from serve.mcp.pool import McpPool
    from serve.permissions.effects import EffectGate
    from serve.permissions.mediator import PermissionMediator
    from serve.ratelimit import RateLimiter
    from serve.sessions.chaos import ChaosMonkey
    from serve.settings import Settings
    from serve.tenant_claim import Binding
    from serve.webhooks import WebhookService
    from serve.workspaces.hub import WorkspaceHub
    from serve.workspaces.runtimes import WorkspaceRuntimes
    from serve.workspaces.state.reload import WorkspaceState


class AcpFrontView(Protocol):
    """What the daemon's read models read of the /acp front (``serve.acpfront.AcpFront``,
    which imports this module, so it is named here only by what it offers)."""

    #: Streams the front evicted: an unread session stream past its outbox, or a
    #: WebSocket connection (``acp_serve_sse_evictions``).
    evictions: int


@dataclass(eq=False)
class Lifecycle:
    """Where the daemon is in its life: the port it bound, draining, the root supervisor
    and the optional services' supervisor (a child of the root)."""

    root: Supervisor
    port: int
    services: Supervisor
    started_monotonic: float = field(default_factory=time.monotonic)
    urls: list[str] = field(default_factory=list)
    draining: bool = False
    #: What ends a front's event streams on shutdown, after the sessions have ended and
    #: before the listener stops (the /acp front registers its own; REST streams end with
    #: their session's log). Each is awaited with the time left for it in seconds.
    stream_closers: list[Callable[[float], Awaitable[None]]] = field(default_factory=list)


@dataclass(eq=False)
class FrontStats:
    """The HTTP front's own statistics (the front updates them; read models read them)."""

    rate_limiter: RateLimiter | None = None
    #: Open SSE event streams.
    sse_streams: int = 0
    #: ASGI calls of the app in flight (HTTP requests until their last body message,
    #: WebSockets until their handler returns; serve/http/keepalive.py counts them).
    open_requests: int = 0
    #: Shell commands running per session id (``POST /session/:id/shell``): at most
    #: ``MAX_SHELLS_PER_SESSION`` each, an entry only while one runs.
    shells: dict[str, int] = field(default_factory=dict)
    #: Event-log totals of sessions that are gone, so counters never go backwards.
    retired: dict[str, int] = field(
        default_factory=lambda: {"published": 0, "evictions": 0, "warnings": 0}
    )

    def retire(self, log_stats: dict[str, Any]) -> None:
        for key, stat in (
            ("published", "published"),
            ("evictions", "evictions"),
            ("warnings", "slowClientWarnings"),
        ):
            self.retired[key] += int(log_stats.get(stat, 0))


@dataclass(eq=False)
class Host:
    """One daemon's parts (see the module docstring)."""

    settings: Settings
    config_cell: ConfigCell
    #: The workspace runtimes: one session registry per served workspace.
    registry: WorkspaceRuntimes
    mediator: PermissionMediator
    effects: EffectGate
    journal: JournalBackend | None
    workspace_state: WorkspaceState
    #: Workspace-wide events fanned out to every session of a workspace, by message.
    hub: WorkspaceHub
    mcp_pool: McpPool
    device_flow: DeviceFlowPoller
    chaos: ChaosMonkey | None
    lifecycle: Lifecycle
    front: FrontStats
    #: The accepted token's digest and the late-binding state (``serve.tenant_claim``);
    #: ``POST /daemon/bind`` completes it. ``None`` only in hand-built test hosts.
    binding: Binding | None = None
    #: Per-agent-child limits and the agents' ceiling (serve/isolation).
    isolation: Isolation | None = None
    #: One ``Workspace`` per root for the file routes, ``/acp`` ``_qwen/file/*``, the
    #: effect gate and the workspace-state service (their per-path writer locks).
    workspaces: WorkspaceSet = field(default_factory=WorkspaceSet)
    #: The /acp front (a ``serve.acpfront.AcpFront``, seen here as :class:`AcpFrontView`: that
    #: package imports this one), built over this Host by ``build_host`` and supervised as
    #: ``acp-front``; None when ``/acp`` is off.
    acp_front: AcpFrontView | None = None
    #: Multi-user auth (``--auth-*``, docs/multi-user.md): the audit log actor (also with
    #: ``--audit-log`` alone) and the per-principal quotas; None without them.
    audit: AuditLog | None = None
    quotas: Quotas | None = None
    #: ``--auth-tokens-file``'s table and state (the security front looks tokens up in it;
    #: ``/readyz`` and ``/daemon/status`` report it); None without the flag.
    tokens_file: TokensFile | None = None
    #: Signed webhooks (serve/webhooks, docs/webhooks.md).
    webhooks: WebhookService | None = None

    @property
    def multi_user(self) -> bool:
        """Multi-user auth is configured (principals other than the operator exist)."""
        return self.settings.auth.configured

    # ---- views -------------------------------------------------------------------------

    @property
    def config(self) -> DaemonConfig:
        return self.config_cell.current

    @property
    def permission_policy(self) -> str:
        return self.config.policy.permission_strategy

    @property
    def draining(self) -> bool:
        return self.lifecycle.draining

    @property
    def port(self) -> int:
        return self.lifecycle.port

    @property
    def started_monotonic(self) -> float:
        return self.lifecycle.started_monotonic

    @property
    def root(self) -> Supervisor:
        return self.lifecycle.root

    # ---- read models -------------------------------------------------------------------

    def workspace_descriptors(self) -> list[dict[str, Any]]:
        return [rt.descriptor() for rt in self.registry]

    def supervisor_events(self) -> list[SupervisorEvent]:
        return list(self.root.events)

    def rate_limit_hits(self) -> dict[str, int] | None:
        limiter = self.front.rate_limiter
        return limiter.hits() if limiter is not None else None

    def deep_health(self) -> dict[str, Any]:
        live = self.registry.live()
        return {
            "status": "ok",
            "workspaceCount": len(self.settings.workspaces)
            + len(self.settings.untrusted_workspaces),
            "sessions": len(live),
            "pendingPermissions": self.mediator.pending_count(),
            "activePrompts": sum(1 for s in live if s.has_active_prompt),
            "connectedClients": self.front.sse_streams,
            **({"rateLimitHits": hits} if (hits := self.rate_limit_hits()) else {}),
        }

    def agents_failing(self) -> list[str]:
        """The workspaces whose agent pool is failing (for the ``/readyz`` body)."""
        return [rt.path for rt in self.registry.agents_failing()]

    def sandbox_denials(self) -> list[dict[str, Any]]:
        """The workspaces whose agent the file sandbox refused a path at start-up: the
        path, the flag that grants it and the message (``/readyz``, ``/daemon/status``)."""
        out = []
        for rt in self.registry.agents_failing():
            denied = rt.agents.health.denied
            if denied is not None:
                out.append(
                    {
                        "workspaceCwd": rt.path,
                        "path": denied.path,
                        "grantFlag": denied.flag,
                        "error": denied.message,
                    }
                )
        return out

    def readiness(self) -> tuple[bool, str]:
        """For ``/readyz``: (ready, reason).

        A tokens file that is missing, unreadable or malformed accepts no token (fail
        closed): ``auth_tokens_file_unusable``, its users cannot be served here.

        Agent readiness is scoped to the primary workspace: its pool failing makes the
        daemon unready (``agent_unavailable``: a Service should route no new session here).
        A secondary workspace's failing pool does not: it is that workspace's trouble, the
        daemon still serves the others; ``/readyz`` lists it (``agentsFailing``) and
        ``/daemon/status`` reports it as an ``agent_command_failing`` issue."""
        if self.draining:
            return False, "draining"
        states = {c["name"]: c["state"] for c in self.root.children()}
        if not self.root.running or any(state != "running" for state in states.values()):
            return False, "supervisor_not_running"
        if self.tokens_file is not None and not self.tokens_file.usable:
            return False, "auth_tokens_file_unusable"
        if self.registry.primary.agents.failing:
            if self.registry.primary.agents.health.denied is not None:
                return False, "agent_sandbox_denied"  # deterministic: see sandbox_denials
            return False, "agent_unavailable"
        limit = self.settings.max_sessions
        if limit and len(self.registry.live()) >= limit * len(self.settings.workspaces):
            return False, "session_capacity_exhausted"
        total = self.settings.max_total_sessions
        if total and len(self.registry.live()) >= total:
            return False, "session_capacity_exhausted"
        return True, "ready"
