"""Build the Host: every part of one daemon, once, and the root supervisor's children.

:func:`build_host` is the one place that knows how the parts connect. Each part gets what
it needs as constructor arguments (no attribute is injected afterwards); parts that need to
list live sessions get a function over the workspace runtimes, which are built after the
parts the sessions use (the effect gate, the journal, the MCP pool).

The children, in start order (the root supervisor stops them in reverse)::

    reaper                  (a subreaper or PID 1 only) adopted orphans
    permission-mediator     pending permission requests
    webhooks                signed webhooks (serve/webhooks): the log tap, the outbox, the
                            deliveries (before the registries, stopped after them)
    sessions:<ws id> × W    one session registry per workspace runtime
    workspace-hub           workspace-wide events to every session, by message (core:
                            routes await it)
    services                the optional services' own Supervisor (its own restart
                            budget, SERVICES_INTENSITY in SERVICES_PERIOD_S; restarted by
                            the root with backoff), so a flapping one never exhausts the
                            root's budget that the registries and the HTTP front share:
        chaos               (--chaos-kill-rate only)
        journal-janitor     (journal on) retention and total-size bound of journals;
                            PostgreSQL's (--journal-url) also renews the session leases
        device-flow-poller  RFC 8628 flows
        mcp-pool            shared MCP servers
        workspace-state     settings baselines for /workspace/reload
    acp-front               the /acp front (serve/acpfront): its connections, pumps and
                            requests run in this child's nursery; the /acp routes only
                            hand it connections and messages (QWEN_SERVE_ACP_HTTP=0: absent)

When the root gives up (its budget is exhausted), its ``on_give_up`` hook ends every
session with ``session_died {reason: "daemon_failure"}`` while the HTTP front is still up
(so every SSE stream gets that terminal event), then it stops its children and
``serve.__main__`` exits 70 with one line.

The HTTP front is not among them: :class:`serve.runtime.daemon.Daemon` adds it last (it
serves the Host) so that it starts last and stops first; ``acp-front`` is stopped right
after it (cancelled: its connections are released without closing their sessions, which
the drain has ended by then), and its ``end_streams`` is a ``stream_closers`` entry.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence

import msgspec
import trio

from acp.children import run_reaper
from actors import Actor, ChildSpec, Restart, Supervisor, SupervisorGaveUp
from serve.access.audit import AuditLog
from serve.access.quotas import Quotas
from serve.access.tokens_file import TokensFile
from serve.config import ConfigCell, DaemonConfig, load_daemon_config
from serve.deviceflow import service as device_flow_service
from serve.host import FrontStats, Host, Lifecycle
from serve.http.app import collect_features
from serve.http.routes import acp as acp_route
from serve.isolation import Isolation, IsolationError
from serve.journal import Journal, JournalBackend, JournalLimits
from serve.mcp import service as mcp_service
from serve.permissions.effects import EffectGate
from serve.permissions.mediator import PermissionMediator
from serve.ratelimit import limiter_for
from serve.sessions.actor import SessionActor
from serve.sessions.chaos import ChaosMonkey
from serve.settings import Settings, SettingsError
from serve.tenant_claim import Binding
from serve.webhooks import SessionFacts, WebhookService
from serve.webhooks.signing import key_of
from serve.webhooks.targets import AllowList, target_of
from serve.workspaces.files.set import WorkspaceSet
from serve.workspaces.hub import HUB_SERVICE, WorkspaceHub
from serve.workspaces.runtimes import WorkspaceRuntimes
from serve.workspaces.state import reload as workspace_state

__all__ = ["SERVICES_INTENSITY", "SERVICES_PERIOD_S", "build_host"]

log = logging.getLogger(__name__)

#: Restart budget of the optional services' supervisor (restarts within seconds).
SERVICES_INTENSITY = 5
SERVICES_PERIOD_S = 30.0
#: The root's backoff between restarts of a services supervisor that gave up (seconds).
SERVICES_BACKOFF_S = 1.0
SERVICES_MAX_BACKOFF_S = 30.0
#: How long the root waits for the services supervisor to stop its children (seconds).
SERVICES_STOP_GRACE_S = 5.0


def build_host(
    settings: Settings,
    config: DaemonConfig | None = None,
    *,
    reaper: bool = False,
    extra_services: Sequence[ChildSpec] = (),
) -> tuple[Host, list[ChildSpec]]:
    """The Host for ``settings`` and ``config`` (read from ``--config`` when None; raises
    ``SettingsError`` naming a bad key), and the root supervisor's children in start order.

    ``reaper``: also run the reaper of adopted orphans (only when the process is a child
    subreaper or PID 1; a test process's own children are not the daemon's to wait for).
    ``extra_services``: more children of the services supervisor, started after the others
    (fault-injection tests).
    """
    if config is None:
        config = load_daemon_config(settings)
    cell = ConfigCell(config)
    root_policy = config.restart.root

    async def on_root_give_up(exc: SupervisorGaveUp) -> None:
        # Awaited by the root (bounded by its give_up_grace_s) before it stops its children.
        log.error("%s: ending every session, then exiting", exc)
        lifecycle.draining = True
        await runtimes.close_all("daemon_failure")

    root = Supervisor(
        "root",
        intensity=root_policy.intensity,
        period_s=root_policy.period_s,
        history=512,
        on_give_up=on_root_give_up,
    )
    #: The optional services' own supervisor (its events are recorded in the root's history).
    services = Supervisor(
        "services",
        intensity=SERVICES_INTENSITY,
        period_s=SERVICES_PERIOD_S,
        listener=root.events.append,
    )
    mediator = PermissionMediator(
        policy=config.policy.permission_strategy,
        consensus_quorum=config.policy.consensus_quorum,
        response_timeout_ms=settings.permission_response_timeout_ms,
    )

    #: The daemon's URL once it listens (the lifecycle is made below; read when called).
    def own_url() -> str:
        if settings.advertise_url is not None:
            return settings.advertise_url
        return lifecycle.urls[0] if lifecycle.urls else ""

    journal = _journal(settings, own_url) if settings.journal else None
    front = FrontStats(rate_limiter=limiter_for(settings.rate_limit))

    # The workspace runtimes are built below; these read them when called.
    def live_sessions() -> list[SessionActor]:
        return runtimes.live()

    def sessions_for(workspace: str | None) -> list[SessionActor]:
        return runtimes.live(workspace)

    limits = settings.auth
    quotas = (
        Quotas(
            limits.quota_sessions,
            limits.quota_prompts_per_minute,
            limits.quota_token_budget,
            limits.quota_cost_budget,
        )
        if limits.configured
        else None
    )

    def retire(session: SessionActor) -> None:
        front.retire(session.log.statistics())
        if quotas is not None:  # a principal's budget counts its ended sessions too
            # (since it was restored: its earlier spending was charged where it was spent)
            quotas.retired(
                session.access.owner, session.budget.tokens_here, session.budget.cost_here
            )

    #: One Workspace per root for every part (one per-path writer lock table).
    workspaces = WorkspaceSet()
    effects = EffectGate(
        cell,
        settings=settings,
        mediator=mediator,
        live_sessions=live_sessions,
        workspaces=workspaces,
    )
    hub = WorkspaceHub(sessions_for)
    hub_spec = ChildSpec(
        HUB_SERVICE, hub.run, Restart.PERMANENT, shutdown_grace_s=2.0, stop=hub.close
    )
    mcp_pool, mcp_spec = mcp_service.build(settings, sessions_for)
    webhooks = _webhooks(settings, config, lambda sid: runtimes.get(sid), lambda: lifecycle.port)
    try:
        isolation = Isolation(settings)
    except IsolationError as exc:
        raise SettingsError(str(exc)) from None
    runtimes = WorkspaceRuntimes(
        settings,
        mediator,
        config.restart.session,
        effects=effects,
        journal=journal,
        mcp_pool=mcp_pool,
        retire_hook=retire,
        isolation=isolation,
        event_tap=webhooks.tap,
    )
    device_flow, device_flow_spec = device_flow_service.build(settings, config, hub)
    state, state_spec = workspace_state.build(settings.workspaces, workspaces)
    chaos = (
        ChaosMonkey(live_sessions, settings.chaos_kill_rate)
        if settings.chaos_kill_rate > 0
        else None
    )
    children: list[ChildSpec] = []
    if reaper:
        children.append(ChildSpec("reaper", run_reaper, Restart.PERMANENT, shutdown_grace_s=0.0))
    children.append(
        ChildSpec(
            "permission-mediator",
            mediator.run,
            Restart.PERMANENT,
            shutdown_grace_s=1.0,
            stop=mediator.close,
        )
    )
    # Before the agent pools (their warm children need the agents' cgroup), stopped after
    # them (it removes every cgroup it made).
    children.append(
        ChildSpec(
            "isolation",
            isolation.run,
            Restart.PERMANENT,
            shutdown_grace_s=5.0,
            stop=isolation.close,
        )
    )
    # Before the registries, so it stops after them: their sessions' last events are kept.
    children.append(
        ChildSpec(
            "webhooks", webhooks.run, Restart.PERMANENT, shutdown_grace_s=5.0, stop=webhooks.close
        )
    )
    children.extend(runtimes.child_specs())
    children.append(hub_spec)
    optional: list[ChildSpec] = []
    if chaos is not None:
        optional.append(ChildSpec("chaos", chaos.run, Restart.PERMANENT, stop=chaos.close))
    if journal is not None:
        optional.append(
            ChildSpec(
                "journal-janitor",
                journal.run_janitor,
                Restart.PERMANENT,
                shutdown_grace_s=0,  # nothing to finish: cancelled at once
            )
        )
    auth = settings.auth
    audit = AuditLog(auth.audit_log, auth.audit_max_bytes) if auth.audit_log else None
    if audit is not None:
        optional.append(
            _rerunnable(
                ChildSpec("audit-log", audit.run, Restart.PERMANENT, stop=audit.close), audit
            )
        )
    optional.extend(
        [
            _rerunnable(device_flow_spec, device_flow),
            _rerunnable(mcp_spec, mcp_pool),
            state_spec,
            *extra_services,
        ]
    )
    children.append(
        ChildSpec(
            "services",
            functools.partial(services.run, optional),
            Restart.PERMANENT,
            shutdown_grace_s=SERVICES_STOP_GRACE_S,
            stop=services.shutdown,
            backoff_s=SERVICES_BACKOFF_S,
            max_backoff_s=SERVICES_MAX_BACKOFF_S,
        )
    )
    lifecycle = Lifecycle(root=root, port=settings.port, services=services)
    host = Host(
        settings=settings,
        config_cell=cell,
        registry=runtimes,
        mediator=mediator,
        effects=effects,
        journal=journal,
        workspace_state=state,
        hub=hub,
        mcp_pool=mcp_pool,
        device_flow=device_flow,
        chaos=chaos,
        lifecycle=lifecycle,
        front=front,
        binding=Binding(settings.token, bootstrap=settings.bootstrap),
        isolation=isolation,
        workspaces=workspaces,
        audit=audit,
        quotas=quotas,
        tokens_file=TokensFile(auth.tokens_file) if auth.tokens_file else None,
        webhooks=webhooks,
    )
    # The /acp front is built over the Host (it reads the parts through it), so it is
    # the one part set here, before the Host is handed out.
    acp_front = acp_route.build_front(host, collect_features())
    if acp_front is not None:
        host.acp_front = acp_front
        lifecycle.stream_closers.append(acp_front.end_streams)
        children.append(
            ChildSpec(
                "acp-front",
                acp_front.run,
                Restart.PERMANENT,
                shutdown_grace_s=0.0,  # cancelled: run() releases its connections, bounded
            )
        )
    return host, children


def _journal(settings: Settings, own_url: Callable[[], str]) -> JournalBackend:
    """The files journal under ``--state-dir``, or PostgreSQL's with ``--journal-url``."""
    limits = JournalLimits(
        retention_ms=settings.journal_retention_ms,
        max_total_bytes=settings.journal_max_total_bytes,
    )
    if settings.journal_url is None:
        return Journal(settings.state_dir, limits)
    # lazy: psycopg is loaded only by a daemon that uses the PostgreSQL journal
    from serve.journal.pg import PgJournal

    return PgJournal(
        settings.journal_url,
        limits,
        state_dir=settings.state_dir,
        address=own_url,
        lease_ttl_ms=settings.journal_lease_ms,
        renew_interval_ms=settings.journal_lease_ms // 4,
    )


