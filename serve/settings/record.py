"""The daemon's settings: one frozen :class:`Settings` record, its defaults and units.

What every part of the daemon reads (``host.settings``); built once at start by
:func:`serve.settings.parse.parse_settings` from the command line and environment, never
changed afterwards. Bounds carry their unit in the name (``*_ms``, ``*_bytes``, ``*_mb``);
the defaults are those of ``qwen serve`` 0.24.4 unless the field says otherwise.
:class:`SettingsError` is the refusal of a bad value (``serve.__main__`` prints it and exits 1).
"""

from __future__ import annotations

import os

import msgspec

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


#: The JWT algorithms accepted by default and at all (no ``none``, no HMAC: keys are public).
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA")
DEFAULT_ALGORITHMS = ("RS256", "ES256")


#: ``--auth-max-token-age`` default: a day (seconds), the longest access token lifetime
#: common identity providers issue by default.
DEFAULT_MAX_TOKEN_AGE_S = 24 * 3600


class AuthSettings(msgspec.Struct, frozen=True, kw_only=True):
    jwks_url: str | None = None
    jwks_file: str | None = None
    issuer: str | None = None
    audience: str | None = None
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    groups_claim: str = "groups"
    #: No ``aud`` check (``--auth-allow-any-audience``): only when the operator says so.
    allow_any_audience: bool = False
    #: Longest JWT lifetime accepted, in seconds (``exp - iat`` and ``exp - now``).
    max_token_age_s: int = DEFAULT_MAX_TOKEN_AGE_S
    tokens_file: str | None = None
    #: Live sessions one principal may own (0: no limit; admins exempt).
    quota_sessions: int = 0
    #: Prompts one principal may send per sliding minute (0: no limit; admins exempt).
    quota_prompts_per_minute: int = 0
    #: Tokens / cost one principal's live sessions may have spent, summed (0: no limit).
    quota_token_budget: int = 0
    quota_cost_budget: float = 0.0
    #: The audit log file ("": none) and its size before rotation, in bytes.
    audit_log: str = ""
    audit_max_bytes: int = 10 * MIB

    @property
    def jwt(self) -> bool:
        return self.jwks_url is not None or self.jwks_file is not None

    @property
    def configured(self) -> bool:
        return self.jwt or self.tokens_file is not None

    def modes(self) -> tuple[str, ...]:
        return tuple(m for m, on in (("jwt", self.jwt), ("tokens", self.tokens_file)) if on)


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """The daemon's settings; bounds carry their unit in the name."""

    hostname: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    #: ``--port`` was given: a busy port stops start-up (only the default moves on to the
    #: next free port, so a second daemon never starts where the caller did not ask).
    port_explicit: bool = False
    token: str | None = None
    token_from_argv: bool = False
    #: ``--token-file``: where the token was read from (a file the agents never see).
    token_file: str | None = None
    token_generated: bool = False
    #: ``--bootstrap-token`` (late binding): ``token`` is a pool-scoped bootstrap token
    #: that only ``POST /daemon/bind`` accepts; the bind installs the tenant's token and
    #: revokes it (``serve.tenant_claim``). Until then only the probes and the bind are served.
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
    #: ``--approval-mode``: the mode a new session is put in when its agent offers it and
    #: the create asks for none (None: the agent's own). Not gated: the operator chose it.
    approval_mode: str | None = None
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
    #: --journal-url: the PostgreSQL journal's libpq URL (None: the files journal).
    journal_url: str | None = None
    #: --advertise-url: how the daemons sharing the journal reach this one (None: the URL
    #: it listens on).
    advertise_url: str | None = None
    #: --journal-lease-ms: a shared journal's session lease; renewed every quarter of it.
    journal_lease_ms: int = 20_000
    #: --shared-dir: where the agents' places live instead of the state directory (the
    #: principals' ``tenants/<name>/{home,scripted}``, the scripted agent's ``scripted``
    #: store), shared by all daemons of a cluster; canonical. None: under ``state_dir``.
    shared_dir: str | None = None
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
    #: OTLP/HTTP traces endpoint (``--otel-endpoint``; None: the OTEL_* variables decide).
    otel_endpoint: str | None = None
    device_flow_providers: tuple[str, ...] = ()
    #: Agent children kept spawned and initialized ahead of need, per workspace.
    warm_agents: int = 1
    #: The most warm children the adaptive pool keeps while sessions keep arriving
    #: (serve/agents/adaptive.py; at or below ``warm_agents``: a fixed pool).
    warm_agents_max: int = 4
    #: Sessions sharing one agent child (1: one child per session, full isolation).
    sessions_per_agent: int = 1
    #: Packed mode: spawn a spare child once every child is full (serve/agents/warm.py).
    packed_spare: bool = False
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
    #: Directories every agent child may write besides its workspace, temp and HOME
    #: (``--agent-allow-write``, ``sandbox.allowWrite``): absolute, canonical, validated.
    agent_allow_write: tuple[str, ...] = ()
    #: Agents in pid namespaces of their own: "auto" (where the kernel allows), "on"
    #: (required), "off" (serve/isolation/pidns.py).
    agent_pid_namespace: str = "auto"
    #: The uids of principals' agents, ``(START, COUNT)``; None = the daemon's own uid
    #: (serve/isolation/identity.py; ``auto`` is resolved at parse time).
    agent_uid_range: tuple[int, int] | None = None
    #: ``--webhook-allow``: receiver addresses, CIDRs, host names (serve/webhooks/targets.py).
    webhook_allow: tuple[str, ...] = ()
    inert_flags: tuple[str, ...] = ()
    #: Multi-user auth, quotas and audit (serve/settings/multi_user.py; off by default).
    auth: AuthSettings = AuthSettings()

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


def is_loopback_hostname(host: str) -> bool:
    """Loopback set of the reference: 127.0.0.0/8 dotted quads, localhost, ::1, [::1]."""
    h = host.strip().lower()
    if h in ("localhost", "::1", "[::1]"):
        return True
    parts = h.split(".")
    if len(parts) == 4 and all(p.isdigit() and 0 <= int(p) <= 255 for p in parts):
        return parts[0] == "127"
    return False
