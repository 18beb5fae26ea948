"""The security front's pure parts: what the HTTP middleware decides, without any I/O.

The middleware (in the Quart-Trio app) runs these checks in the reference's order, each
answering before the next one is consulted:

1. self-origin strip      :func:`is_self_origin` (loopback binds), :func:`is_remote_same_origin`
2. Host allowlist         :class:`HostAllowlist` → 403 :data:`INVALID_HOST_BODY`
3. CORS                   :class:`CorsPolicy` → pass / headers / 204 preflight / 403
4. ``/health`` pre-auth   on loopback binds without ``--require-auth``
5. bearer auth            :class:`BearerAuth` → 401 :data:`UNAUTHORIZED_BODY`
6. rate limit             :class:`RateLimiter` → 429 :class:`RateLimitBody`
7. body limit, URL encoding (in :mod:`serve.http.middleware` itself)
8. strict gate            :func:`is_strict` → 401 :data:`TOKEN_REQUIRED_BODY`

Client id syntax (:func:`validate_client_id` → 400 :data:`INVALID_CLIENT_ID_BODY`) is checked
by the routes that read ``X-Qwen-Client-Id``, as in the reference (a bad id on a route that
ignores the header is not an error). The wiring lives in :mod:`serve.http.middleware`.

Every module is sans-IO and owns no tasks; the only mutable object is the
:class:`RateLimiter`, owned by the HTTP front. Operator mistakes found at start-up raise
:class:`InvalidAllowOriginPattern`, :class:`InvalidBearerToken` or
:class:`InvalidRateLimitConfig`; client mistakes raise :class:`InvalidClientId`.
"""

from serve.http.security._wire import ErrorBody
from serve.http.security.bearer import (
    ARGV_TOKEN_WARNING,
    REDACTED,
    TOKEN_ENV_VAR,
    UNAUTHORIZED_BODY,
    BearerAuth,
    InvalidBearerToken,
    RedactingFilter,
    TokenResolution,
    check_authorization,
    check_token_header,
    generate_token,
    redact,
    resolve_startup_token,
    resolve_token,
    token_digest,
)
from serve.http.security.clientid import (
    CLIENT_ID_HEADER,
    INVALID_CLIENT_ID_BODY,
    InvalidClientId,
    InvalidClientIdBody,
    is_valid_client_id,
    unknown_session_client_body,
    unknown_workspace_client_body,
    validate_client_id,
)
from serve.http.security.cors import (
    ALLOW_HEADERS,
    ALLOW_METHODS,
    CORS_DENIED_BODY,
    EXPOSE_HEADERS,
    MAX_AGE_SECONDS,
    CorsAction,
    CorsDecision,
    CorsPolicy,
    InvalidAllowOriginPattern,
    canonical_origin,
    is_remote_same_origin,
    is_self_origin,
    parse_allow_origin,
)
from serve.http.security.hosts import (
    INVALID_HOST_BODY,
    HostAllowlist,
    is_loopback_address,
    is_loopback_host,
)
from serve.http.security.strict import (
    STRICT_ROUTES,
    TOKEN_REQUIRED_BODY,
    StrictRoute,
    is_strict,
    strict_gate_allows,
)
from serve.ratelimit import (
    Decision,
    InvalidRateLimitConfig,
    RateLimitBody,
    RateLimitConfig,
    RateLimiter,
    RateLimiterStats,
    Tier,
    classify,
    client_key,
    rate_limit_config_from,
)

__all__ = [
    "ALLOW_HEADERS",
    "ALLOW_METHODS",
    "ARGV_TOKEN_WARNING",
    "CLIENT_ID_HEADER",
    "CORS_DENIED_BODY",
    "EXPOSE_HEADERS",
    "INVALID_CLIENT_ID_BODY",
    "INVALID_HOST_BODY",
    "MAX_AGE_SECONDS",
    "REDACTED",
    "STRICT_ROUTES",
    "TOKEN_ENV_VAR",
    "TOKEN_REQUIRED_BODY",
    "UNAUTHORIZED_BODY",
    "BearerAuth",
    "CorsAction",
    "CorsDecision",
    "CorsPolicy",
    "Decision",
    "ErrorBody",
    "HostAllowlist",
    "InvalidAllowOriginPattern",
    "InvalidBearerToken",
    "InvalidClientId",
    "InvalidClientIdBody",
    "InvalidRateLimitConfig",
    "RateLimitBody",
    "RateLimitConfig",
    "RateLimiter",
    "RateLimiterStats",
    "RedactingFilter",
    "StrictRoute",
    "Tier",
    "TokenResolution",
    "canonical_origin",
    "check_authorization",
    "check_token_header",
    "classify",
    "client_key",
    "generate_token",
    "is_loopback_address",
    "is_loopback_host",
    "is_remote_same_origin",
    "is_self_origin",
    "is_strict",
    "is_valid_client_id",
    "parse_allow_origin",
    "rate_limit_config_from",
    "redact",
    "resolve_startup_token",
    "resolve_token",
    "strict_gate_allows",
    "token_digest",
    "unknown_session_client_body",
    "unknown_workspace_client_body",
    "validate_client_id",
]