def _webhooks(
    settings: Settings,
    config: DaemonConfig,
    session: Callable[[str], SessionActor | None],
    port: Callable[[], int],
) -> WebhookService:
    """The webhooks service; a bad ``webhooks:`` entry is a :class:`SettingsError`."""
    section = config.webhooks
    where = f"config {settings.config_file} at webhooks"
    try:
        allow = AllowList((*settings.webhook_allow, *section.allow), settings.hostname, port)
    except ValueError as exc:
        raise SettingsError(f"{where}.allow: {exc}") from None
    for index, item in enumerate(section.subscriptions):
        try:
            key_of(item.secret)
            target_of(item.url)
        except ValueError as exc:
            raise SettingsError(f"{where}.subscriptions[{index}]: {exc}") from None

    def facts(session_id: str) -> SessionFacts | None:
        found = session(session_id)
        if found is None:
            return None
        return SessionFacts(found.access.owner, found.budget.snapshot().get("usage"))

    return WebhookService(section, state_dir=settings.state_dir, allow=allow, facts=facts)


def _rerunnable[M](spec: ChildSpec, actor: Actor[M]) -> ChildSpec:
    """``spec`` for a service actor under the services supervisor. When that supervisor
    gives up it stops its children (``stop`` closes an actor for good); when the root then
    restarts it, the same actor (the Host and the routes hold it) runs again with a fresh
    inbox instead of ending at once."""
    target = spec.target

    async def run(*, task_status: trio.TaskStatus[object] = trio.TASK_STATUS_IGNORED) -> None:
        actor.reopen()
        await target(task_status=task_status)

    return msgspec.structs.replace(spec, target=run)
