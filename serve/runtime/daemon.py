"""The daemon: the root supervisor and its children, signals, start-up and shutdown.

Tree (see docs/architecture.md)::

    Daemon.run (trio)
    ├── signal watcher                     first SIGINT/SIGTERM drains, a second forces exit
    └── root Supervisor
        ├── sessions  SessionRegistry      (permanent)
        ├── services  Supervisor           (permanent, restarted with backoff): the optional
        │   ├── chaos, mcp-pool, ...       services, with their own restart budget, so a
        │   └── device-flow, workspace-... flapping one never exhausts the root's
        └── http      HttpFront            (permanent; started last, stopped first)

When the root gives up (its restart budget is exhausted), every session is ended with
``session_died {reason: "daemon_failure"}`` while the HTTP front is still up (so every SSE
stream gets that terminal event and ends), then the children stop and the process exits 70
with one line on stderr (``serve.__main__``).

Shutdown order: stop accepting (``draining``), end every session (each publishes
``session_died {reason: "daemon_shutdown"}`` and closes its event log, so SSE streams end
cleanly instead of being cut by hypercorn's graceful timeout), then the root supervisor
stops its children in reverse start order: the HTTP listener first, the session actors
(and their agent processes, stopped by escalation) after it. The whole drain is bounded by
:data:`SHUTDOWN_FORCE_S`; past it the remaining tasks are cancelled.
"""

from __future__ import annotations

import errno
import functools
import logging
import signal
import socket
import sys
import time
from typing import Any

import hypercorn.config
import hypercorn.trio
import trio

from actors import ChildSpec, Restart, Supervisor, SupervisorEvent
from serve.journal import Journal, JournalLimits
from serve.permissions.mediator import PermissionMediator
from serve.sessions.runtimes import WorkspaceRuntimes, workspace_id
from serve.settings import Settings

log = logging.getLogger(__name__)

SHUTDOWN_FORCE_S = 5.0
PORT_ATTEMPTS = 10
#: Restart budget of the optional services' supervisor (restarts within seconds).
SERVICES_INTENSITY = 5
SERVICES_PERIOD_S = 30.0


