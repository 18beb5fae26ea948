"""The flag table: every ``qwen serve`` 0.24.4 flag and acp-serve's own, as an argparse parser.

Values are kept as strings (argparse does no conversion) so :mod:`serve.settings.parse`
can validate each one and name the flag and the bad value in its refusal. Flags for
subsystems acp-serve does not have are listed in :data:`INERT_FLAGS` and accepted without
help text (:func:`build_parser` adds them last).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from serve.settings.multi_user import add_auth_flags
from serve.settings.record import (
    BOOTSTRAP_TOKEN_ENV_VAR,
    DEFAULT_EVENT_RING_BYTES,
    DEFAULT_JOURNAL_MAX_TOTAL_BYTES,
    DEFAULT_JOURNAL_RETENTION_MS,
    DEFAULT_MAX_AGENT_LINE_BYTES,
    DEFAULT_PORT,
)

#: Accepted for compatibility with qwen serve launch scripts; no behaviour behind them.
INERT_FLAGS = (
    "--experimental-lsp",
    "--restore-ask-user-question",
    "--channel",
    "--open",
    "--open-with-auth",
    "--token-qr",
    "--local-control",
    "--local-control-address",
    "--compacted-replay-max-bytes",
    "--max-journal-events",
    "--max-journal-bytes",
    "--memory-budget-mb",
    "--memory-pressure-mode",
    "--child-heap-mode",
    "--allow-private-auth-base-url",
    "--external-tool-guard-mode",
    "--external-tool-guard-endpoint",
    "--external-tool-guard-timeout-ms",
)


def default_state_dir(env: Mapping[str, str]) -> str:
    base = env.get("XDG_STATE_HOME") or os.path.join(env.get("HOME", "/tmp"), ".local", "state")
    return os.path.join(base, "acp-serve")


def default_agent_argv() -> tuple[str, ...]:
    return (sys.executable, "-m", "acp.agents.scripted")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="acp-serve",
        description="Serve ACP agents over the qwen serve v1 HTTP + SSE protocol.",
    )
    add = p.add_argument
    add("--hostname", default="127.0.0.1", help="bind interface (default 127.0.0.1)")
    add("--port", default=str(DEFAULT_PORT), help="TCP port; 0 = ephemeral (default 4170)")
    add("--token", default=None, help="bearer token (else $QWEN_SERVER_TOKEN)")
    add("--require-auth", action="store_true", help="refuse to start without a token")
    add(
        "--bootstrap-token",
        default=None,
        help="late binding: a pool-scoped token that only POST /daemon/bind accepts "
        f"(else ${BOOTSTRAP_TOKEN_ENV_VAR})",
    )
    add(
        "--token-header",
        default=None,
        metavar="NAME",
        help="also accept the token from this header (e.g. X-Acp-Serve-Token)",
    )
    add(
        "--public-probes",
        action="store_true",
        help="GET /health (shallow) and /readyz answer without a token on any bind (k8s probes)",
    )
    add(
        "--workspace",
        action="append",
        default=None,
        metavar="DIR",
        help="workspace directory (repeatable; first is primary; default: cwd)",
    )
    add(
        "--untrusted-workspace",
        action="append",
        default=None,
        metavar="DIR",
        help="an extra read-only workspace (writes refused with untrusted_workspace)",
    )
    add(
        "--agent",
        default=None,
        metavar="CMD",
        help='ACP agent command line, e.g. "qwen --acp" (default: the built-in scripted agent)',
    )
    add(
        "--state-dir",
        default=None,
        metavar="DIR",
        help="state directory: event journal, scripted agent sessions, credentials",
    )
    add("--config", default=None, metavar="FILE", help="daemon config file (YAML)")
    add(
        "--agent-sandbox",
        default=None,
        metavar="MODE",
        help="agent file sandbox: auto (Landlock where available; default), landlock, off",
    )
    add(
        "--agent-allow-write",
        action="append",
        default=None,
        metavar="DIR",
        help="a directory every agent may write under the sandbox (repeatable; absolute, "
        "existing; not in the state directory nor a workspace)",
    )
    add(
        "--webhook-allow",
        action="append",
        default=None,
        metavar="HOST|CIDR",
        help="a webhook receiver address, CIDR or host name allowed although loopback, "
        "link-local or private (repeatable; docs/webhooks.md)",
    )
    add("--no-journal", action="store_true", help="do not persist session events")
    add("--max-sessions", default="32", help="live sessions per workspace; 0 = unlimited")
    add("--max-total-sessions", default=None, help="daemon-wide session cap; 0 = unlimited")
    add(
        "--max-pending-prompts-per-session",
        default="5",
        help="accepted prompts waiting-or-running per session; 0 = unlimited",
    )
    add("--max-connections", default="256", help="max concurrent HTTP connections; 0 = off")
    add("--event-ring-size", default="8000", help="per-session SSE replay ring depth")
    add(
        "--event-ring-bytes",
        default=str(DEFAULT_EVENT_RING_BYTES),
        help="per-session SSE replay ring bound in bytes (default 32 MiB)",
    )
    add(
        "--max-agent-line-bytes",
        default=str(DEFAULT_MAX_AGENT_LINE_BYTES),
        help="longest agent stdout line accepted, in bytes (default 16 MiB)",
    )
    add(
        "--journal-retention-ms",
        default=str(DEFAULT_JOURNAL_RETENTION_MS),
        help="delete closed sessions' journals this long after their last write; 0 = never",
    )
    add(
        "--journal-max-total-bytes",
        default=str(DEFAULT_JOURNAL_MAX_TOTAL_BYTES),
        help="bound on all journals on disk (closed sessions deleted oldest first); 0 = off",
    )
    add(
        "--allow-origin",
        action="append",
        default=None,
        metavar="ORIGIN",
        help="CORS allowlist entry: * or scheme://host[:port] (repeatable)",
    )
    add(
        "--trusted-proxy",
        action="append",
        default=None,
        metavar="ADDR",
        help="a reverse proxy (IP or CIDR) whose X-Forwarded-For names the client (repeatable)",
    )
    add("--enable-session-shell", action="store_true", help="enable POST /session/:id/shell")
    add("--tls-cert", default=None, metavar="FILE", help="serve HTTPS with this certificate")
    add("--tls-key", default=None, metavar="FILE", help="private key for --tls-cert")
    add("--mcp-client-budget", default=None, help="cap on live MCP clients")
    add("--mcp-budget-mode", default=None, choices=None, help="enforce|warn|off")
    add("--prompt-deadline-ms", default=None, help="wall-clock cap per prompt")
    add(
        "--prompt-response",
        default=None,
        metavar="MODE",
        help="POST /session/:id/prompt without Prefer: blocking (answer at the turn's end; "
        "default) or async (202 at admission); else $ACP_SERVE_PROMPT_RESPONSE",
    )
    add(
        "--writer-idle-timeout-ms",
        default=None,
        help="cut a connection whose writes stay blocked this long (default 60000)",
    )
    add("--channel-idle-timeout-ms", default="0", help="delay before reaping an idle agent")
    add("--initialize-timeout-ms", default=None, help="ACP initialize/session-new timeout")
    add("--session-restore-timeout-ms", default=None, help="ACP load/resume timeout")
    add("--session-reap-interval-ms", default="60000", help="idle reaper interval; 0 = off")
    add("--session-idle-timeout-ms", default="1800000", help="idle time before reaping")
    add("--client-idle-timeout-ms", default="300000", help="drop clients idle this long; 0 = off")
    add("--session-prompt-settled-close-grace-ms", default="0", help="grace after a prompt")
    add(
        "--turn-settle-ms",
        default="500",
        help="a steered turn ends once its agent was quiet this long after answering (ms)",
    )
    add(
        "--cancel-grace-ms",
        default="10000",
        help="after a cancel the agent ignores this long, end the turn and restart it; 0 = never",
    )
    add("--session-token-budget", default="0", help="tokens a session may use; 0 = no limit")
    add("--session-cost-budget", default="0", help="cost a session may incur; 0 = no limit")
    add("--session-budget-currency", default="USD", help="ISO 4217 currency of the cost budget")
    add(
        "--permission-response-timeout-ms",
        default=None,
        help="permission answer timeout; 0 = wait forever (default 300000)",
    )
    add("--drain-timeout-ms", default="10000", help="graceful drain budget on SIGTERM")
    add("--max-body-bytes", default=str(10 * 1024 * 1024), help="largest request body (bytes)")
    add(
        "--http-graceful-timeout-ms",
        default="2000",
        help="time open requests may finish after the listener stops",
    )
    add("--http-keep-alive-timeout-ms", default="5000", help="idle keep-alive connection lifetime")
    add("--memory-project-scope", default="workspace", help="workspace|git-root")
    add("--memory-file-name", default="QWEN.md", help="memory file for /workspace/init")
    add("--rate-limit", action="store_true", default=None, help="enable rate limiting")
    add("--rate-limit-prompt", default=None, help="prompt tier max per window (10)")
    add("--rate-limit-mutation", default=None, help="mutation tier max per window (30)")
    add("--rate-limit-read", default=None, help="read tier max per window (120)")
    add("--rate-limit-window-ms", default=None, help="rate-limit window (60000, >= 1000)")
    add("--log-format", default="text", help="text|json")
    add("--access-log", action="store_true", help="log every request (method, route, status)")
    add(
        "--device-flow-provider",
        action="append",
        default=None,
        metavar="NAME=URL",
        help="an RFC 8628 device-flow provider (OAuth base URL; repeatable)",
    )
    add(
        "--warm-agents",
        default="1",
        metavar="N",
        help="agent children kept initialized ahead of need per workspace (default 1; 0 = none)",
    )
    add(
        "--warm-agents-max",
        default="4",
        metavar="N",
        help="while sessions keep arriving, up to this many warm children (arrival rate x "
        "spawn time; default 4; at or below --warm-agents: a fixed pool)",
    )
    add(
        "--sessions-per-agent",
        default="1",
        metavar="M",
        help="sessions sharing one agent child (default 1: one child per session)",
    )
    add(
        "--packed-spare",
        action="store_true",
        help="packed mode: spawn a spare child once every child is full (a whole agent's "
        "memory; default: the next create starts it)",
    )
    add(
        "--agent-idle-release-ms",
        default="600000",
        metavar="MS",
        help="an idle session lets its agent go after this long (default 10 min; 0 = never)",
    )
    add(
        "--agent-memory-budget-mb",
        default="0",
        metavar="MiB",
        help="PSS budget of a workspace's agent children: idle sessions are released "
        "first, else 503 memory_budget_exceeded (default 0: none)",
    )
    add(
        "--agent-compile-cache-mb",
        default="256",
        metavar="MiB",
        help="node-based agents get a persistent module compile cache (NODE_COMPILE_CACHE) "
        "under the state directory, bounded to this many MiB (default 256; 0 = off)",
    )
    add(
        "--agent-limits",
        default="auto",
        metavar="MODE",
        help="per-agent-child limits: auto|cgroup|watchdog|off (default auto)",
    )
    add(
        "--agent-memory-max-mb",
        default=None,
        metavar="MiB",
        help="memory cap of each agent child's process tree (default: half the agents' "
        "ceiling, else half the RAM; 0 = none)",
    )
    add(
        "--agent-pids-max",
        default="4096",
        metavar="N",
        help="tasks of each agent child's process tree (default 4096; 0 = none)",
    )
    add(
        "--agent-cpu-weight",
        default="100",
        metavar="W",
        help="cpu.weight of each agent child, 1-10000 (default 100; 0 = none)",
    )
    add(
        "--agent-memory-headroom-mb",
        default="256",
        metavar="MiB",
        help="kept for the daemon below its own cgroup memory limit (default 256)",
    )
    add(
        "--chaos-kill-rate",
        default="0",
        metavar="N",
        help="fault injection: SIGKILL a random session's agent N times a minute on average",
    )
    add(
        "--http-bridge",
        dest="http_bridge",
        action="store_true",
        default=True,
        help="the only mode (default)",
    )
    add("--no-http-bridge", dest="http_bridge", action="store_false", help=argparse.SUPPRESS)
    add("--web", dest="web", action="store_true", default=None, help=argparse.SUPPRESS)
    add("--no-web", dest="web", action="store_false", help=argparse.SUPPRESS)
    add_auth_flags(p)
    for flag in INERT_FLAGS:
        if flag in ("--channel",):
            add(flag, action="append", default=None, help=argparse.SUPPRESS)
        elif flag in (
            "--experimental-lsp",
            "--restore-ask-user-question",
            "--open",
            "--open-with-auth",
            "--local-control",
            "--allow-private-auth-base-url",
        ):
            add(flag, action="store_true", default=None, help=argparse.SUPPRESS)
        elif flag == "--token-qr":
            add(flag, dest="token_qr", action="store_true", default=None, help=argparse.SUPPRESS)
            add("--no-token-qr", dest="token_qr", action="store_false", help=argparse.SUPPRESS)
        else:
            add(flag, default=None, help=argparse.SUPPRESS)
    return p
