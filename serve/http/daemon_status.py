"""``GET /daemon/status``: the operator's read-only snapshot (seed shape, reduced subset).

Theory of operation
-------------------
:func:`daemon_status` reads in-memory state only: settings, the capability registry, the
session registry, the permission mediator's snapshot, the supervisors' bounded event
histories. It makes no agent request, starts nothing and does no file I/O (but for the
agents' cgroup usage files of ``isolation``: in-kernel counters), so it is
cheap, and it answers even while sessions are wedged. ``detail="full"`` adds, per live
session, its summary and its event log's fill level; ``summary`` leaves out the
mediator's per-request internals and keeps the newest :data:`SUMMARY_EVENTS` supervisor
events.

Issues roll up into ``status`` (any ``error`` → error, else any ``warning`` → warning,
else ok): ``session_capacity_high`` and ``connection_capacity_high`` at
:data:`CAPACITY_WARNING_RATIO` of a limit, ``pending_permissions`` (info),
``rate_limit_hits`` (info), ``supervisor_restarts`` (warning: a crash, restart or
give-up within :data:`RESTART_WINDOW_S`) and ``daemon_draining`` (warning).

Secrets: the body is built from an allowlist of fields. It never contains the bearer
token (only ``tokenConfigured``), client ids (only counts), environment values, agent
command lines, or request/permission payloads. Supervisor ``reason`` strings are
truncated to :data:`MAX_REASON_CHARS` and scrubbed of the token if one appears.
"""

from __future__ import annotations

import datetime
import os
import time
from typing import TYPE_CHECKING, Any, Final, Literal

from serve import telemetry
from serve.deviceflow.service import SERVICE_NAME as DEVICE_FLOW
from serve.http import capabilities
from serve.isolation import identity, pidns, sandbox
from serve.mcp.service import SERVICE_NAME as MCP_POOL
from serve.workspaces.hub import HUB_SERVICE
from serve.workspaces.state.reload import SERVICE_NAME as WORKSPACE_STATE

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors.supervisor import SupervisorEvent
    from serve.host import Host
    from serve.http.capabilities import Feature

__all__ = [
    "CAPACITY_WARNING_RATIO",
    "DETAILS",
    "MAX_REASON_CHARS",
    "RESTART_WINDOW_S",
    "SUMMARY_EVENTS",
    "daemon_status",
    "isolation_section",
    "supervisor_history",
]

Detail = Literal["summary", "full"]
DETAILS: Final = ("summary", "full")
CAPACITY_WARNING_RATIO: Final = 0.8
RESTART_WINDOW_S: Final = 300.0
SUMMARY_EVENTS: Final = 50
MAX_REASON_CHARS: Final = 512
_TROUBLE_KINDS: Final = frozenset({"crash", "restart", "give_up"})