class Daemon:
    """Owns the settings, the supervisor tree and the HTTP front of one daemon process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.started_monotonic = time.monotonic()
        # The config file (--config): mediation policy, grants/approvals, restart policy.
        from serve.config import load_daemon_config
        from serve.permissions.effects import EffectGate

        self.config = load_daemon_config(settings)  # SettingsError names a bad key
        self.permission_policy: str = self.config.policy.permission_strategy
        root = self.config.restart.root
        self.root = Supervisor(
            "root",
            intensity=root.intensity,
            period_s=root.period_s,
            history=512,
            on_give_up=self._on_root_give_up,
        )
        #: The optional services' own supervisor (events recorded in the root's history).
        self.services_supervisor = Supervisor(
            "services",
            intensity=SERVICES_INTENSITY,
            period_s=SERVICES_PERIOD_S,
            listener=self.root.events.append,
        )
        self.urls: list[str] = []
        self.port: int = settings.port
        self.draining = False
        self.sse_streams = 0
        self.mediator = PermissionMediator(
            policy=self.permission_policy,
            consensus_quorum=self.config.policy.consensus_quorum,
            response_timeout_ms=settings.permission_response_timeout_ms,
        )
        self.registry = WorkspaceRuntimes(settings, self.mediator, self.config.restart.session)
        self.journal: Journal | None = None
        if settings.journal:
            self.journal = Journal(
                settings.state_dir,
                JournalLimits(
                    retention_ms=settings.journal_retention_ms,
                    max_total_bytes=settings.journal_max_total_bytes,
                ),
            )
            self.registry.journal = self.journal
        self.registry.effects = EffectGate(self, self.config)
        self.services: dict[str, Any] = {}
        #: serve.http.security.RateLimiter when --rate-limit (set by the middleware).
        self.rate_limiter: Any = None
        #: serve.http.metrics.DaemonMetrics (set when the app is created).
        self.metrics: Any = None
        self.registry.retire_hook = self._retire
        self._http_stop = trio.Event()
        self._stopped = trio.Event()
        self._app: Any = None

    # ---- read models -------------------------------------------------------------------

    def workspace_descriptors(self) -> list[dict[str, Any]]:
        return [rt.descriptor() for rt in self.registry]

    def deep_health(self) -> dict[str, Any]:
        live = self.registry.live()
        return {
            "status": "ok",
            "workspaceCount": len(self.settings.workspaces)
            + len(self.settings.untrusted_workspaces),
            "sessions": len(live),
            "pendingPermissions": self.mediator.pending_count(),
            "activePrompts": sum(1 for s in live if s.has_active_prompt),
            "connectedClients": self.sse_streams,
            **({"rateLimitHits": hits} if (hits := self._rate_limit_hits()) else {}),
        }

    def _rate_limit_hits(self) -> dict[str, int] | None:
        if self.rate_limiter is None:
            return None
        from serve.http.middleware import rate_limit_hits

        return rate_limit_hits(self)

    def _retire(self, session: Any) -> None:
        if self.metrics is not None:
            self.metrics.retire(session.log.statistics())

    def supervisor_events(self) -> list[SupervisorEvent]:
        return list(self.root.events)

    # ---- lifecycle ---------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run until shut down; readiness value is the list of bound URLs."""
        from serve.http.app import create_app

        self._app = create_app(self)
        from serve.runtime.services import SERVICES

        service_specs: list[ChildSpec] = []  # optional: under the services supervisor
        core_specs: list[ChildSpec] = []  # direct children of the root
        if self.settings.chaos_kill_rate > 0:
            from serve.runtime.chaos import ChaosMonkey

            monkey = ChaosMonkey(self, self.settings.chaos_kill_rate)
            self.services["chaos"] = monkey
            service_specs.append(
                ChildSpec("chaos", monkey.run, Restart.PERMANENT, stop=monkey.close)
            )
        if self.journal is not None:
            service_specs.append(
                ChildSpec(
                    "journal-janitor",
                    self.journal.run_janitor,
                    Restart.PERMANENT,
                    shutdown_grace_s=0,  # nothing to finish: cancelled at once
                )
            )
        for service in SERVICES:
            obj, spec = service.build(self)
            self.services[service.name] = obj
            (service_specs if service.optional else core_specs).append(spec)
        self.registry.mcp_pool = self.services.get("mcp-pool")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_signals, nursery.cancel_scope)
            await nursery.start(
                self.root.run,
                [
                    ChildSpec(
                        "permission-mediator",
                        self.mediator.run,
                        Restart.PERMANENT,
                        shutdown_grace_s=1.0,
                        stop=self.mediator.close,
                    ),
                    *self.registry.child_specs(),
                    *core_specs,
                    ChildSpec(
                        "services",
                        functools.partial(self.services_supervisor.run, service_specs),
                        Restart.PERMANENT,
                        shutdown_grace_s=SHUTDOWN_FORCE_S,
                        stop=self.services_supervisor.shutdown,
                        backoff_s=1.0,
                        max_backoff_s=30.0,
                    ),
                    ChildSpec(
                        "http",
                        self._serve_http,
                        Restart.PERMANENT,
                        shutdown_grace_s=SHUTDOWN_FORCE_S,
                        stop=lambda: self._http_stop.set(),
                    ),
                ],
            )
            task_status.started(self.urls)
            await self._stopped.wait()
            nursery.cancel_scope.cancel()

    async def shutdown(self) -> None:
        """Drain and stop everything; bounded by :data:`SHUTDOWN_FORCE_S`."""
        if self.draining:
            return
        self.draining = True
        log.info("draining: no new sessions or prompts")
        await self._drain_prompts(self.settings.drain_timeout_ms / 1000)
        log.info("shutting down")
        with trio.move_on_after(SHUTDOWN_FORCE_S):
            await self._close_sessions("daemon_shutdown")
            self.root.shutdown()
            await self.root.finished.wait()
            if self.journal is not None:
                await self.journal.aclose()
        self._stopped.set()

    async def _on_root_give_up(self, exc: BaseException) -> None:
        """The root is about to stop everything: end every session first, so each SSE
        stream gets ``session_died {reason: "daemon_failure"}`` and ends cleanly."""
        log.error("%s: ending every session, then exiting", exc)
        self.draining = True
        await self._close_sessions("daemon_failure")

    async def _drain_prompts(self, timeout_s: float) -> None:
        """Let admitted prompts finish, up to ``timeout_s`` (then they are cancelled)."""
        with trio.move_on_after(timeout_s):
            while any(s.pending_count for s in self.registry.live()):  # noqa: ASYNC110
                await trio.sleep(0.05)

    def readiness(self) -> tuple[bool, str]:
        """For ``/readyz``: (ready, reason)."""
        if self.draining:
            return False, "draining"
        states = {c["name"]: c["state"] for c in self.root.children()}
        if not self.root.running or any(state != "running" for state in states.values()):
            return False, "supervisor_not_running"
        limit = self.settings.max_sessions
        if limit and len(self.registry.live()) >= limit * len(self.settings.workspaces):
            return False, "session_capacity_exhausted"
        total = self.settings.max_total_sessions
        if total and len(self.registry.live()) >= total:
            return False, "session_capacity_exhausted"
        return True, "ready"

    async def _close_sessions(self, reason: str) -> None:
        """End every session: ``session_died {reason}``, logs closed, SSE streams end."""
        with trio.move_on_after(SHUTDOWN_FORCE_S - 1):
            await self.registry.close_all(reason)

    async def _watch_signals(self, cancel_scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                if not self.draining:
                    log.info("received %s, draining", signal.Signals(signum).name)
                    trio.lowlevel.spawn_system_task(self.shutdown)
                else:
                    log.warning("second signal: forcing exit")
                    cancel_scope.cancel()
                    self._stopped.set()
                    return

    # ---- the HTTP front ----------------------------------------------------------------

    async def _serve_http(self, *, task_status: trio.TaskStatus[list[str]]) -> None:
        self._http_stop = trio.Event()
        config = hypercorn.config.Config()
        config.accesslog = None
        config.errorlog = logging.getLogger("hypercorn.error")
        config.graceful_timeout = 2.0
        config.keep_alive_timeout = 5.0
        config.include_server_header = False
        if self.settings.tls_cert and self.settings.tls_key:
            config.certfile = self.settings.tls_cert
            config.keyfile = self.settings.tls_key
        fd, port = bind_listener(
            self.settings.hostname, self.port, user_timeout_ms=self.settings.writer_idle_timeout_ms
        )
        self.port = port
        config.bind = [f"fd://{fd}"]
        scheme = "https" if config.ssl_enabled else "http"
        host = self.settings.hostname
        display_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        self.urls = [f"{scheme}://{display_host}:{port}"]
        self._app.config["ACP_SERVE_PORT"] = port
        await hypercorn.trio.serve(
            self._app, config, shutdown_trigger=self._http_stop.wait, task_status=task_status
        )


def bind_listener(host: str, port: int, *, user_timeout_ms: int | None = None) -> tuple[int, int]:
    """Bind a listening TCP socket; on EADDRINUSE try the next port (10 attempts).

    ``user_timeout_ms`` (``--writer-idle-timeout-ms``) sets ``TCP_USER_TIMEOUT`` on the
    listener, inherited by every accepted connection: when written data stays
    unacknowledged, or the peer keeps its receive window closed (an SSE reader that stopped
    reading), for that long, the kernel aborts the connection. The blocked write then
    fails, hypercorn closes the stream and the SSE subscriber is released. This is done in
    the kernel because hypercorn shields its socket writes from cancellation, so a write
    stuck on a full socket cannot be timed out from the app.

    Returns the detached file descriptor (hypercorn takes ownership) and the real port.
    """
    bind_host = host.strip("[]")
    if bind_host == "localhost":
        bind_host = "127.0.0.1"
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    attempts = 1 if port == 0 else PORT_ATTEMPTS
    last_error: OSError | None = None
    for offset in range(attempts):
        candidate = port + offset
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if user_timeout_ms:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, user_timeout_ms)
            sock.bind((bind_host, candidate))
        except OSError as exc:
            sock.close()
            last_error = exc
            if exc.errno == errno.EADDRINUSE and offset + 1 < attempts:
                print(
                    f"acp-serve: port {candidate} is in use, trying {candidate + 1}...",
                    file=sys.stderr,
                )
                continue
            raise
        real_port = sock.getsockname()[1]
        return sock.detach(), real_port
    assert last_error is not None
    raise last_error


__all__ = ["Daemon", "bind_listener", "workspace_id"]
