"""Pin the public surface of serve.http.security (the lead's middleware imports these)."""

from __future__ import annotations

import serve.http.security as security

PUBLIC = {
    "ALLOW_HEADERS", "ALLOW_METHODS", "ARGV_TOKEN_WARNING", "BearerAuth", "CLIENT_ID_HEADER",
    "CORS_DENIED_BODY", "CorsAction", "CorsDecision", "CorsPolicy", "Decision", "ErrorBody",
    "EXPOSE_HEADERS", "HostAllowlist", "INVALID_CLIENT_ID_BODY", "INVALID_HOST_BODY",
    "InvalidAllowOriginPattern", "InvalidBearerToken", "InvalidClientId", "InvalidClientIdBody",
    "InvalidRateLimitConfig", "MAX_AGE_SECONDS", "REDACTED", "RateLimitBody", "RateLimitConfig",
    "RateLimiter", "RateLimiterStats", "RedactingFilter", "STRICT_ROUTES", "StrictRoute",
    "TOKEN_ENV_VAR", "TOKEN_REQUIRED_BODY", "Tier", "TokenResolution", "UNAUTHORIZED_BODY",
    "canonical_origin", "check_authorization", "check_token_header", "classify", "client_key",
    "generate_token",
    "is_loopback_address", "is_loopback_host", "is_remote_same_origin", "is_self_origin",
    "is_strict", "is_valid_client_id", "parse_allow_origin", "rate_limit_config_from",
    "redact", "resolve_startup_token", "resolve_token", "strict_gate_allows", "token_digest",
    "unknown_session_client_body", "unknown_workspace_client_body", "validate_client_id",
}  # fmt: skip


def test_exported_members() -> None:
    assert set(security.__all__) == PUBLIC
    assert len(security.__all__) == len(PUBLIC)
    for name in PUBLIC:
        assert hasattr(security, name), name
