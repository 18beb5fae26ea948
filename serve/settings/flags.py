"""The flag table: every ``qwen serve`` 0.24.4 flag and acp-serve's own, as an argparse parser.

Values are kept as strings (argparse does no conversion) so :mod:`serve.settings.parse`
can validate each one and name the flag and the bad value in its refusal. Flags for
subsystems acp-serve does not have are listed in :data:`INERT_FLAGS` and accepted without
help text (:func:`build_parser` adds them last).
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Mapping
from typing import Any, NoReturn

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


#: The sections of ``--help``, in order: (title, what its flags are about).
SECTIONS = (
    ("serving", "where and how the daemon listens, and who may call it"),
    ("agents", "the agent command and its children"),
    ("isolation", "what an agent may write"),
    ("sessions", "sessions, turns, permissions and the journal"),
    ("limits", "bounds on connections, requests and rates"),
    ("multi-user", "principals, quotas and the audit log (docs/multi-user.md)"),
    ("observability", "logs and fault injection"),
    ("compatibility", "qwen serve flags kept for launch scripts"),
)
#: A flag's section, by exact name; else by the first matching prefix in _SECTION_PREFIXES.
_SECTION_OF = {
    "--workspace": "serving",
    "--untrusted-workspace": "isolation",
    "--agent-sandbox": "isolation",
    "--agent-allow-write": "isolation",
    "--state-dir": "sessions",
    "--shared-dir": "sessions",
    "--config": "serving",
    "--no-journal": "sessions",
    "--approval-mode": "sessions",
    "--max-sessions": "sessions",
    "--max-total-sessions": "sessions",
    "--max-pending-prompts-per-session": "sessions",
    "--event-ring-size": "sessions",
    "--event-ring-bytes": "sessions",
    "--max-agent-line-bytes": "agents",
    "--enable-session-shell": "sessions",
    "--prompt-deadline-ms": "sessions",
    "--prompt-response": "sessions",
    "--channel-idle-timeout-ms": "agents",
    "--initialize-timeout-ms": "agents",
    "--turn-settle-ms": "sessions",
    "--cancel-grace-ms": "sessions",
    "--permission-response-timeout-ms": "sessions",
    "--memory-project-scope": "sessions",
    "--memory-file-name": "sessions",
    "--warm-agents": "agents",
    "--warm-agents-max": "agents",
    "--sessions-per-agent": "agents",
    "--packed-spare": "agents",
    "--mcp-client-budget": "agents",
    "--mcp-budget-mode": "agents",
    "--log-format": "observability",
    "--access-log": "observability",
    "--chaos-kill-rate": "observability",
    "--device-flow-provider": "multi-user",
    "--advertise-url": "sessions",
}
_SECTION_PREFIXES = (
    ("--auth-", "multi-user"),
    ("--quota-", "multi-user"),
    ("--audit-", "multi-user"),
    ("--agent-", "agents"),
    ("--session-", "sessions"),
    ("--journal-", "sessions"),
    ("--client-", "sessions"),
    ("--max-", "limits"),
    ("--rate-limit", "limits"),
    ("--http-", "limits"),
    ("--writer-", "limits"),
    ("--drain-", "limits"),
)


def section_of(flag: str) -> str:
    """The ``--help`` section of ``flag`` (inert ones: compatibility; else serving)."""
    if flag in INERT_FLAGS or flag in ("--no-token-qr", "--web", "--no-web", "--no-http-bridge"):
        return "compatibility"
    if flag in _SECTION_OF:
        return _SECTION_OF[flag]
    for prefix, section in _SECTION_PREFIXES:
        if flag.startswith(prefix):
            return section
    return "serving"


class _HelpFormatter(argparse.HelpFormatter):
    """Every flag's help names its default: the help's own words when they say "default",
    else the flag's default value (``off`` for a switch, ``none`` when unset)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.help is argparse.SUPPRESS or not action.option_strings:
            return text
        if action.dest == "help":
            return text
        default = action.default
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
            shown = "off" if not default else "on"
        elif default is None:
            shown = "none"
        elif isinstance(default, list | tuple):
            shown = ", ".join(str(v) for v in default) or "none"
        else:
            shown = str(default)
        return f"{text} (default {shown})".replace("%", "%%")


