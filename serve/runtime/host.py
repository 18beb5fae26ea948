"""Build the Host: every part of one daemon, once, and the root supervisor's children.

:func:`build_host` is the one place that knows how the parts connect. Each part gets what
it needs as constructor arguments (no attribute is injected afterwards); parts that need to
list live sessions get a function over the workspace runtimes, which are built after the
parts the sessions use (the effect gate, the journal, the MCP pool).

The children, in start order (the root supervisor stops them in reverse)::

    reaper                  (a subreaper or PID 1 only) adopted orphans
    permission-mediator     pending permission requests
    sessions:<ws id> × W    one session registry per workspace runtime
    chaos                   (--chaos-kill-rate only)
    workspace-hub           workspace-wide events to every session, by message
    device-flow-poller      RFC 8628 flows
    mcp-pool                shared MCP servers
    workspace-state         settings baselines for /workspace/reload

The HTTP front is not among them: :class:`serve.runtime.daemon.Daemon` adds it last (it
serves the Host) so that it starts last and stops first.
"""

from __future__ import annotations

from acp.children import run_reaper
from actors import ChildSpec, Restart, Supervisor
from serve.config import ConfigCell, DaemonConfig, load_daemon_config
from serve.deviceflow import service as device_flow_service
from serve.host import FrontStats, Host, Lifecycle
from serve.http.security.ratelimit import limiter_for
from serve.journal import Journal
from serve.mcp import service as mcp_service
from serve.permissions.effects import EffectGate
from serve.permissions.mediator import PermissionMediator
from serve.sessions.actor import SessionActor
from serve.sessions.chaos import ChaosMonkey
from serve.sessions.runtimes import WorkspaceRuntimes
from serve.settings import Settings
from serve.status.shared import HUB_SERVICE
from serve.workspace.hub import WorkspaceHub
from serve.workspace_state import reload as workspace_state

__all__ = ["build_host"]


def build_host(
    settings: Settings, config: DaemonConfig | None = None, *, reaper: bool = False
) -> tuple[Host, list[ChildSpec]]:
    """The Host for ``settings`` and ``config`` (read from ``--config`` when None; raises
    ``SettingsError`` naming a bad key), and the root supervisor's children in start order.

    ``reaper``: also run the reaper of adopted orphans (only when the process is a child
    subreaper or PID 1; a test process's own children are not the daemon's to wait for).
    """
    if config is None:
        config = load_daemon_config(settings)
    cell = ConfigCell(config)
    root_policy = config.restart.root
    root = Supervisor(
        "root", intensity=root_policy.intensity, period_s=root_policy.period_s, history=512
    )
    mediator = PermissionMediator(
        policy=config.policy.permission_strategy,
        consensus_quorum=config.policy.consensus_quorum,
        response_timeout_ms=settings.permission_response_timeout_ms,
    )
    journal = Journal(settings.state_dir) if settings.journal else None
    front = FrontStats(rate_limiter=limiter_for(settings.rate_limit))

    # The workspace runtimes are built below; these read them when called.
    def live_sessions() -> list[SessionActor]:
        return runtimes.live()

    def sessions_for(workspace: str | None) -> list[SessionActor]:
        return runtimes.live(workspace)

    def retire(session: SessionActor) -> None:
        front.retire(session.log.statistics())

    effects = EffectGate(cell, settings=settings, mediator=mediator, live_sessions=live_sessions)
    hub = WorkspaceHub(sessions_for)
    hub_spec = ChildSpec(
        HUB_SERVICE, hub.run, Restart.PERMANENT, shutdown_grace_s=2.0, stop=hub.close
    )
    mcp_pool, mcp_spec = mcp_service.build(settings, sessions_for)
    runtimes = WorkspaceRuntimes(
        settings,
        mediator,
        config.restart.session,
        effects=effects,
        journal=journal,
        mcp_pool=mcp_pool,
        retire_hook=retire,
    )
    device_flow, device_flow_spec = device_flow_service.build(settings, config, hub)
    state, state_spec = workspace_state.build(settings.workspaces)
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
    children.extend(runtimes.child_specs())
    if chaos is not None:
        children.append(ChildSpec("chaos", chaos.run, Restart.PERMANENT, stop=chaos.close))
    children.extend([hub_spec, device_flow_spec, mcp_spec, state_spec])
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
        lifecycle=Lifecycle(root=root, port=settings.port),
        front=front,
    )
    return host, children
