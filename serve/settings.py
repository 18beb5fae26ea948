"""Command line and environment → one frozen :class:`Settings` struct.

Every flag of ``qwen serve`` 0.24.4 (qwen-serve-spec §2.1) is accepted under the same
name with the same default, plus acp-serve's own (``--agent``, ``--state-dir``,
``--config``, ...). Values are parsed as strings by argparse and validated here so each
refusal names the flag and the bad value, the way the reference does (§2.4). A bad value
raises :class:`SettingsError`; ``serve.__main__`` prints ``acp-serve: <message>`` to stderr
and exits 1.

Flags for subsystems acp-serve does not have (the Web Shell, channels, LAN pairing,
memory-pressure modelling, ...) are accepted so existing launch scripts keep working, and
listed in :data:`INERT_FLAGS`; using one prints a warning at start. Their capability tags
are never advertised.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from acp import landlock
from serve.origins import InvalidAllowOriginPattern, allow_origin_problem, parse_allow_origin
from serve.tokens import (
    TOKEN_ENV_VAR,
    InvalidBearerToken,
    TokenResolution,
    resolve_startup_token,
    resolve_token,
)

MAX_TIMER_MS = 2_147_483_647
#: Upper bound of ``--max-body-bytes`` (1 GiB): a body is buffered in memory whole.
MAX_BODY_BYTES = 1024 * 1024 * 1024
DEFAULT_PORT = 4170
BOOTSTRAP_TOKEN_ENV_VAR = "ACP_SERVE_BOOTSTRAP_TOKEN"
MIB = 1024 * 1024
DEFAULT_EVENT_RING_BYTES = 32 * MIB
DEFAULT_MAX_AGENT_LINE_BYTES = 16 * MIB
DEFAULT_JOURNAL_RETENTION_MS = 7 * 24 * 3600 * 1000
DEFAULT_JOURNAL_MAX_TOTAL_BYTES = 1024 * MIB
#: Default --writer-idle-timeout-ms: a connection whose written data stays unacknowledged
#: (or whose peer keeps its window shut) this long is cut by the kernel.
DEFAULT_WRITER_IDLE_TIMEOUT_MS = 60_000


class SettingsError(Exception):
    """A flag or environment variable has a value the daemon refuses to start with."""


class RateLimitSettings(msgspec.Struct, frozen=True):
    enabled: bool = False
    prompt: int = 10
    mutation: int = 30
    read: int = 120
    window_ms: int = 60_000


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """The daemon's settings; bounds carry their unit in the name."""

    hostname: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token: str | None = None
    token_from_argv: bool = False
    token_generated: bool = False
    #: ``--bootstrap-token`` (late binding): ``token`` is a pool-scoped bootstrap token
    #: that only ``POST /daemon/bind`` accepts; the bind installs the tenant's token and
    #: revokes it (``serve.binding``). Until then only the probes and the bind are served.
    bootstrap: bool = False
    #: ``--token-header NAME``: a header that may carry the token instead of
    #: ``Authorization`` (lower case; e.g. behind agent-sandbox's router, which strips
    #: ``Authorization``).
    token_header: str | None = None
    require_auth: bool = False
    workspaces: tuple[str, ...] = ()
    untrusted_workspaces: tuple[str, ...] = ()
    agent_argv: tuple[str, ...] = ()
    agent_is_default: bool = True
    state_dir: str = ""
    config_file: str | None = None
    journal: bool = True
    max_sessions: int = 32
    max_total_sessions: int | None = None
    max_pending_prompts_per_session: int = 5
    max_connections: int = 256
    event_ring_size: int = 8000
    #: Bytes of SSE frames a session's replay ring holds at most (the newest frame is
    #: always kept, however large). At least ``max_agent_line_bytes``; twice it (the
    #: default) lets a reader one maximal frame behind survive the events that follow.
    event_ring_bytes: int = DEFAULT_EVENT_RING_BYTES
    #: Longest line accepted from an agent's stdout, in bytes; a longer one is dropped.
    max_agent_line_bytes: int = DEFAULT_MAX_AGENT_LINE_BYTES
    #: Journals of closed sessions older than this are deleted (0: kept forever).
    journal_retention_ms: int = DEFAULT_JOURNAL_RETENTION_MS
    #: Bytes all journals may take on disk; closed sessions' go first, oldest first (0: off).
    journal_max_total_bytes: int = DEFAULT_JOURNAL_MAX_TOTAL_BYTES
    allow_origins: tuple[str, ...] = ()
    #: --trusted-proxy: reverse proxies whose X-Forwarded-For names the client (IPs, CIDRs).
    trusted_proxies: tuple[str, ...] = ()
    enable_session_shell: bool = False
    tls_cert: str | None = None
    tls_key: str | None = None
    mcp_client_budget: int | None = None
    mcp_budget_mode: str = "off"
    prompt_deadline_ms: int | None = None
    #: ``POST /session/:id/prompt`` without ``Prefer: respond-async``: "blocking" (the
    #: seed's default: answer when the turn ends, a dropped POST cancels it) or "async"
    #: (202 at admission, as the reference does; the turn outlives the POST).
    prompt_response: str = "blocking"
    writer_idle_timeout_ms: int | None = DEFAULT_WRITER_IDLE_TIMEOUT_MS
    channel_idle_timeout_ms: int = 0
    initialize_timeout_ms: int = 10_000
    session_restore_timeout_ms: int = 60_000
    session_reap_interval_ms: int = 60_000
    session_idle_timeout_ms: int = 1_800_000
    client_idle_timeout_ms: int = 300_000
    session_prompt_settled_close_grace_ms: int = 0
    #: How long an agent may ignore session/cancel before the turn ends and it restarts (ms).
    cancel_grace_ms: int = 10_000
    #: A steered turn is over once the agent sent no update for it this long after its
    #: prompt response (ms; serve/sessions/steering.py).
    turn_settle_ms: int = 500
    #: Daemon-wide default budgets of every session (0: none; PATCH /session/:id/budget).
    session_token_budget: int = 0
    session_cost_budget: float = 0.0
    session_budget_currency: str = "USD"
    permission_response_timeout_ms: int = 0
    drain_timeout_ms: int = 10_000
    #: Largest request body accepted; beyond it ``413`` (``--max-body-bytes``).
    max_body_bytes: int = 10 * 1024 * 1024
    #: How long hypercorn lets open requests finish once the listener stops.
    http_graceful_timeout_ms: int = 2_000
    #: How long an idle keep-alive connection stays open.
    http_keep_alive_timeout_ms: int = 5_000
    rate_limit: RateLimitSettings = RateLimitSettings()
    memory_project_scope: str = "workspace"
    memory_file_name: str = "QWEN.md"
    log_format: str = "text"
    chaos_kill_rate: float = 0.0
    public_probes: bool = False
    access_log: bool = False
    device_flow_providers: tuple[str, ...] = ()
    #: Agent children kept spawned and initialized ahead of need, per workspace.
    warm_agents: int = 1
    #: The most warm children the adaptive pool keeps while sessions keep arriving
    #: (serve/agents/adaptive.py; at or below ``warm_agents``: a fixed pool).
    warm_agents_max: int = 4
    #: Sessions sharing one agent child (1: one child per session, full isolation).
    sessions_per_agent: int = 1
    #: An idle session lets its agent go after this long (0 = never).
    agent_idle_release_ms: int = 600_000
    #: PSS budget of a workspace's agent children, in MiB (0 = none).
    agent_memory_budget_mb: int = 0
    #: Bound of the node module compile cache given to node-based agents, in MiB (0 = off).
    agent_compile_cache_mb: int = 256
    #: Per-agent-child limits (serve/isolation): ``auto|cgroup|watchdog|off``.
    agent_limits: str = "auto"
    #: Memory cap of one agent child's process tree, MiB (None = auto: half the agents'
    #: ceiling, else half the machine's RAM; 0 = none).
    agent_memory_max_mb: int | None = None
    #: Tasks (processes and threads) of one agent child's tree (0 = none).
    agent_pids_max: int = 4096
    #: cgroup v2 ``cpu.weight`` of each agent child (1-10000; v1: ``cpu.shares``; 0 = none).
    agent_cpu_weight: int = 100
    #: What the daemon keeps for itself below its own cgroup's memory limit, MiB.
    agent_memory_headroom_mb: int = 256
    #: The agents' file sandbox: "auto" (Landlock where the kernel has it), "landlock"
    #: (required), "off" (serve/isolation/sandbox.py).
    agent_sandbox: str = "auto"
    inert_flags: tuple[str, ...] = ()

    @property
    def body_too_large_message(self) -> str:
        """The 413 body's message: ``max 10 MB`` for whole mebibytes, else bytes."""
        mib, rest = divmod(self.max_body_bytes, 1024 * 1024)
        size = f"{mib} MB" if not rest else f"{self.max_body_bytes} bytes"
        return f"Request body too large (max {size})"

    @property
    def primary_workspace(self) -> str:
        return self.workspaces[0]

    @property
    def node_compile_cache_dir(self) -> str | None:
        """Where node-based agents keep their module compile cache (None: off)."""
        if not self.agent_compile_cache_mb or not self.state_dir:
            return None
        return os.path.join(self.state_dir, "node-compile-cache")

    @property
    def is_loopback(self) -> bool:
        return is_loopback_hostname(self.hostname)

    @property
    def trusted_loopback(self) -> bool:
        return self.is_loopback and self.token is None and not self.require_auth

    def __repr__(self) -> str:
        """Field by field, with the bearer token shown as ``[redacted]``."""
        fields = ", ".join(
            f"{name}={'[redacted]' if name == 'token' and value else repr(value)}"
            for name, value in ((f, getattr(self, f)) for f in self.__struct_fields__)
        )
        return f"Settings({fields})"


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


