"""Bearer tokens: the ``Authorization`` check (resolution and redaction: :mod:`serve.tokens`).

Spec §2.3 and §3.2; the seed's Authentication section.

Theory of operation
-------------------
Resolution, the digest and redaction live in :mod:`serve.tokens` (the flag parser and the
log writer use them without HTTP); this module re-exports them.

*Checking* (:class:`BearerAuth`, :func:`check_authorization`): exactly one
``Authorization`` header; the scheme is the text before the first space and must be
``bearer`` in any ASCII case; spaces and tabs after it are skipped; an empty credential
fails. The SHA-256 digest of the credential is compared with the digest of the configured
token by :func:`hmac.compare_digest`, so timing reveals neither the token nor its length.
Every failure is the same ``401 {"error":"Unauthorized"}`` (:data:`UNAUTHORIZED_BODY`):
missing header, several headers, ``Basic``, wrong or empty token alike. Only the digest is
kept after start-up.

*The token header* (``--token-header NAME``, :func:`check_token_header`): the same token
may come as the bare value of that header, for proxies that strip ``Authorization`` (the
agent-sandbox router does); the request is authorized when either carries it.

Pure functions and values, no I/O (the caller prints and logs).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

import msgspec

from serve.http.security._wire import ErrorBody
from serve.tokens import (
    ARGV_TOKEN_WARNING,
    MAX_TOKEN_CHARS,
    REDACTED,
    TOKEN_ENV_VAR,
    InvalidBearerToken,
    RedactingFilter,
    TokenResolution,
    generate_token,
    redact,
    resolve_startup_token,
    resolve_token,
    token_digest,
)

__all__ = [
    "ARGV_TOKEN_WARNING",
    "MAX_CREDENTIAL_CHARS",
    "MAX_TOKEN_CHARS",
    "REDACTED",
    "TOKEN_ENV_VAR",
    "UNAUTHORIZED_BODY",
    "BearerAuth",
    "InvalidBearerToken",
    "RedactingFilter",
    "TokenResolution",
    "check_authorization",
    "check_token_header",
    "generate_token",
    "redact",
    "resolve_startup_token",
    "resolve_token",
    "token_digest",
]

UNAUTHORIZED_BODY = ErrorBody(error="Unauthorized")
MAX_CREDENTIAL_CHARS = 8192
"""Presented credentials longer than this are refused without hashing."""


def _credential(value: str) -> str | None:
    """The credential of one ``Authorization`` value, or ``None`` if it is not bearer."""
    scheme, space, rest = value.partition(" ")
    if not space or not scheme.isascii() or scheme.lower() != "bearer":
        return None
    credential = rest.lstrip(" \t")
    if credential == "" or len(credential) > MAX_CREDENTIAL_CHARS:
        return None
    return credential


def check_authorization(header_values: Sequence[str], expected_digest: bytes) -> bool:
    """True iff the request's ``Authorization`` header(s) carry the configured token.

    ``header_values`` are all values of the header (zero, one or more). Anything but exactly
    one well-formed ``Bearer <token>`` whose SHA-256 equals ``expected_digest`` is False.
    """
    if len(header_values) != 1:
        return False
    credential = _credential(header_values[0])
    if credential is None:
        return False
    return hmac.compare_digest(token_digest(credential), expected_digest)


def check_token_header(header_values: Sequence[str], expected_digest: bytes) -> bool:
    """True iff the ``--token-header`` header carries the configured token.

    Exactly one header whose value (spaces and tabs around it trimmed, no scheme) has the
    configured token's SHA-256, compared in constant time like :func:`check_authorization`;
    zero or several headers, an empty or oversized value are False.
    """
    if len(header_values) != 1:
        return False
    credential = header_values[0].strip(" \t")
    if credential == "" or len(credential) > MAX_CREDENTIAL_CHARS:
        return False
    return hmac.compare_digest(token_digest(credential), expected_digest)


class BearerAuth(msgspec.Struct, frozen=True):
    """The configured token, kept only as its digest. Build with :meth:`from_token`."""

    digest: bytes

    @classmethod
    def from_token(cls, token: str) -> BearerAuth:
        return cls(token_digest(token))

    def check(self, header_values: Sequence[str]) -> bool:
        """See :func:`check_authorization`."""
        return check_authorization(header_values, self.digest)

    def __repr__(self) -> str:
        return "BearerAuth(digest=[redacted])"
