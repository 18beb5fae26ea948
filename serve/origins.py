"""Origins and hosts without HTTP: the ``--allow-origin`` grammar and the loopback names.

Spec §3.3–§3.4 and the seed's ``--allow-origin`` section. The flag parser
(:mod:`serve.settings`) validates the patterns and the start-up rule with these; the
security front (:mod:`serve.http.security.cors`, :mod:`serve.http.security.hosts`, which
re-export them) matches requests against the result.

Pattern grammar (:func:`parse_allow_origin`): the literal ``*``, or an origin
``http(s)://host[:port]`` that is *exactly* its own WHATWG serialisation — the check
``new URL(p).origin === p`` of the reference, re-implemented here: lower-case scheme and
host, no default port, no trailing slash, path, query, fragment or userinfo, IDN hosts in
punycode, IPv4 in dotted decimal, IPv6 in compressed form. Silent normalisation is refused
on purpose (a typo must not quietly become a different allowlist entry); the error names the
pattern, the reason and, when one exists, the canonical form to use instead.

Start-up (:func:`allow_origin_problem`): ``*`` and any non-loopback origin need a bearer
token. Pure values and functions, no I/O.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from urllib.parse import unquote

__all__ = [
    "DEFAULT_PORTS",
    "InvalidAllowOriginPattern",
    "allow_origin_problem",
    "ascii_lower",
    "canonical_origin",
    "is_loopback_host",
    "parse_allow_origin",
]

_DOTTED_127 = re.compile(r"127\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})", re.ASCII)
_ASCII_UPPER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def ascii_lower(value: str) -> str:
    """Lower-case ASCII letters only (``str.lower`` folds e.g. U+212A KELVIN SIGN to ``k``)."""
    return value.translate(_ASCII_UPPER)


def is_loopback_host(host: str) -> bool:
    """True iff the bind hostname ``host`` is in the loopback set.

    ``localhost`` (any ASCII case), ``::1``, ``[::1]``, or ``127.a.b.c`` with decimal octets
    in 0–255. No surrounding whitespace is tolerated.
    """
    lowered = ascii_lower(host)
    if lowered in ("localhost", "::1", "[::1]"):
        return True
    match = _DOTTED_127.fullmatch(host)
    return match is not None and all(int(octet) <= 255 for octet in match.groups())


DEFAULT_PORTS = {"http": 80, "https": 443}
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
    if scheme not in DEFAULT_PORTS:
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
            if port == DEFAULT_PORTS[scheme]:
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


def _loopback_origin(origin: str) -> bool:
    host = origin.split("://", 1)[1]
    if host.startswith("["):
        host = host[: host.find("]") + 1]
    else:
        host = host.partition(":")[0]
    return is_loopback_host(host)


def allow_origin_problem(parsed: Iterable[str], *, has_token: bool) -> str | None:
    """Why the daemon must refuse to start with these parsed ``--allow-origin`` values, or
    ``None``: ``*`` and any non-loopback origin need a bearer token (``--token``,
    ``QWEN_SERVER_TOKEN``; ``--require-auth`` already insists on one)."""
    if has_token:
        return None
    values = set(parsed)
    if "*" in values:
        return (
            "Refusing to start with --allow-origin '*' but no bearer token configured. "
            "Set QWEN_SERVER_TOKEN or pass --token."
        )
    for origin in sorted(values):
        if not _loopback_origin(origin):
            return (
                f"Refusing to start with --allow-origin {_quote(origin)} (a non-loopback "
                "origin) but no bearer token configured. "
                "Set QWEN_SERVER_TOKEN or pass --token."
            )
    return None
