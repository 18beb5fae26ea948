"""Loopback classification and the ``Host`` allowlist (DNS-rebinding defence, spec §3.1).

Theory of operation
-------------------
Three different questions, three functions:

* :func:`is_loopback_host` — is the *bind hostname* the operator passed (``--hostname``) a
  loopback name? The loopback set is ``localhost``, ``::1``, ``[::1]`` and any dotted quad
  ``127.a.b.c`` whose octets are decimal 0–255. Everything else (``0.0.0.0``, a LAN
  address, a DNS name) is non-loopback and makes bearer auth mandatory.
* :func:`is_loopback_address` — is the *socket peer* a loopback address? ``127.0.0.0/8``,
  ``::1`` and IPv4-mapped ``::ffff:127.x.y.z``.
* :class:`HostAllowlist` — on a loopback bind, a browser page on ``evil.example`` that
  re-resolves its own name to ``127.0.0.1`` reaches the daemon with ``Host: evil.example``.
  Only the daemon's own names pass: ``localhost:P``, ``127.0.0.1:P``, ``[::1]:P``,
  ``host.docker.internal:P`` and ``<bound host>:P`` where ``P`` is the *actual* listening
  port (so build the allowlist after binding, which makes ``--port 0`` work); for ``P`` 80
  and 443 the bare names pass too. The comparison is exact after ASCII lower-casing; a
  value with any non-ASCII character, whitespace or control character never matches (so
  ``host.doc\\u212aer.internal`` — a Kelvin sign that ``str.lower()`` would fold to ``k`` —
  cannot sneak in). On a non-loopback bind the allowlist is not enforced at all.

Rejections are ``403 {"error":"Invalid Host header"}`` (:data:`INVALID_HOST_BODY`).
Pure functions and an immutable value object; no I/O.
"""

from __future__ import annotations

import ipaddress

import msgspec

from serve.http.security._wire import ErrorBody
from serve.origins import ascii_lower, is_loopback_host

__all__ = [
    "INVALID_HOST_BODY",
    "LOOPBACK_ALIASES",
    "HostAllowlist",
    "ascii_lower",
    "is_loopback_address",
    "is_loopback_host",
]

INVALID_HOST_BODY = ErrorBody(error="Invalid Host header")

LOOPBACK_ALIASES: tuple[str, ...] = ("localhost", "127.0.0.1", "[::1]", "host.docker.internal")
"""Host names (without port) that always designate this daemon on a loopback bind."""


def is_loopback_address(address: str) -> bool:
    """True iff the socket peer address is loopback (``127/8``, ``::1``, ``::ffff:127/104``).

    Accepts the forms servers report (``"127.0.0.1"``, ``"::1"``, ``"::ffff:127.0.0.1"``,
    also bracketed IPv6). Anything unparsable is *not* loopback.
    """
    text = address
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if "%" in text:  # zone ids (fe80::1%eth0) are never loopback
        return False
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def _bracketed(host: str) -> str:
    """``::1`` → ``[::1]``; other names unchanged (lower-cased)."""
    lowered = ascii_lower(host)
    if ":" in lowered and not lowered.startswith("["):
        return f"[{lowered}]"
    return lowered


class HostAllowlist(msgspec.Struct, frozen=True):
    """The set of ``Host`` header values accepted for a bind ``(bound_host, port)``.

    ``port`` must be the actual listening port (resolve ``--port 0`` first).
    ``enforced`` is false for non-loopback binds, in which case :meth:`allows` is always true.
    """

    bound_host: str
    port: int

    @property
    def enforced(self) -> bool:
        return is_loopback_host(self.bound_host)

    def allowed_values(self) -> frozenset[str]:
        """Every accepted ``Host`` value, lower-cased."""
        names = {*LOOPBACK_ALIASES, _bracketed(self.bound_host)}
        values = {f"{name}:{self.port}" for name in names}
        if self.port in (80, 443):
            values |= names
        return frozenset(values)

    def allows(self, host_header: str | None) -> bool:
        """True iff a request carrying this ``Host`` value may proceed.

        ``None`` (no Host header) and the empty string are refused on loopback binds.
        """
        if not self.enforced:
            return True
        if not host_header or not host_header.isascii():
            return False
        return ascii_lower(host_header) in self.allowed_values()
