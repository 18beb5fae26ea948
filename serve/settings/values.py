"""The validators of flag and environment values: each returns the parsed value or raises.

Every refusal is a :class:`~serve.settings.record.SettingsError` whose message names the
flag (or variable) and the bad value the way the reference does (qwen-serve-spec §2.4):
``Invalid --port "x": must be an integer in [0, 65535]``. Integer flags state their bounds
(and unit) once, in :func:`parse_int`; the token helpers check the bootstrap token and the
``--token-header`` field name. Pure (no I/O but :func:`canonical_dir`'s ``stat`` and the
Landlock probe of :func:`parse_agent_sandbox`).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shutil
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from acp import landlock
from serve.settings.record import (
    BOOTSTRAP_TOKEN_ENV_VAR,
    MAX_TIMER_MS,
    RateLimitSettings,
    SettingsError,
)
from serve.tokens import TOKEN_ENV_VAR, InvalidBearerToken, resolve_token

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


def parse_bootstrap_token(
    ns: argparse.Namespace, env: Mapping[str, str]
) -> tuple[str | None, bool]:
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


def parse_token_header(raw: str | None) -> str | None:
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


def parse_int(
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


def parse_choice(flag: str, raw: str, choices: tuple[str, ...]) -> str:
    value = raw.strip().lower()
    if value not in choices:
        raise SettingsError(f'Invalid {flag} "{raw}": must be one of {"|".join(choices)}')
    return value


def parse_cost_budget(raw: str) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if not (0 <= value <= 1e12):  # also rejects nan
        raise SettingsError(
            f'Invalid --session-cost-budget "{raw}": must be a number in [0, 1e12] (0 = no limit)'
        )
    return value


def parse_currency(raw: str) -> str:
    if not (isinstance(raw, str) and len(raw) == 3 and raw.isascii() and raw.isalpha()):
        raise SettingsError(
            f'Invalid --session-budget-currency "{raw}": must be an ISO 4217 code such as USD'
        )
    return raw.upper()


def parse_nonneg(flag: str, raw: str, maximum: int | None = None) -> int:
    return parse_int(flag, raw, minimum=0, maximum=maximum, what="a non-negative integer")


def parse_positive(flag: str, raw: str, maximum: int | None = None) -> int:
    return parse_int(flag, raw, minimum=1, maximum=maximum, what="a positive integer")


def parse_timer(flag: str, raw: str, *, positive: bool) -> int:
    value = parse_positive(flag, raw) if positive else parse_nonneg(flag, raw)
    if value > MAX_TIMER_MS:
        raise SettingsError(f'Invalid {flag} "{raw}": must be at most {MAX_TIMER_MS} ms')
    return value


def env_ms(env: Mapping[str, str], name: str) -> int | None:
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


def parse_trusted_proxies(values: list[str]) -> tuple[str, ...]:
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


def canonical_dir(flag: str, raw: str) -> str:
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    if not path.exists():
        raise SettingsError(f'Invalid {flag} "{raw}": directory does not exist')
    if not path.is_dir():
        raise SettingsError(f'Invalid {flag} "{raw}": not a directory')
    return str(path.resolve())


#: The uid range ``--agent-uid-range auto`` takes in multi-user mode as root: uids no
#: distribution allocates (below 2^31, beside the usual subordinate ranges from 100000).
AUTO_UID_RANGE: Final = (2_000_000_000, 100_000_000)
#: The smallest uid a range may start at (system and login users live below).
MIN_AGENT_UID: Final = 65536
#: uids are 32-bit; -1 (4294967295) means "no change" to the kernel.
MAX_AGENT_UID: Final = 2**32 - 2
PID_NAMESPACE_MODES: Final = ("auto", "on", "off")


def parse_uid_range(raw: str) -> tuple[int, int] | str | None:
    """``off`` -> None, ``auto`` -> ``"auto"``, ``START:COUNT`` -> the pair. Raises
    ValueError with the reason."""
    raw = raw.strip()
    if raw == "off":
        return None
    if raw == "auto":
        return "auto"
    start_s, sep, count_s = raw.partition(":")
    if not sep or not start_s.isdigit() or not count_s.isdigit():
        raise ValueError("must be off, auto or START:COUNT (two whole numbers)")
    start, count = int(start_s), int(count_s)
    if start < MIN_AGENT_UID:
        raise ValueError(f"START must be at least {MIN_AGENT_UID} (system and login users)")
    if count < 1 or start + count - 1 > MAX_AGENT_UID:
        raise ValueError(f"COUNT must be at least 1 and START+COUNT-1 at most {MAX_AGENT_UID}")
    return start, count


def check_uid_range(
    value: tuple[int, int] | str | None, *, multi_user: bool, argv: Sequence[str] = ()
) -> tuple[int, int] | None:
    """The range in force (``auto`` resolved: see the module docstring; ``auto`` is also off
    when the agent command ``argv`` is not runnable by another uid, e.g. an interpreter under
    a 0700 ``/root``: its agents could not start). Raises ValueError when a range is given
    to a daemon that is not root."""
    if value == "auto":
        if not (multi_user and os.geteuid() == 0):
            return None
        return AUTO_UID_RANGE if not argv or runnable_by_others(argv[0]) else None
    if value is None:
        return None
    assert not isinstance(value, str)
    if os.geteuid() != 0:
        raise ValueError("running agents under their own uids needs a daemon run as root")
    return value


def runnable_by_others(command: str) -> bool:
    """Whether ``command`` (found on ``PATH``; symlinks and a ``#!`` interpreter followed)
    is executable by a uid that is neither its owner nor in its group: every directory on
    the way searchable by others and the file executable by others."""
    found = shutil.which(command)
    if found is None:
        return False
    seen: set[str] = set()
    path = os.path.realpath(found)
    while path not in seen:
        seen.add(path)
        if not _others_may(path, stat.S_IXOTH):
            return False
        try:
            with open(path, "rb") as f:
                head = f.read(256)
        except OSError:
            return False
        if not head.startswith(b"#!"):
            return True
        words = head[2:].split(b"\n", 1)[0].split()
        if not words:
            return True
        interpreter = os.fsdecode(words[0])
        if os.path.basename(interpreter) == "env" and len(words) > 1:
            interpreter = shutil.which(os.fsdecode(words[1])) or ""
        if not interpreter:
            return False
        path = os.path.realpath(interpreter)
    return True


def _others_may(path: str, bit: int) -> bool:
    """``path`` has ``bit`` for others and each of its parent directories is searchable."""
    try:
        if not os.stat(path).st_mode & bit:
            return False
        parent = os.path.dirname(path)
        while True:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            if parent == os.path.dirname(parent):
                return True
            parent = os.path.dirname(parent)
    except OSError:
        return False


def parse_agent_sandbox(mode: str) -> str:
    if mode not in ("auto", "landlock", "off"):
        raise SettingsError(f'Invalid --agent-sandbox "{mode}": must be one of auto, landlock, off')
    if mode == "landlock":
        if landlock.abi_version() < 1:
            raise SettingsError(
                "--agent-sandbox=landlock: this kernel has no Landlock (Linux 5.13+ with "
                "landlock in CONFIG_LSM / lsm=); use auto or off"
            )
    return mode


def parse_allow_write(
    source: str,
    raws: Sequence[str],
    *,
    state_dir: str,
    workspaces: Sequence[str],
    config_file: str | None = None,
    shared_dir: str | None = None,
) -> tuple[str, ...]:
    """The agents' write grants (``source``: the flag or the config key naming them):
    each absolute and an existing directory, canonical (symlinks resolved), neither in the
    state directory (journals, credentials) nor the shared directory (every principal's
    places) nor the config file nor a workspace (a grant applies to every agent child: it
    would let one workspace's agents write another's). A grant *holding* one of those is
    fine: the sandbox carves them out of it."""
    out: list[str] = []
    state = os.path.realpath(state_dir)
    never = "which agents may never write"
    guarded = [(state, f"the state directory {state_dir} (journals, credentials), {never}")]
    if shared_dir:
        guarded.append(
            (
                os.path.realpath(shared_dir),
                f"the shared directory {shared_dir} (every principal's places), {never}",
            )
        )
    guarded += [
        (
            os.path.realpath(w),
            f"the workspace {w}: its own agents write it already, and a grant (for every "
            "agent) would let the other workspaces' agents write it",
        )
        for w in workspaces
    ]
    if config_file:
        guarded.append((os.path.realpath(config_file), f"the config file, {never}"))
    for raw in raws:
        if not isinstance(raw, str) or not raw:
            raise SettingsError(f'Invalid {source} "{raw}": expected a directory path')
        if not os.path.isabs(raw):
            raise SettingsError(f'Invalid {source} "{raw}": must be an absolute path')
        if not os.path.exists(raw):
            raise SettingsError(f'Invalid {source} "{raw}": directory does not exist')
        if not os.path.isdir(raw):
            raise SettingsError(f'Invalid {source} "{raw}": not a directory')
        real = os.path.realpath(raw)
        for place, what in guarded:
            if real == place or real.startswith(place.rstrip("/") + "/"):
                where = "is" if real == place else "is inside"
                raise SettingsError(f'Invalid {source} "{raw}": {where} {what}')
        if real not in out:
            out.append(real)
    return tuple(out)


#: Under ``--shared-dir``: the places the daemon makes there (serve/isolation/tenants.py).
SHARED_SUBDIRS: Final = ("tenants", "scripted")


def parse_shared_dir(raw: str | None, *, state_dir: str, workspaces: Sequence[str]) -> str | None:
    """``--shared-dir`` (or ``$ACP_SERVE_SHARED_DIR``): an existing directory the daemon can
    write, canonical; never made here (a missing mount must not become a local directory
    that no other daemon sees). Neither the state directory or inside it (each daemon's
    own), nor a workspace or inside one (its agents write it), nor holding the state
    directory in the places the daemon makes there. Blocking (a ``stat``, one probe file)."""
    if raw is None:
        return None
    flag = "--shared-dir"
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    if not path.exists():
        raise SettingsError(
            f'Invalid {flag} "{raw}": directory does not exist (mount the volume the '
            "cluster's daemons share there, or create it)"
        )
    if not path.is_dir():
        raise SettingsError(f'Invalid {flag} "{raw}": not a directory')
    real = str(path.resolve())
    probe = os.path.join(real, f".write-check-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise SettingsError(
            f'Invalid {flag} "{raw}": not writable ({exc.strerror or type(exc).__name__}); '
            "give a directory this daemon can write"
        ) from None

    def within(inner: str, outer: str) -> bool:
        return inner == outer or inner.startswith(outer.rstrip("/") + "/")

    state = os.path.realpath(state_dir)
    if within(real, state):
        where = "is" if real == state else "is inside"
        raise SettingsError(
            f'Invalid {flag} "{raw}": {where} the state directory {state_dir}, which is this '
            "daemon's own; give a directory all daemons of the cluster share"
        )
    for sub in SHARED_SUBDIRS:
        if within(state, os.path.join(real, sub)):
            raise SettingsError(
                f'Invalid {flag} "{raw}": the state directory {state_dir} is inside '
                f"{os.path.join(real, sub)}, where the daemon keeps the agents' places"
            )
    for w in workspaces:
        ws = os.path.realpath(w)
        if within(real, ws):
            where = "is" if real == ws else "is inside"
            raise SettingsError(
                f'Invalid {flag} "{raw}": {where} the workspace {w}, which its agents write; '
                "give a directory outside every workspace"
            )
    return real


def parse_device_flow_providers(values: Sequence[str]) -> list[str]:
    for value in values:
        name, sep, url = value.partition("=")
        if not sep or not name.strip() or not url.startswith(("http://", "https://")):
            raise SettingsError(
                f'Invalid --device-flow-provider "{value}": expected NAME=http(s)://URL'
            )
    return list(values)


def parse_rate_limit(ns: argparse.Namespace, env: Mapping[str, str]) -> RateLimitSettings:
    enabled = bool(ns.rate_limit) or env.get("QWEN_SERVE_RATE_LIMIT", "").lower() in ("1", "true")

    def tier(flag: str, value: str | None, env_name: str, default: int) -> int:
        if value is not None:
            return parse_positive(flag, value)
        raw = env.get(env_name)
        if raw:
            return parse_int(env_name, raw, minimum=1, what="a positive integer")
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
