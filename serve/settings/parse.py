"""Command line and environment → one frozen :class:`~serve.settings.record.Settings`.

:func:`parse_settings` reads the flag table (:mod:`serve.settings.flags`), validates each
value (:mod:`serve.settings.values`) and the combinations (a token for a non-loopback bind,
``--tls-cert`` with ``--tls-key``, ...), and names the inert flags used. The first bad
value raises :class:`~serve.settings.record.SettingsError`.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from serve.origins import InvalidAllowOriginPattern, allow_origin_problem, parse_allow_origin
from serve.settings.flags import INERT_FLAGS, build_parser, default_agent_argv, default_state_dir
from serve.settings.multi_user import parse_auth
from serve.settings.record import (
    DEFAULT_PORT,
    DEFAULT_WRITER_IDLE_TIMEOUT_MS,
    MAX_BODY_BYTES,
    MIB,
    Settings,
    SettingsError,
    is_loopback_hostname,
)
from serve.settings.values import (
    PID_NAMESPACE_MODES,
    canonical_dir,
    check_uid_range,
    env_ms,
    parse_agent_sandbox,
    parse_allow_write,
    parse_bootstrap_token,
    parse_choice,
    parse_cost_budget,
    parse_currency,
    parse_device_flow_providers,
    parse_int,
    parse_nonneg,
    parse_positive,
    parse_rate_limit,
    parse_shared_dir,
    parse_timer,
    parse_token_header,
    parse_trusted_proxies,
    parse_uid_range,
)
from serve.tokens import (
    InvalidBearerToken,
    TokenResolution,
    read_token_file,
    resolve_startup_token,
)
from serve.webhooks.targets import parse_allow as parse_webhook_allow


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
    port = parse_int(
        "--port", ns.port if ns.port is not None else str(DEFAULT_PORT), minimum=0, maximum=65535
    )

    # Token: flag wins over env; trimmed; empty = none; generated on a non-loopback bind
    # when neither source is present (§2.3). A bootstrap token (late binding) stands in
    # for it until POST /daemon/bind installs the tenant's.
    # --token-file: the token read from a file (never in the process list or environ).
    token_file, flag_token = None, ns.token
    if ns.token_file is not None:
        if ns.token is not None:
            raise SettingsError("give --token or --token-file, not both")
        token_file = os.path.abspath(ns.token_file)
        try:
            flag_token = read_token_file(token_file)
        except (OSError, ValueError) as exc:
            raise SettingsError(f"Invalid --token-file: {exc}") from None
    bootstrap, bootstrap_from_argv = parse_bootstrap_token(ns, env)
    if bootstrap is not None and token_file is not None:
        raise SettingsError("--bootstrap-token cannot be combined with --token-file")
    try:
        resolution = (
            TokenResolution(token=bootstrap, source="bootstrap", argv_warning=bootstrap_from_argv)
            if bootstrap is not None
            else resolve_startup_token(
                flag_token, env, loopback_bind=is_loopback_hostname(hostname)
            )
        )
    except InvalidBearerToken as exc:
        msg = str(exc)
        raise SettingsError(msg.replace("--token", "--token-file") if token_file else msg) from None
    token = resolution.token
    token_from_argv = resolution.argv_warning and token_file is None
    generated = resolution.generated
    token_header = parse_token_header(ns.token_header)
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

    workspaces = tuple(canonical_dir("--workspace", w) for w in (ns.workspace or [os.getcwd()]))
    untrusted = tuple(
        canonical_dir("--untrusted-workspace", w) for w in ns.untrusted_workspace or []
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
    # --shared-dir: the agents' places shared by a cluster's daemons (serve/isolation/tenants.py).
    shared_dir = parse_shared_dir(
        ns.shared_dir or env.get("ACP_SERVE_SHARED_DIR") or None,
        state_dir=state_dir,
        workspaces=(*workspaces, *untrusted),
    )
    agent_sandbox = parse_agent_sandbox(
        ns.agent_sandbox or env.get("ACP_SERVE_AGENT_SANDBOX") or "auto"
    )
    if ns.config is not None and not Path(ns.config).is_file():
        raise SettingsError(f'Invalid --config "{ns.config}": file does not exist')
    allow_write = parse_allow_write(
        "--agent-allow-write",
        ns.agent_allow_write or [],
        state_dir=state_dir,
        workspaces=(*workspaces, *untrusted),
        config_file=ns.config,
        shared_dir=shared_dir,
    )
    webhook_allow = tuple(ns.webhook_allow or ())
    try:
        parse_webhook_allow(webhook_allow)
    except ValueError as exc:
        raise SettingsError(f"Invalid {exc}") from None

    max_sessions = parse_nonneg("--max-sessions", ns.max_sessions)
    max_total = (
        parse_nonneg("--max-total-sessions", ns.max_total_sessions)
        if ns.max_total_sessions is not None
        else None
    )
    max_pending = parse_nonneg(
        "--max-pending-prompts-per-session", ns.max_pending_prompts_per_session
    )
    max_connections = parse_nonneg("--max-connections", ns.max_connections)
    ring = parse_int("--event-ring-size", ns.event_ring_size, minimum=1, maximum=1_000_000)
    ring_bytes = parse_int(
        "--event-ring-bytes",
        ns.event_ring_bytes,
        minimum=65_536,
        maximum=2**31,
        what="an integer in [65536, 2147483648] (bytes)",
    )
    line_bytes = parse_int(
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
    journal_retention = parse_timer(
        "--journal-retention-ms", ns.journal_retention_ms, positive=False
    )
    journal_total = parse_int(
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

    journal_url = parse_journal_url(ns.journal_url, ns.no_journal)
    advertise_url = parse_advertise_url(ns.advertise_url, journal_url)
    journal_lease = parse_int(
        "--journal-lease-ms", ns.journal_lease_ms, minimum=2000, maximum=600_000, unit="ms"
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
        parse_positive("--mcp-client-budget", ns.mcp_client_budget)
        if ns.mcp_client_budget
        else None
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
        parse_timer("--prompt-deadline-ms", ns.prompt_deadline_ms, positive=True)
        if ns.prompt_deadline_ms is not None
        else env_ms(env, "QWEN_SERVE_PROMPT_DEADLINE_MS")
    )
    writer_idle = (
        parse_timer("--writer-idle-timeout-ms", ns.writer_idle_timeout_ms, positive=True)
        if ns.writer_idle_timeout_ms is not None
        else env_ms(env, "QWEN_SERVE_WRITER_IDLE_TIMEOUT_MS") or DEFAULT_WRITER_IDLE_TIMEOUT_MS
    )
    init_timeout = (
        parse_timer("--initialize-timeout-ms", ns.initialize_timeout_ms, positive=True)
        if ns.initialize_timeout_ms is not None
        else 10_000
    )
    restore_timeout = (
        parse_timer("--session-restore-timeout-ms", ns.session_restore_timeout_ms, positive=True)
        if ns.session_restore_timeout_ms is not None
        else max(60_000, init_timeout)
    )
    permission_timeout = (
        parse_timer(
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

    rate = parse_rate_limit(ns, env)
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

    auth = parse_auth(ns, env, token=token, state_dir=state_dir)
    pid_namespace = ns.agent_pid_namespace or env.get("ACP_SERVE_AGENT_PID_NAMESPACE") or "auto"
    if pid_namespace not in PID_NAMESPACE_MODES:
        raise SettingsError(
            f'Invalid --agent-pid-namespace "{pid_namespace}": must be one of auto, on, off'
        )
    raw_range = ns.agent_uid_range or env.get("ACP_SERVE_AGENT_UID_RANGE") or "auto"
    try:
        uid_range = check_uid_range(
            parse_uid_range(raw_range), multi_user=auth.configured, argv=agent_argv
        )
    except ValueError as exc:
        raise SettingsError(f'Invalid --agent-uid-range "{raw_range}": {exc}') from None
    return Settings(
        agent_pid_namespace=pid_namespace,
        agent_uid_range=uid_range,
        auth=auth,
        hostname=hostname,
        port=port,
        approval_mode=_approval_mode(ns.approval_mode),
        port_explicit=ns.port is not None,
        token=token,
        token_from_argv=token_from_argv,
        token_file=token_file,
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
        agent_allow_write=allow_write,
        webhook_allow=webhook_allow,
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
        journal_url=journal_url,
        advertise_url=advertise_url,
        journal_lease_ms=journal_lease,
        shared_dir=shared_dir,
        allow_origins=tuple(origins),
        trusted_proxies=parse_trusted_proxies(ns.trusted_proxy or []),
        enable_session_shell=ns.enable_session_shell,
        tls_cert=ns.tls_cert,
        tls_key=ns.tls_key,
        mcp_client_budget=budget,
        mcp_budget_mode=mode,
        prompt_deadline_ms=prompt_deadline,
        prompt_response=prompt_response,
        writer_idle_timeout_ms=writer_idle,
        channel_idle_timeout_ms=parse_timer(
            "--channel-idle-timeout-ms", ns.channel_idle_timeout_ms, positive=False
        ),
        initialize_timeout_ms=init_timeout,
        session_restore_timeout_ms=restore_timeout,
        session_reap_interval_ms=parse_timer(
            "--session-reap-interval-ms", ns.session_reap_interval_ms, positive=False
        ),
        session_idle_timeout_ms=parse_timer(
            "--session-idle-timeout-ms", ns.session_idle_timeout_ms, positive=False
        ),
        client_idle_timeout_ms=parse_timer(
            "--client-idle-timeout-ms", ns.client_idle_timeout_ms, positive=False
        ),
        session_prompt_settled_close_grace_ms=parse_timer(
            "--session-prompt-settled-close-grace-ms",
            ns.session_prompt_settled_close_grace_ms,
            positive=False,
        ),
        cancel_grace_ms=parse_timer("--cancel-grace-ms", ns.cancel_grace_ms, positive=False),
        turn_settle_ms=parse_int(
            "--turn-settle-ms", ns.turn_settle_ms, minimum=10, maximum=60_000, what="an integer"
        ),
        session_token_budget=parse_int(
            "--session-token-budget",
            ns.session_token_budget,
            minimum=0,
            maximum=2**53,
            what="an integer in [0, 2**53] (0 = no limit)",
        ),
        session_cost_budget=parse_cost_budget(ns.session_cost_budget),
        session_budget_currency=parse_currency(ns.session_budget_currency),
        permission_response_timeout_ms=permission_timeout,
        drain_timeout_ms=parse_timer("--drain-timeout-ms", ns.drain_timeout_ms, positive=False),
        max_body_bytes=parse_positive(
            "--max-body-bytes", ns.max_body_bytes, maximum=MAX_BODY_BYTES
        ),
        http_graceful_timeout_ms=parse_timer(
            "--http-graceful-timeout-ms", ns.http_graceful_timeout_ms, positive=False
        ),
        http_keep_alive_timeout_ms=parse_timer(
            "--http-keep-alive-timeout-ms", ns.http_keep_alive_timeout_ms, positive=True
        ),
        rate_limit=rate,
        memory_project_scope=scope,
        memory_file_name=memory_file,
        log_format=log_format,
        chaos_kill_rate=chaos_rate,
        public_probes=ns.public_probes,
        access_log=ns.access_log,
        otel_endpoint=parse_otel_endpoint(ns.otel_endpoint),
        device_flow_providers=tuple(parse_device_flow_providers(ns.device_flow_provider or [])),
        warm_agents=parse_int("--warm-agents", ns.warm_agents, minimum=0, maximum=64),
        warm_agents_max=parse_int("--warm-agents-max", ns.warm_agents_max, minimum=0, maximum=64),
        sessions_per_agent=parse_int(
            "--sessions-per-agent", ns.sessions_per_agent, minimum=1, maximum=1024
        ),
        packed_spare=ns.packed_spare,
        agent_idle_release_ms=parse_timer(
            "--agent-idle-release-ms", ns.agent_idle_release_ms, positive=False
        ),
        agent_memory_budget_mb=parse_int(
            "--agent-memory-budget-mb",
            ns.agent_memory_budget_mb,
            minimum=0,
            maximum=1 << 20,
            unit="MiB",
        ),
        agent_compile_cache_mb=parse_int(
            "--agent-compile-cache-mb",
            ns.agent_compile_cache_mb,
            minimum=0,
            maximum=1 << 16,
            unit="MiB",
        ),
        agent_limits=parse_choice(
            "--agent-limits", ns.agent_limits, ("auto", "cgroup", "watchdog", "off")
        ),
        agent_memory_max_mb=None
        if ns.agent_memory_max_mb is None
        else parse_int(
            "--agent-memory-max-mb",
            ns.agent_memory_max_mb,
            minimum=0,
            maximum=1 << 22,
            unit="MiB",
        ),
        agent_pids_max=parse_int(
            "--agent-pids-max", ns.agent_pids_max, minimum=0, maximum=4_194_304
        ),
        agent_cpu_weight=parse_int(
            "--agent-cpu-weight",
            ns.agent_cpu_weight,
            minimum=0,
            maximum=10_000,
            what="an integer in [0, 10000] (0 = none)",
        ),
        agent_memory_headroom_mb=parse_int(
            "--agent-memory-headroom-mb",
            ns.agent_memory_headroom_mb,
            minimum=0,
            maximum=1 << 20,
            unit="MiB",
        ),
        inert_flags=inert,
    )


def _approval_mode(raw: str | None) -> str | None:
    if raw is None:
        return None
    mode = raw.strip()
    if not mode or any(c.isspace() for c in mode):
        raise SettingsError(f'Invalid --approval-mode "{raw}": give one mode id, e.g. default')
    return mode


def parse_otel_endpoint(value: str | None) -> str | None:
    """``--otel-endpoint``: an http(s) URL (the OTLP/HTTP traces endpoint, path included)."""
    if value is None:
        return None
    url = value.strip()
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in ("http", "https") or not rest or rest.startswith("/"):
        raise SettingsError(f"--otel-endpoint must be an http(s) URL, got {value!r}")
    return url


def parse_advertise_url(value: str | None, journal_url: str | None) -> str | None:
    """``--advertise-url``: an http(s) URL with a host, only with ``--journal-url`` (the
    other daemons of the shared journal forward requests there)."""
    if value is None:
        return None
    url = value.strip().rstrip("/")
    scheme, _, rest = url.partition("://")
    host = rest.split("/", 1)[0]
    if scheme.lower() not in ("http", "https") or not host or "/" in rest:
        raise SettingsError(
            f"--advertise-url must be an http(s) URL with a host and no path "
            f"(http://10.0.0.7:4170), got {value!r}"
        )
    if journal_url is None:
        raise SettingsError("--advertise-url needs --journal-url (only a shared journal forwards)")
    return url


def parse_journal_url(value: str | None, no_journal: bool) -> str | None:
    """``--journal-url``: a ``postgresql://`` (or ``postgres://``) URL, not with
    ``--no-journal``."""
    if value is None:
        return None
    if not value.startswith(("postgresql://", "postgres://")):
        raise SettingsError(
            f'Invalid --journal-url "{value.split("@")[-1]}": must be a postgresql:// URL'
        )
    if no_journal:
        raise SettingsError("--journal-url and --no-journal contradict each other")
    return value
