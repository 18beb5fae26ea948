"""Multi-user auth, quota and audit flags (``--auth-*``, ``--quota-*``, ``--audit-*``).

:class:`AuthSettings` is ``Settings.auth``; ``configured`` is False without any principal
source (``--auth-jwks-url``, ``--auth-jwks-file``, ``--auth-tokens-file``), and then nothing
of multi-user auth runs (``docs/multi-user.md``). Any source needs the operator token.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

import msgspec

from serve.settings.record import (
    ALGORITHMS,
    DEFAULT_ALGORITHMS,
    DEFAULT_MAX_TOKEN_AGE_S,
    MIB,
    AuthSettings,
    SettingsError,
)
from serve.settings.values import parse_int

__all__ = ["ALGORITHMS", "AuthSettings", "add_auth_flags", "parse_auth"]


def add_auth_flags(p: argparse.ArgumentParser) -> None:
    add = p.add_argument
    add("--auth-jwks-url", default=None, metavar="URL", help="accept JWTs signed by this JWKS")
    add("--auth-jwks-file", default=None, metavar="FILE", help="accept JWTs signed by this JWKS")
    add("--auth-issuer", default=None, help="the JWTs' required iss")
    add("--auth-audience", default=None, help="the JWTs' required aud")
    add(
        "--auth-allow-any-audience",
        action="store_true",
        help="accept JWTs minted for any audience (no --auth-audience): explicitly",
    )
    add(
        "--auth-max-token-age",
        default=str(DEFAULT_MAX_TOKEN_AGE_S),
        metavar="SECONDS",
        help="longest JWT lifetime accepted, exp-iat and exp-now, in seconds (a day)",
    )
    add(
        "--auth-algorithms",
        default=None,
        help=f"accepted JWT algorithms, comma-separated (default {','.join(DEFAULT_ALGORITHMS)})",
    )
    add("--auth-groups-claim", default=None, help="the JWT claim listing groups (default groups)")
    add(
        "--auth-tokens-file",
        default=None,
        metavar="FILE",
        help="scoped static tokens: {id, sha256, principal, roles} per entry, reloaded on change",
    )
    add("--quota-sessions", default="0", help="live sessions per principal; 0 = no limit")
    add("--quota-prompts-per-minute", default="0", help="prompts per principal and minute")
    add("--quota-token-budget", default="0", help="tokens a principal's live sessions may spend")
    add("--quota-cost-budget", default="0", help="cost a principal's live sessions may spend")
    add(
        "--audit-log",
        default=None,
        metavar="FILE",
        help="audit log (default <state-dir>/audit.jsonl with --auth-*)",
    )
    add("--audit-max-bytes", default=str(10 * MIB), help="audit log size before rotation")


def _cost(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1e12:
        raise SettingsError(f'Invalid --quota-cost-budget "{raw}": a number >= 0')
    return value


def parse_auth(
    ns: argparse.Namespace, env: Mapping[str, str], *, token: str | None, state_dir: str
) -> AuthSettings:
    algorithms = DEFAULT_ALGORITHMS
    if ns.auth_algorithms:
        algorithms = tuple(a.strip() for a in ns.auth_algorithms.split(",") if a.strip())
        bad = [a for a in algorithms if a not in ALGORITHMS]
        if bad or not algorithms:
            raise SettingsError(
                f'Invalid --auth-algorithms "{ns.auth_algorithms}": use some of '
                + ", ".join(ALGORITHMS)
            )
    if ns.auth_jwks_url and ns.auth_jwks_file:
        raise SettingsError("--auth-jwks-url and --auth-jwks-file exclude each other")
    if ns.auth_jwks_url and not ns.auth_jwks_url.startswith(("https://", "http://")):
        raise SettingsError(f'Invalid --auth-jwks-url "{ns.auth_jwks_url}": not an http(s) URL')
    for flag, path in (
        ("--auth-jwks-file", ns.auth_jwks_file),
        ("--auth-tokens-file", ns.auth_tokens_file),
    ):
        if path is not None and not os.path.isfile(path):
            raise SettingsError(f'Invalid {flag} "{path}": no such file')
    settings = AuthSettings(
        jwks_url=ns.auth_jwks_url,
        jwks_file=os.path.abspath(ns.auth_jwks_file) if ns.auth_jwks_file else None,
        issuer=ns.auth_issuer,
        audience=ns.auth_audience,
        algorithms=algorithms,
        groups_claim=ns.auth_groups_claim or "groups",
        allow_any_audience=bool(ns.auth_allow_any_audience),
        max_token_age_s=parse_int(
            "--auth-max-token-age", ns.auth_max_token_age, minimum=60, maximum=366 * 24 * 3600
        ),
        tokens_file=os.path.abspath(ns.auth_tokens_file) if ns.auth_tokens_file else None,
        quota_sessions=parse_int("--quota-sessions", ns.quota_sessions, minimum=0, maximum=100_000),
        quota_prompts_per_minute=parse_int(
            "--quota-prompts-per-minute", ns.quota_prompts_per_minute, minimum=0, maximum=100_000
        ),
        quota_token_budget=parse_int(
            "--quota-token-budget", ns.quota_token_budget, minimum=0, maximum=10**12
        ),
        quota_cost_budget=_cost(ns.quota_cost_budget),
        audit_max_bytes=parse_int(
            "--audit-max-bytes", ns.audit_max_bytes, minimum=4096, maximum=1024 * MIB
        ),
    )
    jwt_only = (
        ns.auth_issuer,
        ns.auth_audience,
        ns.auth_algorithms,
        ns.auth_groups_claim,
        ns.auth_allow_any_audience,
        ns.auth_max_token_age != str(DEFAULT_MAX_TOKEN_AGE_S),
    )
    if not settings.jwt and any(jwt_only):
        raise SettingsError(
            "--auth-issuer, --auth-audience, --auth-allow-any-audience, --auth-algorithms, "
            "--auth-groups-claim and --auth-max-token-age need --auth-jwks-url or "
            "--auth-jwks-file"
        )
    if settings.jwt and settings.audience is None and not settings.allow_any_audience:
        raise SettingsError(
            "JWT auth needs --auth-audience (the aud your identity provider puts in tokens "
            "meant for this daemon): without it a token minted for any other service of the "
            "same provider is accepted here. Pass --auth-allow-any-audience to accept that"
        )
    if settings.audience is not None and settings.allow_any_audience:
        raise SettingsError("--auth-audience and --auth-allow-any-audience exclude each other")
    if not settings.configured:
        return msgspec.structs.replace(settings, audit_log=ns.audit_log or "")
    if token is None:
        raise SettingsError(
            "--auth-* needs the operator token too (--token or QWEN_SERVER_TOKEN): "
            "it stays the daemon's admin credential"
        )
    audit = ns.audit_log or os.path.join(state_dir, "audit.jsonl")
    return msgspec.structs.replace(settings, audit_log=audit)