def is_loopback_hostname(host: str) -> bool:
    """Loopback set of the reference: 127.0.0.0/8 dotted quads, localhost, ::1, [::1]."""
    h = host.strip().lower()
    if h in ("localhost", "::1", "[::1]"):
        return True
    parts = h.split(".")
    if len(parts) == 4 and all(p.isdigit() and 0 <= int(p) <= 255 for p in parts):
        return parts[0] == "127"
    return False


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


#: Shortest bootstrap token accepted (it guards a route that installs the tenant's token).
MIN_BOOTSTRAP_TOKEN_CHARS = 16
#: Header names ``--token-header`` may not take: they mean something else to HTTP, to
#: the daemon, or to agent-sandbox's router (which strips its ``X-Sandbox-*`` headers).
_RESERVED_TOKEN_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "host",
        "cookie",
        "origin",
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
        "upgrade",
        "x-qwen-client-id",
        "last-event-id",
    }
)
_TCHAR = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz")


def _bootstrap_token(ns: argparse.Namespace, env: Mapping[str, str]) -> tuple[str | None, bool]:
    """``--bootstrap-token`` (else ``$ACP_SERVE_BOOTSTRAP_TOKEN``) and whether it came from
    argv; refused together with a tenant token (the bind installs that one)."""
    flag = ns.bootstrap_token
    raw = flag if flag is not None else env.get(BOOTSTRAP_TOKEN_ENV_VAR)
    if raw is None:
        return None, False
    source = "--bootstrap-token" if flag is not None else BOOTSTRAP_TOKEN_ENV_VAR
    try:
        token = resolve_token(raw, {})
    except InvalidBearerToken as exc:
        raise SettingsError(str(exc).replace("--token", source)) from None
    if token is None:
        raise SettingsError(f"Invalid {source}: empty")
    if len(token) < MIN_BOOTSTRAP_TOKEN_CHARS:
        raise SettingsError(
            f"Invalid {source}: shorter than {MIN_BOOTSTRAP_TOKEN_CHARS} characters"
        )
    if ns.token is not None or env.get(TOKEN_ENV_VAR, "").strip():
        raise SettingsError(
            f"{source} cannot be combined with --token or {TOKEN_ENV_VAR}: "
            "POST /daemon/bind installs the tenant's token"
        )
    return token, flag is not None


