"""The daemon: lifecycle only: run the Host's supervisor tree, signals, drain, serve HTTP.

Tree (see docs/architecture.md)::

    Daemon.run (trio)
    ├── signal watcher                     first SIGINT/SIGTERM drains, a second forces exit
    └── root Supervisor
        ├── ... the Host's children         (serve/runtime/build.py, in start order; the
        │                                    optional services under their own supervisor)
        └── http      hypercorn + the app   (permanent; started last, stopped first)

When the root gives up (its restart budget is exhausted), every session is ended with
``session_died {reason: "daemon_failure"}`` while the HTTP front is still up (so every SSE
stream gets that terminal event and ends; the root's ``on_give_up`` hook, set in
``build_host``), then the children stop and the process exits 70 with one line on stderr
(``serve.__main__``).

Shutdown order: stop accepting (``draining``), end every session (each publishes
``session_died {reason: "daemon_shutdown"}`` and closes its event log, so SSE streams end
cleanly instead of being cut by hypercorn's graceful timeout; in a cluster,
``--journal-url``, the idle ones are handed over instead, with no final event:
serve/api/handover.py), end the fronts' other streams (``lifecycle.stream_closers``: the
/acp connection streams and WebSockets, after their pumps relayed that last event), let the
listener stop once nothing of the app is in flight (bounded by
``--http-graceful-timeout-ms``; past it the connections still busy, such as a write blocked
on a reader that stopped reading, are shut down), then the root supervisor stops its
children in reverse start order: the HTTP listener first, the session actors (and their
agent processes, stopped by escalation) after it. The whole drain is bounded by
:data:`SHUTDOWN_FORCE_S`; past it the remaining tasks are cancelled, and a cleanup that
cannot be cancelled (a shielded flush on a stalled disk) gets :data:`HARD_EXIT_MARGIN_S`
more before every agent group is SIGKILLed and the process exits 1.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import sys

import hypercorn.config
import hypercorn.trio
import trio

from actors import ChildSpec, Restart
from serve.api.handover import hand_over_idle
from serve.config import DaemonConfig
from serve.host import Host
from serve.http.app import create_app
from serve.runtime.build import build_host
from serve.settings import Settings
from serve.workspaces.runtimes import workspace_id

log = logging.getLogger(__name__)

SHUTDOWN_FORCE_S = 5.0
#: Past SHUTDOWN_FORCE_S plus this, a shutdown stuck in uncancellable cleanup exits hard.
HARD_EXIT_MARGIN_S = 2.0
PORT_ATTEMPTS = 10
#: How long a front may take to relay its sessions' last events before its streams end.
STREAM_END_S = 1.0
#: hypercorn's graceful timeout once the app has nothing in flight (its own leftovers only).
LEFTOVER_GRACE_S = 0.1


class Daemon:
    """Runs one Host: the root supervisor and its children, signals, drain, the HTTP front.

    The Host (what the daemon is made of) comes from :func:`serve.runtime.build.build_host`;
    the daemon only runs it. ``Daemon(settings)`` builds one (tests); the entry point passes
    the config it already parsed.
    """

    def __init__(
        self,
        settings: Settings,
        config: DaemonConfig | None = None,
        *,
        reaper: bool = False,
        built: tuple[Host, list[ChildSpec]] | None = None,
    ) -> None:
        self.host, self._children = built or build_host(settings, config, reaper=reaper)
        self.settings = settings
        self._app = create_app(self.host)
        self._http_stop = trio.Event()
        self._http_config: hypercorn.config.Config | None = None
        self._stopped = trio.Event()

    # ---- lifecycle ---------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run until shut down; readiness value is the list of bound URLs."""
        root = self.host.root
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_signals, nursery.cancel_scope)
            await nursery.start(
                root.run,
                [
                    *self._children,
                    ChildSpec(
                        "http",
                        self._serve_http,
                        Restart.PERMANENT,
                        shutdown_grace_s=SHUTDOWN_FORCE_S,
                        stop=self._stop_http,
                    ),
                ],
            )
            task_status.started(self.host.lifecycle.urls)
            await self._stopped.wait()
            nursery.cancel_scope.cancel()

    async def shutdown(self) -> None:
        """Drain and stop everything; bounded by :data:`SHUTDOWN_FORCE_S`."""
        lifecycle = self.host.lifecycle
        if lifecycle.draining:
            return
        lifecycle.draining = True
        log.info("draining: no new sessions or prompts")
        await self._drain_prompts(self.settings.drain_timeout_ms / 1000)
        log.info("shutting down")
        trio.lowlevel.spawn_system_task(self._hard_deadline, SHUTDOWN_FORCE_S + HARD_EXIT_MARGIN_S)
        with trio.move_on_after(SHUTDOWN_FORCE_S) as bound:
            self.host.registry.drain_agents()  # spares stop now, beside the sessions
            await self._close_sessions("daemon_shutdown")
            await self._end_streams()
            self.host.root.shutdown()
            await self.host.root.finished.wait()
            if self.host.journal is not None:
                await self.host.journal.aclose()
        if bound.cancelled_caught:
            log.warning("shutdown reached its %.1f s bound; cancelling the rest", SHUTDOWN_FORCE_S)
        self._stopped.set()

    async def _hard_deadline(self, after_s: float) -> None:
        """The last resort of the shutdown bound: a cleanup that cannot be cancelled (a
        shielded journal flush on a stalled disk, a child that will not stop) must not hold
        the process. Past ``after_s`` every agent group is SIGKILLed and the process exits 1."""
        await trio.sleep(after_s)
        log.error("shutdown did not finish within %.1f s; exiting now", after_s)
        for session in self.host.registry.all_sessions():
            conn = session.conn
            if conn is not None:
                with contextlib.suppress(OSError):
                    os.killpg(conn.process.pgid, signal.SIGKILL)
        logging.shutdown()
        os._exit(1)

    async def _drain_prompts(self, timeout_s: float) -> None:
        """Let admitted prompts finish, up to ``timeout_s`` (then they are cancelled)."""
        with trio.move_on_after(timeout_s):
            while any(s.pending_count for s in self.host.registry.live()):  # noqa: ASYNC110
                await trio.sleep(0.05)

    async def _close_sessions(self, reason: str) -> None:
        """End every session: ``session_died {reason}``, logs closed, SSE streams end. In a
        cluster (``--journal-url``) the idle ones are handed over instead, with no final
        event (serve/api/handover.py): another daemon restores them on the next request."""
        with trio.move_on_after(SHUTDOWN_FORCE_S - 1):
            if self.settings.journal_url is not None:
                handed = await hand_over_idle(
                    self.host.registry.live(), timeout_s=SHUTDOWN_FORCE_S - 2
                )
                if handed.moved or handed.kept:
                    log.info("sessions handed over: %d (ended: %d)", handed.moved, handed.kept)
            await self.host.registry.close_all(reason)

    async def _end_streams(self) -> None:
        """End every front's event streams (their terminal frames are queued by now), so
        the listener stops at once instead of waiting out ``--http-graceful-timeout-ms``."""
        for end in list(self.host.lifecycle.stream_closers):
            try:
                await end(STREAM_END_S)
            except Exception:
                log.exception("ending the event streams failed")

    async def _watch_signals(self, cancel_scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                if not self.host.draining:
                    log.info("received %s, draining", signal.Signals(signum).name)
                    trio.lowlevel.spawn_system_task(self.shutdown)
                else:
                    log.warning("second signal: forcing exit")
                    cancel_scope.cancel()
                    self._stopped.set()
                    return

    # ---- the HTTP front ----------------------------------------------------------------

    async def _stop_http(self) -> None:
        """Stop the listener once the app has nothing in flight (the drain has ended every
        event stream, so only responses still being written count), or after
        ``--http-graceful-timeout-ms``. hypercorn then gets :data:`LEFTOVER_GRACE_S` for
        its own leftovers (closing idle keep-alive connections, a closed WebSocket's ping
        task asleep for its interval) instead of a second graceful timeout."""
        front = self.host.front
        with trio.move_on_after(self.settings.http_graceful_timeout_ms / 1000):
            while front.open_requests > 0:  # noqa: ASYNC110
                await trio.sleep(0.01)
        if front.open_requests > 0:
            # A write blocked on a full socket (a reader that stopped reading) cannot be
            # cancelled: hypercorn shields it. Shutting the socket down makes it fail.
            cut = shut_down_connections(self.host.lifecycle.port)
            log.warning(
                "%d request(s) still busy after the graceful timeout; %d connection(s) shut down",
                front.open_requests,
                cut,
            )
        if self._http_config is not None:
            self._http_config.graceful_timeout = min(
                self._http_config.graceful_timeout, LEFTOVER_GRACE_S
            )
        self._http_stop.set()

    async def _serve_http(self, *, task_status: trio.TaskStatus[list[str]]) -> None:
        self._http_stop = trio.Event()
        config = self._http_config = hypercorn.config.Config()
        config.accesslog = None
        config.errorlog = logging.getLogger("hypercorn.error")
        config.graceful_timeout = self.settings.http_graceful_timeout_ms / 1000
        config.keep_alive_timeout = self.settings.http_keep_alive_timeout_ms / 1000
        config.include_server_header = False
        # WebSocket pings keep idle /acp sockets alive through proxies and surface dead peers.
        config.websocket_ping_interval = 15.0
        if self.settings.tls_cert and self.settings.tls_key:
            config.certfile = self.settings.tls_cert
            config.keyfile = self.settings.tls_key
        lifecycle = self.host.lifecycle
        fd, port = bind_listener(
            self.settings.hostname,
            lifecycle.port,
            user_timeout_ms=self.settings.writer_idle_timeout_ms,
            move_on=not self.settings.port_explicit,
        )
        lifecycle.port = port
        config.bind = [f"fd://{fd}"]
        scheme = "https" if config.ssl_enabled else "http"
        host = self.settings.hostname
        display_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        lifecycle.urls[:] = [f"{scheme}://{display_host}:{port}"]
        self._app.config["ACP_SERVE_PORT"] = port
        await hypercorn.trio.serve(
            self._app, config, shutdown_trigger=self._http_stop.wait, task_status=task_status
        )


def shut_down_connections(port: int) -> int:
    """Shut down, both ways, every accepted TCP connection of this process on ``port`` (the
    listener itself has no peer and is left alone); returns how many. The drain's last
    resort for connections whose writes are blocked: the blocked ``send`` then fails with
    EPIPE and hypercorn ends the connection. Linux (``/proc/self/fd``); 0 elsewhere."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return 0
    cut = 0
    for name in names:
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        try:
            if (
                sock.type == socket.SOCK_STREAM
                and sock.family in (socket.AF_INET, socket.AF_INET6)
                and sock.getsockname()[1] == port
            ):
                sock.getpeername()  # OSError for the listener
                sock.shutdown(socket.SHUT_RDWR)
                cut += 1
        except OSError:
            pass
        finally:
            sock.close()  # the duplicate only; the connection's own fd stays with hypercorn
    return cut


def bind_listener(
    host: str, port: int, *, user_timeout_ms: int | None = None, move_on: bool = True
) -> tuple[int, int]:
    """Bind a listening TCP socket; on EADDRINUSE try the next port (10 attempts) when
    ``move_on`` (the default port; a port the caller named is refused when busy).

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
    attempts = 1 if port == 0 or not move_on else PORT_ATTEMPTS
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


__all__ = ["Daemon", "bind_listener", "shut_down_connections", "workspace_id"]