class FlagParser(argparse.ArgumentParser):
    """The daemon's parser: flags land in their ``--help`` section (:func:`section_of`),
    whoever adds them; a bad command line is one short line, with "did you mean" for an
    unknown flag, instead of the whole usage."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(formatter_class=_HelpFormatter, **kwargs)
        self._sections = {title: self.add_argument_group(title, about) for title, about in SECTIONS}

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        sections: dict[str, argparse._ArgumentGroup] | None = getattr(self, "_sections", None)
        if sections is not None and args and str(args[0]).startswith("--"):
            action: argparse.Action = sections[section_of(str(args[0]))].add_argument(
                *args, **kwargs
            )
            return action
        return super().add_argument(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            unknown = message[len(prefix) :].split()[0]
            flag = unknown.split("=", 1)[0]
            known = [
                o
                for a in self._actions
                if a.help is not argparse.SUPPRESS
                for o in a.option_strings
            ]
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            message = f"unknown flag {unknown}{hint}"
        self.exit(2, f"{self.prog}: {message}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    p = FlagParser(
        prog="acp-serve",
        usage="acp-serve [FLAG ...]   (also: acp-serve client ..., acp-serve attach URL)",
        description="Serve ACP agents over the qwen serve v1 HTTP + SSE protocol. "
        "Every flag: docs/reference/command-line.md.",
    )
    add = p.add_argument
    add("--hostname", default="127.0.0.1", help="bind interface (default 127.0.0.1)")
    add(
        "--port",
        default=None,
        help=f"TCP port; 0 = ephemeral (default {DEFAULT_PORT}, or the next free one when it is "
        "busy; a port given here is refused when busy)",
    )
    add("--token", default=None, help="bearer token (else $QWEN_SERVER_TOKEN); visible in ps")
    add(
        "--token-file",
        default=None,
        metavar="FILE",
        help="read the bearer token from the first line of FILE (instead of --token)",
    )
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
        help="state directory: event journal, scripted agent sessions, credentials (default "
        "$ACP_SERVE_STATE_DIR, else $XDG_STATE_HOME/acp-serve or ~/.local/state/acp-serve; "
        "created 0700; start-up stops when it cannot be created or written)",
    )
    add("--config", default=None, metavar="FILE", help="daemon config file (YAML)")
    add(
        "--agent-sandbox",
        default=None,
        metavar="MODE",
        help="agent file sandbox: auto (Landlock where available; default), landlock, off",
    )
    add(
        "--agent-pid-namespace",
        default=None,
        metavar="MODE",
        help="each agent in a pid namespace with its own /proc: auto (where the kernel "
        "allows; default), on, off",
    )
    add(
        "--agent-uid-range",
        default=None,
        metavar="START:COUNT",
        help="run each principal's agents under a uid of their own from this range (root "
        "only): off, auto (default: 2000000000:100000000 in multi-user mode as root, else "
        "off), START:COUNT",
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
        "--approval-mode",
        default=None,
        metavar="MODE",
        help="the approval mode a new session starts in when its agent offers it and the "
        "create asks for none: plan, default (ask before writing), auto-edit, auto, yolo, or "
        "the agent's own id (default: the agent's own; scripts/serve --agent: default)",
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
    add(
        "--max-total-sessions",
        default=None,
        help="daemon-wide session cap; 0 = unlimited (default: none)",
    )
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
        "--journal-url",
        default=None,
        metavar="URL",
        help="keep the journal in PostgreSQL (postgresql://...) instead of files under "
        "--state-dir (docs/postgres-journal.md)",
    )
    add(
        "--advertise-url",
        default=None,
        metavar="URL",
        help="with --journal-url: how the other daemons reach this one, e.g. "
        "http://$(POD_IP):4170 (default: the URL it listens on)",
    )
    add(
        "--journal-lease-ms",
        default="20000",
        metavar="MS",
        help="with --journal-url: a session's lease; a frozen daemon's sessions are taken "
        "over this long after its last renewal (renewed every quarter of it; default 20000)",
    )
    add(
        "--shared-dir",
        default=None,
        metavar="DIR",
        help="an existing, writable directory all daemons of a cluster share: the agents' "
        "places (each principal's HOME and store under DIR/tenants, the scripted agent's "
        "store DIR/scripted) live there instead of under --state-dir, so an agent started "
        "on another daemon finds the session it loads (default $ACP_SERVE_SHARED_DIR, "
        "else none)",
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
    add(
        "--mcp-budget-mode",
        default=None,
        choices=None,
        help="enforce|warn|off (default warn with --mcp-client-budget, else off)",
    )
    add("--prompt-deadline-ms", default=None, help="wall-clock cap per prompt (default: none)")
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
    add(
        "--initialize-timeout-ms",
        default=None,
        help="ACP initialize/session-new timeout (default 10000)",
    )
    add(
        "--session-restore-timeout-ms",
        default=None,
        help="ACP load/resume timeout (default the larger of 60000 and --initialize-timeout-ms)",
    )
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
    add("--rate-limit-prompt", default=None, help="prompt tier max per window (default 10)")
    add("--rate-limit-mutation", default=None, help="mutation tier max per window (default 30)")
    add("--rate-limit-read", default=None, help="read tier max per window (default 120)")
    add("--rate-limit-window-ms", default=None, help="rate-limit window, >= 1000 (default 60000)")
    add("--log-format", default="text", help="text|json")
    add("--access-log", action="store_true", help="log every request (method, route, status)")
    add(
        "--otel-endpoint",
        default=None,
        metavar="URL",
        help="export OpenTelemetry traces over OTLP/HTTP to URL (e.g. http://127.0.0.1:4318/v1/traces)",
    )
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