def _token_header(raw: str | None) -> str | None:
    """``--token-header``: an HTTP field name (RFC 9110 token), stored in lower case."""
    if raw is None:
        return None
    name = raw.strip().lower()
    if not name or any(ch not in _TCHAR for ch in name):
        raise SettingsError(f'Invalid --token-header "{raw}": not an HTTP header name')
    if name in _RESERVED_TOKEN_HEADERS or name.startswith(
        ("x-sandbox-", "sec-", "access-control-")
    ):
        raise SettingsError(f'Invalid --token-header "{raw}": a reserved header name')
    return name


def _int(
    flag: str,
    raw: str,
    *,
    minimum: int,
    maximum: int | None = None,
    what: str | None = None,
    unit: str | None = None,
) -> int:
    """``raw`` as an integer in [``minimum``, ``maximum``]; the refusal says ``what`` it must
    be, by default "an integer in [min, max]" (and `` (unit)``)."""
    if what is None:
        what = f"an integer in [{minimum}, {maximum}]" + (f" ({unit})" if unit else "")
    text = raw.strip()
    try:
        value = int(text, 10)
    except ValueError:
        raise SettingsError(f'Invalid {flag} "{raw}": must be {what}') from None
    if value < minimum or (maximum is not None and value > maximum):
        raise SettingsError(f'Invalid {flag} "{raw}": must be {what}')
    return value


