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

Pattern grammar (:func:`parse_allow_origin`): the literal ``*``, or an origin
``http(s)://host[:port]`` that is *exactly* its own WHATWG serialisation — the check
``new URL(p).origin === p`` of the reference, re-implemented here: lower-case scheme and
host, no default port, no trailing slash, path, query, fragment or userinfo, IDN hosts in
punycode, IPv4 in dotted decimal, IPv6 in compressed form. Silent normalisation is refused
on purpose (a typo must not quietly become a different allowlist entry); the error names the
pattern, the reason and, when one exists, the canonical form to use instead.

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
import ipaddress
import re
from collections.abc import Iterable, Sequence
from urllib.parse import unquote

import msgspec

from serve.http.security._wire import ErrorBody
from serve.http.security.hosts import ascii_lower, is_loopback_host

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

_DEFAULT_PORTS = {"http": 80, "https": 443}
_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):(.*)", re.ASCII | re.DOTALL)
# WHATWG "forbidden domain code points" (C0 controls, space and DEL are checked separately).
_FORBIDDEN_HOST_CHARS = frozenset("\t\n\r #/:<>?@[\\]^|%")


class InvalidAllowOriginPattern(ValueError):
    """The *operator* passed an ``--allow-origin`` value that is not ``*`` or a canonical origin.

    ``pattern`` is the raw value, ``reason`` says what is wrong and ``canonical`` is the
    origin the value would normalise to (``None`` when it does not parse at all).
    """

    def __init__(self, pattern: str, reason: str, canonical: str | None) -> None:
        self.pattern = pattern
        self.reason = reason
        self.canonical = canonical
        message = (
            f"Invalid --allow-origin pattern {_quote(pattern)}: {reason}. Expected `*` or a "
            "URL origin of the form scheme://host[:port]"
        )
        if canonical is not None:
            message += f" (canonical form: {_quote(canonical, quotes=False)})"
        super().__init__(message)


# ---------------------------------------------------------------------------------------
# Pattern parsing


def _quote(text: str, *, limit: int = 200, quotes: bool = True) -> str:
    """``text`` made safe for a one-line terminal message (escapes, bounded length)."""
    clipped = text if len(text) <= limit else text[:limit] + "…"
    out: list[str] = []
    for ch in clipped:
        if ch in '"\\' and quotes:
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    body = "".join(out)
    return f'"{body}"' if quotes else body


def _parse_ipv4_number(part: str) -> int | None:
    base = 10
    digits = part
    if len(part) >= 2 and part[:2] in ("0x", "0X"):
        base, digits = 16, part[2:]
        if digits == "":
            return 0
    elif len(part) >= 2 and part[0] == "0":
        base, digits = 8, part[1:]
    allowed = {10: "0123456789", 8: "01234567", 16: "0123456789abcdefABCDEF"}[base]
    if digits == "" or any(ch not in allowed for ch in digits):
        return None
    return int(digits, base)


def _ends_in_number(host: str) -> bool:
    parts = host.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    last = parts[-1]
    if last != "" and last.isascii() and last.isdigit():
        return True
    return last[:2] in ("0x", "0X") and _parse_ipv4_number(last) is not None


def _parse_ipv4(host: str) -> str | None:
    """WHATWG IPv4 parser (``127.1``, ``0x7f.0.0.1``, ``2130706433`` …) → dotted decimal."""
    parts = host.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    if len(parts) > 4:
        return None
    numbers: list[int] = []
    for part in parts:
        number = _parse_ipv4_number(part) if part else None
        if number is None:
            return None
        numbers.append(number)
    if any(n > 255 for n in numbers[:-1]) or numbers[-1] >= 256 ** (5 - len(numbers)):
        return None
    value = numbers[-1]
    for index, number in enumerate(numbers[:-1]):
        value += number * 256 ** (3 - index)
    return str(ipaddress.IPv4Address(value))