def _iso(epoch_s: float) -> str:
    moment = datetime.datetime.fromtimestamp(epoch_s, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _scrub(text: str, token: str | None) -> str:
    if token:
        text = text.replace(token, "[redacted]")
    return text[:MAX_REASON_CHARS]


def isolation_section(daemon: Host) -> dict[str, Any]:
    """``isolation``: one object, each part under its own key. The agent limits
    (serve/isolation: ``backend``, ``limits``, ``ceiling``, ``children`` with each child's
    memory current/peak and tasks, read from its cgroup's files: in-kernel, no disk I/O)
    are at the top level; other parts (the file sandbox) add their own keys."""
    iso = daemon.isolation
    if iso is None:
        return {"backend": "off", "limits": None, "ceiling": None, "children": []}
    out: dict[str, Any] = iso.status()
    return out


def _raw_history(daemon: Host) -> list[SupervisorEvent]:
    events: list[SupervisorEvent] = list(daemon.root.events)
    events.extend(daemon.registry.supervisor_events)
    events.sort(key=lambda e: e.at)
    return events


def supervisor_history(daemon: Host) -> list[dict[str, Any]]:
    """Root + session-supervisor events, oldest first, as wire dicts."""
    token = daemon.settings.token
    return [
        {
            "supervisor": e.supervisor,
            "child": e.child,
            "kind": str(e.kind),
            "reason": _scrub(str(e.reason), token),
            "at": _iso(e.at),
            "attempt": e.attempt,
        }
        for e in _raw_history(daemon)
    ]


def _issue(code: str, severity: str, message: str, section: str) -> dict[str, Any]:
    return {"code": code, "severity": severity, "message": message, "section": section}


def _rollup(issues: list[dict[str, Any]]) -> str:
    severities = {i["severity"] for i in issues}
    return "error" if "error" in severities else "warning" if "warning" in severities else "ok"


def _rate_limit(daemon: Host) -> dict[str, Any] | None:
    limiter = daemon.front.rate_limiter
    if limiter is None:
        return None
    stats = limiter.statistics()
    return {"enabled": stats.enabled, "hits": dict(stats.hits)}


def daemon_status(daemon: Host, detail: Detail, all_features: Sequence[Feature]) -> dict[str, Any]:
    """The body of ``GET /daemon/status?detail=…``; ``all_features`` is the app's list."""
    settings = daemon.settings
    now = time.time()
    features = capabilities.advertised(daemon, all_features)
    tags = [f.tag for f in features]
    live = list(daemon.registry.live())
    inflight = len(getattr(daemon.registry, "inflight", {}))
    permissions = dict(daemon.mediator.snapshot())
    requests = permissions.pop("requests", [])
    raw_history = _raw_history(daemon)
    history = supervisor_history(daemon)
    allow = settings.allow_origins
    issues: list[dict[str, Any]] = []

    if settings.max_sessions and len(live) >= CAPACITY_WARNING_RATIO * settings.max_sessions:
        issues.append(
            _issue(
                "session_capacity_high",
                "warning",
                f"{len(live)} of {settings.max_sessions} sessions in use",
                "runtime",
            )
        )
    if (
        settings.max_connections
        and daemon.front.sse_streams >= CAPACITY_WARNING_RATIO * settings.max_connections
    ):
        issues.append(
            _issue(
                "connection_capacity_high",
                "warning",
                f"{daemon.front.sse_streams} event streams of "
                f"{settings.max_connections} connections",
                "runtime",
            )
        )
    if permissions.get("pending"):
        issues.append(
            _issue(
                "pending_permissions",
                "info",
                f"{permissions['pending']} permission request(s) awaiting a vote",
                "runtime",
            )
        )
    rate_limit = _rate_limit(daemon)
    if rate_limit is not None and any(rate_limit["hits"].values()):
        issues.append(_issue("rate_limit_hits", "info", "requests were rate limited", "runtime"))
    recent = [
        e for e in raw_history if str(e.kind) in _TROUBLE_KINDS and now - e.at <= RESTART_WINDOW_S
    ]
    if recent:
        issues.append(
            _issue(
                "supervisor_restarts",
                "warning",
                f"{len(recent)} daemon actor crash/restart event(s) in the last "
                f"{int(RESTART_WINDOW_S)} s",
                "supervisor",
            )
        )
    pools = [rt.agents for rt in daemon.registry]
    for pool in pools:
        denied = pool.health.denied
        if denied is not None:
            issues.append(
                _issue("agent_sandbox_denied", "error", f"{pool.workspace}: {denied}", "agents")
            )
        elif pool.failing:
            issues.append(
                _issue(
                    "agent_command_failing",
                    "error",
                    f"the agent command failed {pool.failures} times in a row in "
                    f"{pool.workspace}; probing with backoff"
                    + ("" if pool is pools[0] else " (a secondary workspace: still ready)"),
                    "agents",
                )
            )
    box = sandbox.resolve(settings)
    if not box.active and box.requested == "auto":
        issues.append(
            _issue(
                "agent_sandbox_unavailable",
                "warning",
                f"agents run without a file sandbox: {box.reason}",
                "isolation",
            )
        )
    ns = pidns.current(settings)
    if ns is not None and not ns.active and ns.requested == "auto":
        issues.append(
            _issue(
                "agent_pid_namespace_unavailable",
                "warning",
                f"agents can see the daemon's processes: {ns.reason}",
                "isolation",
            )
        )
    if daemon.draining:
        issues.append(_issue("daemon_draining", "warning", "the daemon is shutting down", "daemon"))
    tokens_file = daemon.tokens_file
    if tokens_file is not None and not tokens_file.usable:
        issues.append(
            _issue(
                "auth_tokens_file_unusable",
                "error",
                f"tokens file {tokens_file.path} is {tokens_file.state} ({tokens_file.problem}):"
                " no token from it is accepted until it is fixed",
                "auth",
            )
        )

    counts: dict[str, int] = {}
    for event in history:
        counts[event["kind"]] = counts.get(event["kind"], 0) + 1

    binding = daemon.binding
    body: dict[str, Any] = {
        "v": 1,
        "detail": detail,
        "generatedAt": _iso(now),
        "status": _rollup(issues),
        "issues": issues,
        "daemon": {
            "pid": os.getpid(),
            "uptimeMs": int((time.monotonic() - daemon.started_monotonic) * 1000),
            "mode": "http-bridge",
            "workspaceCwd": settings.primary_workspace,
            "draining": daemon.draining,
        },
        "security": {
            "tokenConfigured": settings.token is not None,
            "requireAuth": settings.require_auth,
            "loopbackBind": settings.is_loopback,
            "allowOriginConfigured": bool(allow),
            "allowOriginMode": "none" if not allow else "any" if "*" in allow else "list",
            "sessionShellCommandEnabled": "session_shell_command" in tags,
            "tokenHeader": settings.token_header,
            # Late binding (--bootstrap-token): whether the bind is still to come.
            "lateBinding": {
                "enabled": binding is not None and binding.late,
                "bound": binding is not None and binding.late and not binding.pending,
            },
        },
        "limits": {
            "maxRegisteredWorkspaces": len(settings.workspaces)
            + len(settings.untrusted_workspaces),
            "maxSessions": settings.max_sessions or None,
            "maxTotalSessions": settings.max_total_sessions or None,
            "maxPendingPromptsPerSession": settings.max_pending_prompts_per_session or None,
            "listenerMaxConnections": settings.max_connections or None,
            "eventRingSize": settings.event_ring_size,
            "promptDeadlineMs": settings.prompt_deadline_ms,
            "writerIdleTimeoutMs": settings.writer_idle_timeout_ms,
            "channelIdleTimeoutMs": settings.channel_idle_timeout_ms,
            "sessionIdleTimeoutMs": settings.session_idle_timeout_ms,
            "sessionPromptSettledCloseGraceMs": settings.session_prompt_settled_close_grace_ms,
            "permissionResponseTimeoutMs": settings.permission_response_timeout_ms or None,
        },
        "capabilities": {
            "protocolVersions": capabilities.PROTOCOL_VERSIONS,
            "features": tags,
        },
        "runtime": {
            "sessions": {"active": len(live), "admissionInFlight": inflight},
            "permissions": permissions,
            "channel": {"live": any(s.conn is not None and not s.conn.closed for s in live)},
            "transport": {"restSseActive": daemon.front.sse_streams},
            "activity": {
                "activePrompts": sum(1 for s in live if s.has_active_prompt),
                "pendingPrompts": sum(s.pending_count for s in live),
                "queuedPrompts": sum(len(s.queue) for s in live),
                "sseSubscribers": sum(s.subscribers for s in live),
            },
        },
        "supervisor": {
            "counts": counts,
            "events": history if detail == "full" else history[-SUMMARY_EVENTS:],
        },
    }
    if rate_limit is not None:
        body["runtime"]["rateLimit"] = rate_limit
    body["runtime"]["tracing"] = telemetry.status()  # OpenTelemetry (serve/telemetry)
    agents = [pool.status() for pool in pools]
    for entry in agents:
        if "lastError" in entry:
            entry["lastError"] = _scrub(entry["lastError"], settings.token)
    body["runtime"]["agents"] = agents
    body["workspaces"] = [
        {
            **rt.descriptor(),
            "sessions": len(rt.registry.live()),
            "activePrompts": sum(1 for s in rt.registry.live() if s.has_active_prompt),
            "pendingPrompts": sum(s.pending_count for s in rt.registry.live()),
        }
        for rt in daemon.registry
    ]
    if settings.auth.configured:
        body["auth"] = {
            "modes": list(settings.auth.modes()),
            **({"tokensFile": tokens_file.status()} if tokens_file is not None else {}),
        }
    body["isolation"] = isolation_section(daemon)
    # The agents' file sandbox (serve/isolation/sandbox.py).
    body.setdefault("isolation", {})["sandbox"] = sandbox.status(settings)
    # Each agent's pid namespace and the principals' uids (serve/isolation/pidns.py, identity.py).
    body["isolation"]["pidNamespace"] = pidns.status(settings)
    body["isolation"]["uids"] = identity.status(settings)
    chaos = daemon.chaos
    if chaos is not None:
        body["runtime"]["chaos"] = chaos.status()
    webhooks = getattr(daemon, "webhooks", None)
    if webhooks is not None:
        body["webhooks"] = webhooks.statistics()
    journal = daemon.journal
    if journal is not None:
        body["runtime"]["journal"] = journal.statistics()
    if detail == "full":
        body["runtime"]["permissions"] = {**permissions, "requests": requests}
        body["full"] = {
            "sessions": [
                {**s.summary(), "eventLog": s.log.statistics(), **s.diagnostics()} for s in live
            ],
            "services": sorted(
                [
                    HUB_SERVICE,
                    DEVICE_FLOW,
                    MCP_POOL,
                    WORKSPACE_STATE,
                    *(["chaos"] if chaos else []),
                ]
            ),
        }
    return body