def _choice(flag: str, raw: str, choices: tuple[str, ...]) -> str:
    value = raw.strip().lower()
    if value not in choices:
        raise SettingsError(f'Invalid {flag} "{raw}": must be one of {"|".join(choices)}')
    return value


def _cost_budget(raw: str) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if not (0 <= value <= 1e12):  # also rejects nan
        raise SettingsError(
            f'Invalid --session-cost-budget "{raw}": must be a number in [0, 1e12] (0 = no limit)'
        )
    return value


def _currency(raw: str) -> str:
    if not (isinstance(raw, str) and len(raw) == 3 and raw.isascii() and raw.isalpha()):
        raise SettingsError(
            f'Invalid --session-budget-currency "{raw}": must be an ISO 4217 code such as USD'
        )
    return raw.upper()


def _nonneg(flag: str, raw: str, maximum: int | None = None) -> int:
    return _int(flag, raw, minimum=0, maximum=maximum, what="a non-negative integer")


def _positive(flag: str, raw: str, maximum: int | None = None) -> int:
    return _int(flag, raw, minimum=1, maximum=maximum, what="a positive integer")


def _timer(flag: str, raw: str, *, positive: bool) -> int:
    value = _positive(flag, raw) if positive else _nonneg(flag, raw)
    if value > MAX_TIMER_MS:
        raise SettingsError(f'Invalid {flag} "{raw}": must be at most {MAX_TIMER_MS} ms')
    return value


def _env_ms(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw.strip(), 10)
    except ValueError:
        value = 0
    if value <= 0 or value > MAX_TIMER_MS:
        raise SettingsError(f'Invalid {name}="{raw}": must be a positive integer (milliseconds).')
    return value


def _trusted_proxies(values: list[str]) -> tuple[str, ...]:
    """``--trusted-proxy`` values, each an IP address or a CIDR network (normalised)."""
    out = []
    for value in values:
        try:
            out.append(str(ipaddress.ip_network(value.strip(), strict=False)))
        except ValueError:
            raise SettingsError(
                f'Invalid --trusted-proxy "{value}": must be an IP address or a CIDR network'
            ) from None
    return tuple(out)


def _canonical_dir(flag: str, raw: str) -> str:
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    if not path.exists():
        raise SettingsError(f'Invalid {flag} "{raw}": directory does not exist')
    if not path.is_dir():
        raise SettingsError(f'Invalid {flag} "{raw}": not a directory')
    return str(path.resolve())


