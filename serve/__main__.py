"""``acp-serve`` / ``python -m serve``: parse settings, print the ready line, run."""

from __future__ import annotations

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
from serve.settings import SettingsError, parse_settings

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
        log.warning("--token on the command line is visible in ps; prefer QWEN_SERVER_TOKEN")
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
            if settings.trusted_loopback:
                log.warning(
                    "no bearer token: local callers on this loopback listener have full API access"
                )

    try:
        trio.run(run)
    except BaseExceptionGroup as group:
        telemetry.stop()
        gave_up, _ = group.split(SupervisorGaveUp)
        if gave_up is None:
            raise
        stop_logging()  # what was logged comes first; the exit is the last line
        first: BaseException = gave_up
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        print(f"acp-serve: {first}; exiting", file=sys.stderr, flush=True)
        return EXIT_SUPERVISOR_GAVE_UP
    except OSError as exc:
        print(
            f"acp-serve: cannot listen on {settings.hostname}:{settings.port}: {exc}",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        telemetry.stop()
        return 130
    telemetry.stop()  # the last spans, bounded (SHUTDOWN_FLUSH_S), after the loop ended
    _exit_at_once(0)


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
