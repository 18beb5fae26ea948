"""Bearer tokens outside HTTP: resolution at start-up, the digest, and redaction.

Spec §2.3; the seed's Authentication section. The flag parser (:mod:`serve.settings`), the
log writer (:mod:`serve.logs`) and the HTTP check
(:mod:`serve.http.security.bearer`, which re-exports these names) share them; nothing here
knows HTTP.

*Resolution* (:func:`resolve_token`, :func:`resolve_startup_token`): the token is
``--token`` if the flag was given at all, else ``QWEN_SERVER_TOKEN``; it is trimmed and an
empty result means "no token". A non-loopback bind where *neither* source is present gets a
generated token (16 random bytes, base64url, 22 characters) that the daemon prints once to
stderr. Passing the token on argv earns a warning (it is visible in ``ps``). A token the
HTTP layer could never match — control characters, non-ASCII, longer than
:data:`MAX_TOKEN_CHARS` — is refused at start-up (:class:`InvalidBearerToken`), whose message
never contains the token. Only its SHA-256 (:func:`token_digest`) is kept after start-up.

*Redaction* (:func:`redact`, :class:`RedactingFilter`): replace every occurrence of a secret
(and its percent-encoded form) in a string or a log record with ``[redacted]``. Install the
filter on the daemon's log handlers so tokens never reach a log file.

Pure functions and values, no I/O (the caller prints and logs).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import secrets
from collections.abc import Iterable, Mapping
from typing import Final
from urllib.parse import quote

import msgspec

__all__ = [
    "ARGV_TOKEN_WARNING",
    "MAX_TOKEN_CHARS",
    "REDACTED",
    "TOKEN_ENV_VAR",
    "InvalidBearerToken",
    "RedactingFilter",
    "TokenResolution",
    "generate_token",
    "redact",
    "resolve_startup_token",
    "resolve_token",
    "token_digest",
]

TOKEN_ENV_VAR = "QWEN_SERVER_TOKEN"
MAX_TOKEN_CHARS = 4096
"""Longest accepted configured token."""
REDACTED = "[redacted]"
ARGV_TOKEN_WARNING = (
    "warning: --token on the command line is visible to other local users (ps, "
    "/proc/*/cmdline); prefer the QWEN_SERVER_TOKEN environment variable."
)


class InvalidBearerToken(ValueError):
    """The *operator* configured a token that cannot be sent in an HTTP header.

    The message names the source (``--token`` or ``QWEN_SERVER_TOKEN``), never the value.
    """


def _trim(value: str) -> str:
    # JS String.prototype.trim also removes U+FEFF; Python's str.strip() does not.
    return value.strip().strip("\ufeff").strip()


def resolve_token(flag: str | None, env: Mapping[str, str]) -> str | None:
    """The configured token: ``flag`` if given (even empty), else ``env[QWEN_SERVER_TOKEN]``.

    Trimmed; an empty or all-whitespace value is ``None`` (no token). Raises
    :class:`InvalidBearerToken` for a token with control or non-ASCII characters or longer
    than :data:`MAX_TOKEN_CHARS`.
    """
    source = "--token" if flag is not None else TOKEN_ENV_VAR
    raw = flag if flag is not None else env.get(TOKEN_ENV_VAR)
    if raw is None:
        return None
    token = _trim(raw)
    if token == "":
        return None
    if len(token) > MAX_TOKEN_CHARS:
        raise InvalidBearerToken(
            f"The bearer token from {source} is longer than {MAX_TOKEN_CHARS} characters."
        )
    if not all(0x20 <= ord(ch) <= 0x7E for ch in token):
        raise InvalidBearerToken(
            f"The bearer token from {source} contains characters that cannot be sent in an "
            "HTTP Authorization header (only printable ASCII is allowed)."
        )
    return token


def generate_token() -> str:
    """A fresh token: 16 random bytes, base64url without padding (22 characters)."""
    return base64.urlsafe_b64encode(secrets.token_bytes(16)).rstrip(b"=").decode("ascii")


class TokenResolution(msgspec.Struct, frozen=True, kw_only=True):
    """Start-up outcome: the token (or ``None``) and what the daemon must say about it.

    ``generated``: print the token once to stderr. ``argv_warning``: print
    :data:`ARGV_TOKEN_WARNING`. ``__repr__`` hides the token.
    """

    token: str | None
    source: str | None
    generated: bool = False
    argv_warning: bool = False

    def __repr__(self) -> str:
        shown = None if self.token is None else REDACTED
        return (
            f"TokenResolution(token={shown!r}, source={self.source!r}, "
            f"generated={self.generated}, argv_warning={self.argv_warning})"
        )


#: Largest token file ``--token-file`` reads (bytes).
MAX_TOKEN_FILE_BYTES: Final = 64 * 1024


def read_token_file(path: str) -> str:
    """The token on the first line of ``path`` (trimmed). Blocking (start-up only). Raises
    ``OSError``, or ``ValueError`` for a file that is too large, not UTF-8 or holds none."""
    with open(path, "rb") as f:
        data = f.read(MAX_TOKEN_FILE_BYTES + 1)
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise ValueError(f"{path} is larger than {MAX_TOKEN_FILE_BYTES} bytes")
    lines = data.decode("utf-8", errors="strict").splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        raise ValueError(f"{path} holds no token")
    return token


def resolve_startup_token(
    flag: str | None, env: Mapping[str, str], *, loopback_bind: bool
) -> TokenResolution:
    """Token resolution of spec §2.3, including generation on non-loopback binds.

    A token is generated only when the bind is non-loopback and *neither* ``--token`` nor
    ``QWEN_SERVER_TOKEN`` is present; an explicitly empty one stays "no token" (the daemon
    then refuses to bind, §2.4).
    """
    token = resolve_token(flag, env)
    argv_warning = flag is not None and token is not None
    if token is not None:
        source = "--token" if flag is not None else TOKEN_ENV_VAR
        return TokenResolution(token=token, source=source, argv_warning=argv_warning)
    if not loopback_bind and flag is None and TOKEN_ENV_VAR not in env:
        return TokenResolution(token=generate_token(), source="generated", generated=True)
    return TokenResolution(token=None, source=None)


def token_digest(token: str) -> bytes:
    """SHA-256 of the token's UTF-8 bytes."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def _variants(secret_values: Iterable[str]) -> list[str]:
    found: set[str] = set()
    for value in secret_values:
        if value:
            found.add(value)
            found.add(quote(value, safe=""))
    return sorted(found, key=len, reverse=True)


def redact(text: str, secret_values: Iterable[str]) -> str:
    """``text`` with every occurrence of each non-empty secret replaced by ``[redacted]``.

    The percent-encoded form of each secret is replaced too; longer secrets go first so an
    overlapping shorter one cannot leave a tail behind.
    """
    for value in _variants(secret_values):
        if value in text:
            text = text.replace(value, REDACTED)
    return text


class RedactingFilter(logging.Filter):
    """A logging filter that redacts secrets from a record's final message.

    The record's ``msg`` is replaced by the redacted, fully formatted message and its
    ``args`` cleared, so a secret passed as an argument is caught too. Exception text is
    formatted and redacted as well. Attach it to *handlers* (filters on loggers do not see
    records propagated from child loggers).
    """

    def __init__(self, secret_values: Iterable[str]) -> None:
        super().__init__()
        self._secrets = _variants(secret_values)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._secrets:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a bad format string must not break the caller; drop the args
            message = f"{record.msg} [log arguments dropped: format failed]"
        record.msg = redact(message, self._secrets)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self._secrets)
        if record.stack_info:
            record.stack_info = redact(record.stack_info, self._secrets)
        return True