def parse_settings(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """Parse and validate; raises :class:`SettingsError` naming the bad value."""
    env = os.environ if env is None else env
    ns = build_parser().parse_args(argv)

    hostname = ns.hostname
    if not hostname.strip():
        raise SettingsError(
            "Invalid --hostname: empty value binds every interface; pass an explicit address"
        )
    hostname = hostname.strip()
    if hostname.count(":") == 1 and not hostname.startswith("["):
        raise SettingsError(
            f'Invalid --hostname "{hostname}": looks like a "host:port" combination; '
            "pass the port with --port"
        )
    port = _int("--port", ns.port, minimum=0, maximum=65535)

    # Token: flag wins over env; trimmed; empty = none; generated on a non-loopback bind
    # when neither source is present (§2.3). A bootstrap token (late binding) stands in
    # for it until POST /daemon/bind installs the tenant's.
    bootstrap, bootstrap_from_argv = _bootstrap_token(ns, env)
    try:
        resolution = (
            TokenResolution(token=bootstrap, source="bootstrap", argv_warning=bootstrap_from_argv)
            if bootstrap is not None
            else resolve_startup_token(ns.token, env, loopback_bind=is_loopback_hostname(hostname))
        )
    except InvalidBearerToken as exc:
        raise SettingsError(str(exc)) from None
    token = resolution.token
    token_from_argv = resolution.argv_warning
    generated = resolution.generated
    token_header = _token_header(ns.token_header)
    if token_header is not None and token is None:
        raise SettingsError("--token-header needs a token (--token or QWEN_SERVER_TOKEN)")
    if token is None and not is_loopback_hostname(hostname):
        raise SettingsError(
            f"Refusing to bind {hostname}:{port} without a bearer token "
            "(an empty token was given); set QWEN_SERVER_TOKEN or pass --token"
        )
    if ns.require_auth and token is None:
        raise SettingsError(
            "Refusing to start with --require-auth set but no bearer token configured; "
            "set QWEN_SERVER_TOKEN or pass --token"
        )

    workspaces = tuple(_canonical_dir("--workspace", w) for w in (ns.workspace or [os.getcwd()]))
    untrusted = tuple(
        _canonical_dir("--untrusted-workspace", w) for w in ns.untrusted_workspace or []
    )
    seen: set[str] = set()
    for w in workspaces + untrusted:
        if w in seen:
            raise SettingsError(f'Invalid --workspace "{w}": given more than once')
        seen.add(w)

    if ns.agent is None:
        agent_argv = default_agent_argv()
    else:
        try:
            agent_argv = tuple(shlex.split(ns.agent))
        except ValueError as exc:
            raise SettingsError(f'Invalid --agent "{ns.agent}": {exc}') from None
        if not agent_argv:
            raise SettingsError('Invalid --agent "": empty command')

    state_dir = ns.state_dir or env.get("ACP_SERVE_STATE_DIR") or default_state_dir(env)
    state_dir = str(Path(state_dir).expanduser().absolute())
    agent_sandbox = _agent_sandbox(ns.agent_sandbox or env.get("ACP_SERVE_AGENT_SANDBOX") or "auto")
    if ns.config is not None and not Path(ns.config).is_file():
        raise SettingsError(f'Invalid --config "{ns.config}": file does not exist')

    max_sessions = _nonneg("--max-sessions", ns.max_sessions)
    max_total = (
        _nonneg("--max-total-sessions", ns.max_total_sessions)
        if ns.max_total_sessions is not None
        else None
    )
    max_pending = _nonneg("--max-pending-prompts-per-session", ns.max_pending_prompts_per_session)
    max_connections = _nonneg("--max-connections", ns.max_connections)
    ring = _int("--event-ring-size", ns.event_ring_size, minimum=1, maximum=1_000_000)
    ring_bytes = _int(
        "--event-ring-bytes",
        ns.event_ring_bytes,
        minimum=65_536,
        maximum=2**31,
        what="an integer in [65536, 2147483648] (bytes)",
    )
    line_bytes = _int(
        "--max-agent-line-bytes",
        ns.max_agent_line_bytes,
        minimum=4096,
        maximum=64 * MIB,
        what="an integer in [4096, 67108864] (bytes)",
    )
    if ring_bytes < line_bytes:
        raise SettingsError(
            f'Invalid --event-ring-bytes "{ns.event_ring_bytes}": must be at least '
            f"--max-agent-line-bytes ({line_bytes}), or one agent update could not be kept"
        )
    journal_retention = _timer("--journal-retention-ms", ns.journal_retention_ms, positive=False)
    journal_total = _int(
        "--journal-max-total-bytes",
        ns.journal_max_total_bytes,
        minimum=0,
        maximum=2**50,
        what="0 or a number of bytes up to 2**50",
    )
    if 0 < journal_total < 16 * MIB:
        raise SettingsError(
            f'Invalid --journal-max-total-bytes "{ns.journal_max_total_bytes}": '
            "must be 0 (off) or at least 16777216 (one session's journal)"
        )

    origins: list[str] = []
    for pattern in ns.allow_origin or []:
        try:
            origins.append(parse_allow_origin(pattern))
        except InvalidAllowOriginPattern as exc:
            raise SettingsError(str(exc)) from None
    problem = allow_origin_problem(origins, has_token=token is not None)
    if problem is not None:
        raise SettingsError(problem)

    if (ns.tls_cert is None) != (ns.tls_key is None):
        raise SettingsError("--tls-cert and --tls-key must be given together")
    for flag, value in (("--tls-cert", ns.tls_cert), ("--tls-key", ns.tls_key)):
        if value is not None and not Path(value).is_file():
            raise SettingsError(f'Invalid {flag} "{value}": file does not exist')

    budget = (
        _positive("--mcp-client-budget", ns.mcp_client_budget) if ns.mcp_client_budget else None
    )
    if ns.mcp_client_budget is not None and ns.mcp_client_budget.strip() == "":
        raise SettingsError('Invalid --mcp-client-budget "": must be a positive integer')
    mode = ns.mcp_budget_mode if ns.mcp_budget_mode is not None else ("warn" if budget else "off")
    if mode not in ("enforce", "warn", "off"):
        raise SettingsError(
            f'Invalid --mcp-budget-mode "{mode}": must be one of enforce, warn, off'
        )
    if mode == "enforce" and budget is None:
        raise SettingsError("--mcp-budget-mode=enforce requires --mcp-client-budget")

    prompt_deadline = (
        _timer("--prompt-deadline-ms", ns.prompt_deadline_ms, positive=True)
        if ns.prompt_deadline_ms is not None
        else _env_ms(env, "QWEN_SERVE_PROMPT_DEADLINE_MS")
    )
    writer_idle = (
        _timer("--writer-idle-timeout-ms", ns.writer_idle_timeout_ms, positive=True)
        if ns.writer_idle_timeout_ms is not None
        else _env_ms(env, "QWEN_SERVE_WRITER_IDLE_TIMEOUT_MS") or DEFAULT_WRITER_IDLE_TIMEOUT_MS
    )
    init_timeout = (
        _timer("--initialize-timeout-ms", ns.initialize_timeout_ms, positive=True)
        if ns.initialize_timeout_ms is not None
        else 10_000
    )
    restore_timeout = (
        _timer("--session-restore-timeout-ms", ns.session_restore_timeout_ms, positive=True)
        if ns.session_restore_timeout_ms is not None
        else max(60_000, init_timeout)
    )
    permission_timeout = (
        _timer(
            "--permission-response-timeout-ms", ns.permission_response_timeout_ms, positive=False
        )
        if ns.permission_response_timeout_ms is not None
        else 300_000
    )

    prompt_response = ns.prompt_response
    flag = "--prompt-response"
    if prompt_response is None and env.get("ACP_SERVE_PROMPT_RESPONSE"):
        prompt_response, flag = env["ACP_SERVE_PROMPT_RESPONSE"], "ACP_SERVE_PROMPT_RESPONSE"
    prompt_response = (prompt_response or "blocking").strip()
    if prompt_response not in ("blocking", "async"):
        raise SettingsError(f'Invalid {flag} "{prompt_response}": must be one of blocking, async')

    scope = ns.memory_project_scope
    if scope not in ("workspace", "git-root"):
        raise SettingsError(
            f'Invalid --memory-project-scope "{scope}": must be one of workspace, git-root'
        )
    log_format = ns.log_format
    if log_format not in ("text", "json"):
        raise SettingsError(f'Invalid --log-format "{log_format}": must be one of text, json')
    memory_file = ns.memory_file_name
    if not memory_file or "/" in memory_file or memory_file in (".", ".."):
        raise SettingsError(f'Invalid --memory-file-name "{memory_file}": must be a file name')

    try:
        chaos_rate = float(ns.chaos_kill_rate)
    except ValueError:
        chaos_rate = -1.0
    if not 0 <= chaos_rate <= 6000 or chaos_rate != chaos_rate:
        raise SettingsError(
            f'Invalid --chaos-kill-rate "{ns.chaos_kill_rate}": must be a number in [0, 6000]'
        )

    rate = _rate_limit(ns, env)
    inert = tuple(
        flag
        for flag in INERT_FLAGS
        if getattr(ns, flag.lstrip("-").replace("-", "_"), None) not in (None, False, [])
    ) + tuple(
        # Validated like the reference, but meaningless here: each session has its own
        # agent child (nothing to keep warm), and the memory file is per workspace.
        flag
        for flag, value, default in (
            ("--channel-idle-timeout-ms", ns.channel_idle_timeout_ms, "0"),
            ("--memory-project-scope", ns.memory_project_scope, "workspace"),
        )
        if value != default
    )

    return Settings(
        hostname=hostname,
        port=port,
        token=token,
        token_from_argv=token_from_argv,
        token_generated=generated,
        bootstrap=bootstrap is not None,
        token_header=token_header,
        require_auth=ns.require_auth,
        workspaces=workspaces,
        untrusted_workspaces=untrusted,
        agent_argv=agent_argv,
        agent_is_default=ns.agent is None,
        state_dir=state_dir,
        agent_sandbox=agent_sandbox,
        config_file=ns.config,
        journal=not ns.no_journal,
        max_sessions=max_sessions,
        max_total_sessions=max_total,
        max_pending_prompts_per_session=max_pending,
        max_connections=max_connections,
        event_ring_size=ring,
        event_ring_bytes=ring_bytes,
        max_agent_line_bytes=line_bytes,
        journal_retention_ms=journal_retention,
        journal_max_total_bytes=journal_total,
        allow_origins=tuple(origins),
        trusted_proxies=_trusted_proxies(ns.trusted_proxy or []),
        enable_session_shell=ns.enable_session_shell,
        tls_cert=ns.tls_cert,
        tls_key=ns.tls_key,
        mcp_client_budget=budget,
        mcp_budget_mode=mode,
        prompt_deadline_ms=prompt_deadline,
        prompt_response=prompt_response,
        writer_idle_timeout_ms=writer_idle,
        channel_idle_timeout_ms=_timer(
            "--channel-idle-timeout-ms", ns.channel_idle_timeout_ms, positive=False
        ),
        initialize_timeout_ms=init_timeout,
        session_restore_timeout_ms=restore_timeout,
        session_reap_interval_ms=_timer(
            "--session-reap-interval-ms", ns.session_reap_interval_ms, positive=False
        ),
        session_idle_timeout_ms=_timer(
            "--session-idle-timeout-ms", ns.session_idle_timeout_ms, positive=False
        ),
        client_idle_timeout_ms=_timer(
            "--client-idle-timeout-ms", ns.client_idle_timeout_ms, positive=False
        ),
        session_prompt_settled_close_grace_ms=_timer(
            "--session-prompt-settled-close-grace-ms",
            ns.session_prompt_settled_close_grace_ms,
            positive=False,
        ),
        cancel_grace_ms=_timer("--cancel-grace-ms", ns.cancel_grace_ms, positive=False),
        turn_settle_ms=_int(
            "--turn-settle-ms", ns.turn_settle_ms, minimum=10, maximum=60_000, what="an integer"
        ),
        session_token_budget=_int(
            "--session-token-budget",
            ns.session_token_budget,
            minimum=0,
            maximum=2**53,
            what="an integer in [0, 2**53] (0 = no limit)",
        ),
        session_cost_budget=_cost_budget(ns.session_cost_budget),
        session_budget_currency=_currency(ns.session_budget_currency),
        permission_response_timeout_ms=permission_timeout,
        drain_timeout_ms=_timer("--drain-timeout-ms", ns.drain_timeout_ms, positive=False),
        max_body_bytes=_positive("--max-body-bytes", ns.max_body_bytes, maximum=MAX_BODY_BYTES),
        http_graceful_timeout_ms=_timer(
            "--http-graceful-timeout-ms", ns.http_graceful_timeout_ms, positive=False
        ),
        http_keep_alive_timeout_ms=_timer(
            "--http-keep-alive-timeout-ms", ns.http_keep_alive_timeout_ms, positive=True
        ),
        rate_limit=rate,
        memory_project_scope=scope,
        memory_file_name=memory_file,
        log_format=log_format,
        chaos_kill_rate=chaos_rate,
        public_probes=ns.public_probes,
        access_log=ns.access_log,
        device_flow_providers=tuple(_device_flow_providers(ns.device_flow_provider or [])),
        warm_agents=_int("--warm-agents", ns.warm_agents, minimum=0, maximum=64),
        warm_agents_max=_int("--warm-agents-max", ns.warm_agents_max, minimum=0, maximum=64),
        sessions_per_agent=_int(
            "--sessions-per-agent", ns.sessions_per_agent, minimum=1, maximum=1024
        ),
        agent_idle_release_ms=_timer(
            "--agent-idle-release-ms", ns.agent_idle_release_ms, positive=False
        ),
        agent_memory_budget_mb=_int(
            "--agent-memory-budget-mb",
            ns.agent_memory_budget_mb,
            minimum=0,
            maximum=1 << 20,
            unit="MiB",
        ),
        agent_compile_cache_mb=_int(
            "--agent-compile-cache-mb",
            ns.agent_compile_cache_mb,
            minimum=0,
            maximum=1 << 16,
            unit="MiB",
        ),
        agent_limits=_choice(
            "--agent-limits", ns.agent_limits, ("auto", "cgroup", "watchdog", "off")
        ),
        agent_memory_max_mb=None
        if ns.agent_memory_max_mb is None
        else _int(
            "--agent-memory-max-mb",
            ns.agent_memory_max_mb,
            minimum=0,
            maximum=1 << 22,
            unit="MiB",
        ),
        agent_pids_max=_int("--agent-pids-max", ns.agent_pids_max, minimum=0, maximum=4_194_304),
        agent_cpu_weight=_int(
            "--agent-cpu-weight",
            ns.agent_cpu_weight,
            minimum=0,
            maximum=10_000,
            what="an integer in [0, 10000] (0 = none)",
        ),
        agent_memory_headroom_mb=_int(
            "--agent-memory-headroom-mb",
            ns.agent_memory_headroom_mb,
            minimum=0,
            maximum=1 << 20,
            unit="MiB",
        ),
        inert_flags=inert,
    )


def _agent_sandbox(mode: str) -> str:
    if mode not in ("auto", "landlock", "off"):
        raise SettingsError(f'Invalid --agent-sandbox "{mode}": must be one of auto, landlock, off')
    if mode == "landlock":
        if landlock.abi_version() < 1:
            raise SettingsError(
                "--agent-sandbox=landlock: this kernel has no Landlock (Linux 5.13+ with "
                "landlock in CONFIG_LSM / lsm=); use auto or off"
            )
    return mode


def _device_flow_providers(values: Sequence[str]) -> list[str]:
    for value in values:
        name, sep, url = value.partition("=")
        if not sep or not name.strip() or not url.startswith(("http://", "https://")):
            raise SettingsError(
                f'Invalid --device-flow-provider "{value}": expected NAME=http(s)://URL'
            )
    return list(values)


def _rate_limit(ns: argparse.Namespace, env: Mapping[str, str]) -> RateLimitSettings:
    enabled = bool(ns.rate_limit) or env.get("QWEN_SERVE_RATE_LIMIT", "").lower() in ("1", "true")

    def tier(flag: str, value: str | None, env_name: str, default: int) -> int:
        if value is not None:
            return _positive(flag, value)
        raw = env.get(env_name)
        if raw:
            return _int(env_name, raw, minimum=1, what="a positive integer")
        return default

    window = tier(
        "--rate-limit-window-ms", ns.rate_limit_window_ms, "QWEN_SERVE_RATE_LIMIT_WINDOW_MS", 60_000
    )
    if window < 1000:
        raise SettingsError(f'Invalid --rate-limit-window-ms "{window}": must be >= 1000')
    return RateLimitSettings(
        enabled=enabled,
        prompt=tier(
            "--rate-limit-prompt", ns.rate_limit_prompt, "QWEN_SERVE_RATE_LIMIT_PROMPT", 10
        ),
        mutation=tier(
            "--rate-limit-mutation", ns.rate_limit_mutation, "QWEN_SERVE_RATE_LIMIT_MUTATION", 30
        ),
        read=tier("--rate-limit-read", ns.rate_limit_read, "QWEN_SERVE_RATE_LIMIT_READ", 120),
        window_ms=window,
    )
