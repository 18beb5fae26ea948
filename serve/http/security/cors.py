"""Origin handling: ``--allow-origin`` patterns, the self-origin strip and the CORS policy.

Spec §3.3–§3.4 and the seed's ``--allow-origin`` section.

Theory of operation
-------------------
CLI and SDK clients never send ``Origin``; browsers always do. So a request carrying
``Origin`` is treated as coming from a browser context the operator has not opted into,
unless one of three things lets it through, checked in this order by the middleware:

1. **Self-origin strip** (:func:`is_self_origin`, loopback binds only): the daemon's own
   pages (``/demo``) call it from ``http(s)://127.0.0.1:P``, ``localhost:P``, ``[::1]:P``,
   ``host.docker.internal:P`` or ``<bound host>:P`` (port-less when ``P`` is the scheme's
   default port). Such an ``Origin`` is deleted and the request proceeds as a non-browser
   one. Matching is exact: browsers serialise origins in lower case.
   On a non-loopback bind *with* a token, :func:`is_remote_same_origin` recognises a page
   served by the daemon itself (``Origin == scheme://Host``); the middleware then demands a
   valid bearer and strips the header.
2. **CORS** (:class:`CorsPolicy`): with no ``--allow-origin`` every remaining ``Origin`` is
   refused (the "wall"); otherwise a matching origin gets the standard CORS headers on every
   response and preflights are answered ``204`` at once.
3. Anything else: ``403 {"error":"Request denied by CORS policy"}`` with ``Vary: Origin``
   and no ``Access-Control-*`` header (their presence would leak the allowlist's shape).

Pattern grammar (:func:`parse_allow_origin`): see :mod:`serve.origins` (the flag parser
validates with it; re-exported here).

Matching is ASCII-case-insensitive against the stored (lower-case) patterns; the echoed
``Access-Control-Allow-Origin`` preserves the case the browser sent. An ``Origin`` with any
non-ASCII, whitespace or control character never matches (no Unicode case-folding tricks,
no header injection through the echo), ``Origin: null`` is always refused, and in ``*``
mode only a plain visible-ASCII origin of bounded length is echoed.

The pattern list is never echoed; only the ``allow_origin`` capability tag reveals that a
list exists. Pure values and functions, no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

import msgspec

from serve.http.security._wire import ErrorBody
from serve.origins import DEFAULT_PORTS as _DEFAULT_PORTS
from serve.origins import (
    InvalidAllowOriginPattern,
    allow_origin_problem,
    ascii_lower,
    canonical_origin,
    is_loopback_host,
    parse_allow_origin,
)

__all__ = [
    "ALLOW_HEADERS",
    "ALLOW_METHODS",
    "CORS_DENIED_BODY",
    "EXPOSE_HEADERS",
    "MAX_AGE_SECONDS",
    "MAX_ORIGIN_CHARS",
    "CorsAction",
    "CorsDecision",
    "CorsPolicy",
    "InvalidAllowOriginPattern",
    "canonical_origin",
    "is_remote_same_origin",
    "is_self_origin",
    "parse_allow_origin",
    "self_origins",
]

ALLOW_METHODS = "GET, POST, PATCH, DELETE, OPTIONS"
ALLOW_HEADERS = (
    "Authorization, Content-Type, X-Qwen-Client-Id, Last-Event-ID, X-Qwen-Event-Epoch, Prefer"
)
# The seed lists Retry-After; qwen serve 0.24.4 also exposes the SSE epoch and stream id,
# which a browser client needs to resume a stream (the demo page does).
EXPOSE_HEADERS = "Retry-After, X-Qwen-Event-Epoch, X-Qwen-SSE-Stream-Id"
MAX_AGE_SECONDS = 86400
MAX_ORIGIN_CHARS = 2048
"""Longest ``Origin`` value ever matched or echoed; longer ones are refused."""

CORS_DENIED_BODY = ErrorBody(error="Request denied by CORS policy")

# ---------------------------------------------------------------------------------------
# Self-origin strip


def _self_names(bound_host: str) -> set[str]:
    bound = ascii_lower(bound_host)
    if ":" in bound and not bound.startswith("["):
        bound = f"[{bound}]"
    return {"127.0.0.1", "localhost", "[::1]", "host.docker.internal", bound}


def self_origins(bound_host: str, port: int) -> frozenset[str]:
    """Every ``Origin`` value :func:`is_self_origin` accepts for this bind (empty if not loopback).

    The middleware precomputes this once per listening port and tests membership, so the
    per-request cost is one set lookup.
    """
    if not is_loopback_host(bound_host):
        return frozenset()
    found: set[str] = set()
    for name in _self_names(bound_host):
        for scheme, default in _DEFAULT_PORTS.items():
            found.add(f"{scheme}://{name}:{port}")
            if port == default:
                found.add(f"{scheme}://{name}")
    return frozenset(found)


def is_self_origin(origin: str, bound_host: str, port: int) -> bool:
    """True iff ``origin`` is one of the daemon's own loopback origins (strip it).

    Only on loopback binds. Matches ``http(s)://{127.0.0.1,localhost,[::1],
    host.docker.internal,<bound host>}:<port>`` exactly, plus ``http://name`` when
    ``port == 80`` and ``https://name`` when ``port == 443``.
    """
    return len(origin) <= MAX_ORIGIN_CHARS and origin in self_origins(bound_host, port)


def _plain_ascii(value: str) -> bool:
    """Visible ASCII only (0x21–0x7E), non-empty and bounded."""
    return (
        0 < len(value) <= MAX_ORIGIN_CHARS
        and value.isascii()
        and all(0x21 <= ord(ch) <= 0x7E for ch in value)
    )


def is_remote_same_origin(origin: str, host_header: str | None, *, tls: bool) -> bool:
    """True iff ``origin`` is ``<scheme>://<Host>`` of this very request (spec §3.3).

    ``scheme`` comes from the socket (``tls``), the default port is dropped from ``Host``
    and the comparison is ASCII-case-insensitive. Meant for non-loopback binds with a
    token: the caller must then require a valid bearer before stripping ``Origin``.
    """
    if host_header is None or not _plain_ascii(origin) or not _plain_ascii(host_header):
        return False
    scheme = "https" if tls else "http"
    host = ascii_lower(host_header)
    default_suffix = f":{_DEFAULT_PORTS[scheme]}"
    if host.endswith(default_suffix):
        host = host[: -len(default_suffix)]
    return ascii_lower(origin) == f"{scheme}://{host}"


# ---------------------------------------------------------------------------------------
# Policy


class CorsAction(enum.Enum):
    """What the CORS middleware does with a request."""

    PASS = "pass"
    """No ``Origin``: continue, add nothing."""
    ALLOW = "allow"
    """Matched origin: continue and add ``headers`` to whatever response is produced."""
    PREFLIGHT = "preflight"
    """Matched preflight: answer ``204`` with ``headers`` and no body, now."""
    DENY = "deny"
    """Answer ``403`` :data:`CORS_DENIED_BODY` with ``headers`` (only ``Vary: Origin``), now."""


class CorsDecision(msgspec.Struct, frozen=True):
    """The outcome of :meth:`CorsPolicy.evaluate`.

    ``headers`` are to be *added* to the response (append ``Origin`` to an existing
    ``Vary`` rather than replacing it).
    """

    action: CorsAction
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def short_circuit(self) -> bool:
        """True when the middleware must answer now (preflight or deny)."""
        return self.action in (CorsAction.PREFLIGHT, CorsAction.DENY)

    @property
    def status(self) -> int | None:
        """204 for a preflight, 403 for a denial, ``None`` when the request continues."""
        return {CorsAction.PREFLIGHT: 204, CorsAction.DENY: 403}.get(self.action)

    @property
    def body(self) -> ErrorBody | None:
        """The JSON body of a denial; ``None`` otherwise (a preflight has no body)."""
        return CORS_DENIED_BODY if self.action is CorsAction.DENY else None


_PASS = CorsDecision(CorsAction.PASS)
_DENY = CorsDecision(CorsAction.DENY, (("Vary", "Origin"),))
_PREFLIGHT_REQUEST_HEADERS = frozenset(
    {"access-control-request-method", "access-control-request-headers"}
)


def _allow_headers(origin: str) -> tuple[tuple[str, str], ...]:
    return (
        ("Access-Control-Allow-Origin", origin),
        ("Vary", "Origin"),
        ("Access-Control-Allow-Methods", ALLOW_METHODS),
        ("Access-Control-Allow-Headers", ALLOW_HEADERS),
        ("Access-Control-Max-Age", str(MAX_AGE_SECONDS)),
        ("Access-Control-Expose-Headers", EXPOSE_HEADERS),
    )


class CorsPolicy(msgspec.Struct, frozen=True):
    """The parsed ``--allow-origin`` allowlist. Build with :meth:`from_patterns`.

    An empty policy is the default wall: every request with ``Origin`` is denied.
    """

    origins: frozenset[str] = frozenset()
    allow_any: bool = False

    @classmethod
    def from_patterns(cls, patterns: Iterable[str]) -> CorsPolicy:
        """Parse every pattern; the first bad one raises :class:`InvalidAllowOriginPattern`."""
        parsed = [parse_allow_origin(p) for p in patterns]
        return cls(
            origins=frozenset(p for p in parsed if p != "*"),
            allow_any="*" in parsed,
        )

    @property
    def configured(self) -> bool:
        """True iff ``--allow-origin`` was given (advertise the ``allow_origin`` tag)."""
        return self.allow_any or bool(self.origins)

    def startup_problem(self, *, has_token: bool) -> str | None:
        """Why the daemon must refuse to start with this policy, or ``None``
        (:func:`serve.origins.allow_origin_problem`)."""
        parsed = [*(["*"] if self.allow_any else []), *self.origins]
        return allow_origin_problem(parsed, has_token=has_token)

    def startup_warnings(self) -> tuple[str, ...]:
        """Warnings to print once on stderr at start-up."""
        if not self.allow_any:
            return ()
        return (
            "warning: --allow-origin '*' lets any browser origin call this daemon; bearer "
            "auth still applies, but on loopback binds /health and /demo stay reachable "
            "without it unless --require-auth is set.",
        )

    def matches(self, origin: str) -> bool:
        """True iff ``origin`` (as sent) is admitted by this policy. ``null`` never is."""
        if not _plain_ascii(origin) or ascii_lower(origin) == "null":
            return False
        return self.allow_any or ascii_lower(origin) in self.origins

    def evaluate(
        self,
        origin: str | Sequence[str] | None,
        method: str,
        header_names: Iterable[str] = (),
    ) -> CorsDecision:
        """Decide what to do with a request after the self-origin strip.

        ``origin`` is the ``Origin`` value (``None`` when absent) or the list of all
        ``Origin`` values: none → absent, several → denied. ``header_names`` are the request's
        header names (any case), used to recognise a preflight (``OPTIONS`` with
        ``Access-Control-Request-Method`` or ``-Headers``).
        """
        if origin is not None and not isinstance(origin, str):
            values = list(origin)
            if len(values) > 1:
                return _DENY
            origin = values[0] if values else None
        if origin is None:
            return _PASS
        if not self.matches(origin):
            return _DENY
        headers = _allow_headers(origin)
        if method == "OPTIONS" and any(
            ascii_lower(name) in _PREFLIGHT_REQUEST_HEADERS for name in header_names
        ):
            return CorsDecision(CorsAction.PREFLIGHT, headers)
        return CorsDecision(CorsAction.ALLOW, headers)
