"""``acp-serve`` / ``python -m serve``: parse settings, print the ready line, run."""

from __future__ import annotations

import errno
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

import trio

from acp.children import become_subreaper, become_undumpable
from actors import SupervisorGaveUp
from serve import telemetry
from serve.config import config_warnings, load_daemon_config, with_config_grants
from serve.logs import setup_logging, stop_logging
from serve.settings import Settings, SettingsError, parse_settings

#: Exit status when the root supervisor gave up (EX_SOFTWARE).
EXIT_SUPERVISOR_GAVE_UP = 70


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["client"]:
        # `acp-serve client ...` is the CLI client (also `acp-serve-client`); lazy: the
        # client does not load the daemon, and the daemon does not load the client.
        from serve.client.cli import main as client_main  # lazy (see above)

        return client_main(args[1:])
    if args[:1] == ["attach"]:
        # `acp-serve attach URL [--token-file F]`: a stdio ACP agent forwarding to a remote /acp.
        from serve.client.attach import main as attach_main  # lazy: like the client above

        return attach_main(args[1:])
    argv = args
    try:
        settings = parse_settings(argv)
        config = load_daemon_config(settings)  # a bad --config file stops start-up here
        settings = with_config_grants(settings, config)  # sandbox.allowWrite
    except SettingsError as exc:
        print(f"acp-serve: {exc}", file=sys.stderr)
        return 1
    problem = state_dir_problem(settings.state_dir)
    if problem is not None:
        print(f"acp-serve: {problem}", file=sys.stderr)
        return 1
    setup_logging(settings.log_format)
    log = logging.getLogger("serve")
    try:
        telemetry.start(settings.otel_endpoint)  # OpenTelemetry traces (docs/tracing.md)
    except telemetry.TracingConfigError as exc:
        print(f"acp-serve: {exc}", file=sys.stderr)
        return 1
    for warning in config_warnings(config):
        log.warning("%s", warning)
    if settings.token_from_argv:
        log.warning(
            "--token on the command line is visible in ps (and to every process that reads "
            "/proc); prefer --token-file or QWEN_SERVER_TOKEN"
        )
    if settings.token is not None and len(settings.token) < 16:
        log.warning(
            "the bearer token is short (%d characters); use 16 or more", len(settings.token)
        )
    if settings.token_generated:
        print(f"acp-serve: generated bearer token: {settings.token}", file=sys.stderr, flush=True)
    for flag in settings.inert_flags:
        log.warning("%s is accepted for compatibility and has no effect in acp-serve", flag)

    from serve.runtime.daemon import Daemon  # lazy: `acp-serve client` never loads it

    # Orphaned descendants of agents are re-parented to us (PID 1 in a container anyway),
    # and the daemon's reaper collects them: no zombies.
    subreaper = become_subreaper()
    # Agents (same uid) cannot read our token from /proc/<pid>/environ or our memory.
    if not become_undumpable():
        log.warning("cannot make the daemon non-dumpable: agents can read its /proc environ")
    if not subreaper and os.getpid() != 1:
        log.warning("cannot become a child subreaper: orphans of agents go to PID 1")
    # Agents in pid namespaces of their own (serve/isolation/pidns.py): probed once, here.
    from serve.isolation import pidns  # lazy: `acp-serve client` never loads it

    ns = pidns.resolve_now(settings)
    if not ns.active and settings.agent_pid_namespace == "on":
        print(f"acp-serve: --agent-pid-namespace on: {ns.reason}", file=sys.stderr)
        return 1
    if not ns.active and settings.agent_pid_namespace == "auto":
        log.warning("agents share the daemon's pid namespace: %s", ns.reason)
    try:
        daemon = Daemon(settings, config, reaper=subreaper or os.getpid() == 1)
    except SettingsError as exc:  # e.g. --agent-limits cgroup without a usable cgroup
        print(f"acp-serve: {exc}", file=sys.stderr)
        return 1

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(daemon.run)
            mode = f"mode=http-bridge, workspace={settings.primary_workspace}"
            print(f"acp-serve listening on {urls[0]} ({mode})", flush=True)
            _release_startup_memory()
            log.info("%s", auth_summary(settings))
            if settings.trusted_loopback:
                log.warning("%s", no_token_warning())

    try:
        trio.run(run)
    except BaseExceptionGroup as group:
        telemetry.stop()
        gave_up, _ = group.split(SupervisorGaveUp)
        if gave_up is None:
            bind_failed, _ = group.split(OSError)
            if bind_failed is None:
                raise
            stop_logging()
            error: BaseException = bind_failed
            while isinstance(error, BaseExceptionGroup):
                error = error.exceptions[0]
            assert isinstance(error, OSError)
            print(
                f"acp-serve: {_listen_problem(settings.hostname, settings.port, error)}",
                file=sys.stderr,
                flush=True,
            )
            return 1
        stop_logging()  # what was logged comes first; the exit is the last line
        first: BaseException = gave_up
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        print(f"acp-serve: {first}; exiting", file=sys.stderr, flush=True)
        return EXIT_SUPERVISOR_GAVE_UP
    except OSError as exc:
        print(
            f"acp-serve: {_listen_problem(settings.hostname, settings.port, exc)}", file=sys.stderr
        )
        return 1
    except KeyboardInterrupt:
        telemetry.stop()
        return 130
    telemetry.stop()  # the last spans, bounded (SHUTDOWN_FLUSH_S), after the loop ended
    _exit_at_once(0)


