"""Who a request comes from, as far as a client cannot choose it: its network address.

Theory of operation
-------------------
Rate-limit keys, the per-client ``/acp`` connection cap and the binding of an ``/acp``
connection to its creator use :func:`client_address`, never ``X-Qwen-Client-Id`` (a client
picks that freely, so a fresh id per request would never be limited). The address is the
TCP peer's, with an IPv4-mapped ``::ffff:`` prefix removed.

Behind a reverse proxy every request comes from the proxy's address: one budget and one
connection cap for all its clients. ``--trusted-proxy ADDR|CIDR`` (repeatable) names such
proxies; for a request whose peer is one of them, the address is taken from
``X-Forwarded-For``: the right-most entry that is not itself a trusted proxy (entries to
its left were written by the client and prove nothing). A peer that is not trusted is
never believed, whatever headers it sends. Without the flag the header is ignored.

Pure functions, no I/O, no state.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["Network", "client_address", "parse_trusted_proxies", "scope_client_address"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _strip_mapped(ip: str) -> str:
    if ip[:7].lower() == "::ffff:" and "." in ip:
        return ip[7:]
    return ip


def parse_trusted_proxies(values: Iterable[str]) -> tuple[Network, ...]:
    """``--trusted-proxy`` values as networks; ValueError names a bad one."""
    out: list[Network] = []
    for value in values:
        try:
            out.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ValueError(
                f"--trusted-proxy: {value!r} is not an IP address or CIDR network"
            ) from None
    return tuple(out)


def _trusted(ip: str, trusted: Sequence[Network]) -> bool:
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return any(address in net for net in trusted)


def client_address(
    peer_ip: str | None, forwarded_for: str | None, trusted: Sequence[Network] = ()
) -> str:
    """The client's address (``unknown`` when the peer's is not known); see the module
    docstring for ``X-Forwarded-For`` from a trusted proxy."""
    peer = _strip_mapped(peer_ip) if peer_ip else "unknown"
    if not trusted or not forwarded_for or not _trusted(peer, trusted):
        return peer
    for entry in reversed(forwarded_for.split(",")):
        ip = _strip_mapped(entry.strip())
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            return peer  # a malformed hop: nothing left of it can be believed
        if not _trusted(ip, trusted):
            return ip
    return peer


def scope_client_address(scope: Mapping[str, Any], trusted: Sequence[Network] = ()) -> str:
    """:func:`client_address` of an ASGI scope (HTTP or WebSocket)."""
    client = scope.get("client")
    peer = client[0] if client else None
    forwarded: str | None = None
    if trusted:
        values = [v for n, v in scope.get("headers", ()) if n == b"x-forwarded-for"]
        forwarded = b",".join(values).decode("latin-1") if values else None
    return client_address(peer, forwarded, trusted)