#: A letters-digits-hyphens label IDNA leaves as it is (no "--" at 3-4, so no "xn--").
_PLAIN_LABEL = re.compile(r"(?!..--)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


def _domain_to_ascii(host: str) -> str | None:
    """UTS #46 (non-transitional) ToASCII, as browsers do; ``None`` if it is not a domain."""
    lowered = host.lower()
    if len(lowered) <= 253 and all(_PLAIN_LABEL.fullmatch(label) for label in lowered.split(".")):
        return lowered  # plain LDH hostnames: IDNA would return them unchanged
    import idna  # UTS #46 (imported on first non-ASCII or punycode host)

    try:
        return str(idna.encode(host, uts46=True, transitional=False).decode("ascii"))
    except (idna.IDNAError, UnicodeError, ValueError):
        return None


def _canonical_host(raw: str, reasons: list[str]) -> str | None:
    """Serialised host per WHATWG, appending to ``reasons`` whatever differs from ``raw``."""
    if raw == "":
        reasons.append("the host is empty")
        return None
    if raw.startswith("["):
        inner = raw[1:-1]
        if not raw.endswith("]") or "%" in inner:
            reasons.append("the IPv6 address is malformed")
            return None
        try:
            address = ipaddress.IPv6Address(inner)
        except ValueError:
            reasons.append("the IPv6 address is malformed")
            return None
        canonical = f"[{address.compressed}]"
        if canonical != raw:
            reasons.append("the IPv6 address is not in compressed lower-case form")
        return canonical
    host = raw
    if "%" in host:
        host = unquote(host, errors="strict") if _valid_percent(host) else host
        reasons.append("the host is percent-encoded")
    if not host.isascii():
        ascii_host = _domain_to_ascii(host)
        if ascii_host is None:
            reasons.append("the host is not a valid domain name")
            return None
        reasons.append("the host is not in ASCII (punycode) form")
        host = ascii_host
    lowered = ascii_lower(host)
    if lowered != host:
        reasons.append("the host is not lower-case")
    if any(ch in _FORBIDDEN_HOST_CHARS or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in lowered):
        reasons.append("the host contains characters not allowed in a host name")
        return None
    if _ends_in_number(lowered):
        dotted = _parse_ipv4(lowered)
        if dotted is None:
            reasons.append("the host is not a valid IPv4 address")
            return None
        if dotted != lowered:
            reasons.append("the IPv4 address is not in dotted-decimal form")
        return dotted
    return lowered


def _valid_percent(text: str) -> bool:
    try:
        unquote(text, errors="strict")
    except UnicodeDecodeError:
        return False
    return True


def _analyse(pattern: str) -> tuple[str | None, list[str]]:
    """``(canonical origin or None, reasons it differs from pattern)``."""
    reasons: list[str] = []
    stripped = pattern.strip("".join(map(chr, range(0x21)))).translate(
        {0x09: None, 0x0A: None, 0x0D: None}
    )
    if stripped != pattern:
        reasons.append("it contains whitespace or control characters")
    match = _SCHEME_RE.fullmatch(stripped)
    if match is None:
        reasons.append("it is not an absolute URL")
        return None, reasons
    raw_scheme, rest = match.group(1), match.group(2)
    scheme = ascii_lower(raw_scheme)
    if scheme not in _DEFAULT_PORTS:
        reasons.append("the scheme is not http or https")
        return None, reasons
    if scheme != raw_scheme:
        reasons.append("the scheme is not lower-case")
    after = rest.lstrip("/\\")
    if rest[: len(rest) - len(after)] != "//":
        reasons.append('the scheme is not followed by exactly "//"')
    end = min((i for i in (after.find(c) for c in "/?#\\") if i >= 0), default=len(after))
    authority, tail = after[:end], after[end:]
    if tail == "/":
        reasons.append("it has a trailing slash")
    elif tail:
        reasons.append("it has a path, query or fragment")
    if "@" in authority:
        reasons.append("it contains userinfo")
        authority = authority.rsplit("@", 1)[1]
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            reasons.append("the IPv6 address is malformed")
            return None, reasons
        raw_host, port_part = authority[: close + 1], authority[close + 1 :]
        if port_part and not port_part.startswith(":"):
            reasons.append("the port is not a number")
            return None, reasons
        raw_port: str | None = port_part[1:] if port_part else None
    else:
        raw_host, colon, port_text = authority.partition(":")
        raw_port = port_text if colon else None
    port: int | None = None
    if raw_port is not None:
        if raw_port == "":
            reasons.append("the port is empty")
        elif not (raw_port.isascii() and raw_port.isdigit()):
            reasons.append("the port is not a number")
            return None, reasons
        else:
            port = int(raw_port)
            if port > 65535:
                reasons.append("the port is out of range")
                return None, reasons
            if port == _DEFAULT_PORTS[scheme]:
                reasons.append(f"the port is the default port for {scheme}")
                port = None
            elif str(port) != raw_port:
                reasons.append("the port has leading zeros")
    host = _canonical_host(raw_host, reasons)
    if host is None:
        return None, reasons
    canonical = f"{scheme}://{host}" + (f":{port}" if port is not None else "")
    return canonical, reasons


def canonical_origin(text: str) -> str | None:
    """The WHATWG-serialised origin ``text`` normalises to, or ``None`` if it does not parse.

    Only ``http`` and ``https`` URLs have an origin here (other schemes → ``None``).
    """
    return _analyse(text)[0]


def parse_allow_origin(pattern: str) -> str:
    """Validate one ``--allow-origin`` value; return ``"*"`` or the canonical origin.

    Raises :class:`InvalidAllowOriginPattern` unless ``pattern`` is ``*`` or exactly its
    own canonical origin.
    """
    if pattern == "*":
        return "*"
    canonical, reasons = _analyse(pattern)
    if canonical is not None and canonical == pattern:
        return canonical
    if not reasons:
        reason = "it does not round-trip as a URL origin"
    else:  # the fatal problem (always recorded last) or the first difference
        reason = reasons[-1] if canonical is None else reasons[0]
    raise InvalidAllowOriginPattern(pattern, reason, canonical)


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


def _loopback_origin(origin: str) -> bool:
    host = origin.split("://", 1)[1]
    if host.startswith("["):
        host = host[: host.find("]") + 1]
    else:
        host = host.partition(":")[0]
    return is_loopback_host(host)


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
        """Why the daemon must refuse to start with this policy, or ``None``.

        ``*`` and any non-loopback origin need a bearer token (``--token``,
        ``QWEN_SERVER_TOKEN``; ``--require-auth`` already insists on one).
        """
        if has_token:
            return None
        if self.allow_any:
            return (
                "Refusing to start with --allow-origin '*' but no bearer token configured. "
                "Set QWEN_SERVER_TOKEN or pass --token."
            )
        for origin in sorted(self.origins):
            if not _loopback_origin(origin):
                return (
                    f"Refusing to start with --allow-origin {_quote(origin)} (a non-loopback "
                    "origin) but no bearer token configured. "
                    "Set QWEN_SERVER_TOKEN or pass --token."
                )
        return None

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