def auth_summary(settings: Settings) -> str:
    """The start-up line saying who may call the daemon."""
    auth = settings.auth
    if settings.bootstrap:
        return "auth: bootstrap token (late binding): only POST /daemon/bind until bound"
    if settings.token is None:
        return "auth: none (loopback callers only; see the warning below)"
    parts = ["operator bearer token"]
    if auth.jwks_url or auth.jwks_file:
        parts.append(f"JWTs signed by {auth.jwks_url or auth.jwks_file}")
    if auth.tokens_file:
        parts.append(f"scoped tokens from {auth.tokens_file}")
    if settings.token_header:
        parts.append(f"the token also in header {settings.token_header}")
    return "auth: " + ", ".join(parts)


def no_token_warning() -> str:
    """What a caller without a token may do on a loopback daemon without one: every route
    but the strict ones (serve/http/security/strict.py), which answer 401 token_required."""
    from serve.http.security.strict import STRICT_ROUTES  # lazy: as the daemon below

    strict = ", ".join(dict.fromkeys(route.what for route in STRICT_ROUTES))
    return (
        "no bearer token: local callers on this loopback listener may use every route except "
        f"those that need a token (401 token_required): {strict}; start with --token or "
        "$QWEN_SERVER_TOKEN to allow them"
    )


def state_dir_problem(path: str) -> str | None:
    """Why the state directory cannot be used (it cannot be created, or a file cannot be
    written in it), or None. Checked before anything starts: a daemon without one answers
    ``/health`` but fails every create."""
    hint = "pass a writable directory with --state-dir (or $ACP_SERVE_STATE_DIR)"
    if os.path.lexists(path) and not os.path.isdir(path):
        return f"the state directory {path} (--state-dir) is not a directory; {hint}"
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        return f"the state directory {path} (--state-dir) cannot be created: {exc.strerror}; {hint}"
    probe = os.path.join(path, f".write-check-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"the state directory {path} (--state-dir) is not writable: {exc.strerror}; {hint}"
    return None


def _listen_problem(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (
            f"--port {port} on {host} is in use (another acp-serve?); stop it, or pass another "
            "--port (0 = any free port)"
        )
    return f"cannot listen on {host}:{port}: {exc}"


def _exit_at_once(code: int) -> NoReturn:
    """After a clean shutdown: write what is logged and buffered, then end the process
    without the interpreter's teardown. Every session, journal and child is closed by now,
    and freeing the modules and heap one object at a time only delays the exit (measured
    0.3-0.5 s on 2 busy cores, more than the rest of the shutdown with an idle agent)."""
    stop_logging()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


#: glibc's mallopt(M_MMAP_THRESHOLD): allocations from this size up get their own mapping,
#: returned to the OS when freed. Fixed, so glibc's dynamic threshold (which rises to 32 MiB
#: after the first large free) cannot keep a multi-MiB agent update's pages in the heap.
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1024 * 1024


def _release_startup_memory() -> None:
    """Hand the heap pages freed by start-up (import churn) back to the OS, and fix the
    mmap threshold (glibc only)."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    libc = ctypes.util.find_library("c")
    if libc is None:
        return
    try:
        c = ctypes.CDLL(libc)
        c.malloc_trim(0)
        c.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    sys.exit(main())
