"""Which receiver addresses a webhook may reach: the operator's allow-list.

Users name the URLs, so a subscription is a request the daemon makes on their behalf
(SSRF). The rule: the scheme is ``http`` or ``https``; the host is resolved and **every**
address must be allowed, at subscription time and again before every delivery attempt (a
name that later resolves elsewhere, DNS rebinding, is refused then). Without an allow-list
entry covering it, an address is refused when it is loopback, link-local (169.254/16,
fe80::/10, cloud metadata), private (10/8, 172.16/12, 192.168/16, fc00::/7, 100.64/10),
unspecified, multicast or reserved, or one of the daemon's own listen addresses; public
addresses are allowed. Allow-list entries (``--webhook-allow``, ``webhooks.allow``) are IP
addresses, CIDRs or exact host names; a host name entry allows that name whatever it
resolves to. Redirects are never followed. (A name is resolved once for the check and once
by the HTTP client; the window between the two is the residual rebinding risk.)
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Final

import trio

__all__ = ["AllowList", "Target", "parse_allow", "target_of"]

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_DENIED: Final = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "::/128",
        "::1/128",
        "fc00::/7",
        "fe80::/10",
        "ff00::/8",
    )
)
#: Resolution of one host name, at most (seconds).
RESOLVE_TIMEOUT_S = 5.0


class Target:
    """A parsed receiver URL: ``url``, ``host`` (no brackets), ``port``."""

    def __init__(self, url: str, host: str, port: int) -> None:
        self.url, self.host, self.port = url, host, port


def target_of(url: str) -> Target:
    """``url`` checked for shape; ``ValueError`` says what is wrong."""
    if len(url) > 2048:
        raise ValueError("`url` is longer than 2048 characters")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"`url` is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError("`url` must be an http or https URL")
    if not parts.hostname:
        raise ValueError("`url` has no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("`url` must not carry credentials")
    host = parts.hostname.lower()
    try:
        ipaddress.ip_address(host)
    except ValueError:
        try:
            ascii_host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise ValueError("`url` has an invalid host name") from None
        if not all(
            label and len(label) < 64 and label.replace("-", "").replace("_", "").isalnum()
            for label in ascii_host.rstrip(".").split(".")
        ):
            raise ValueError("`url` has an invalid host name")
    default = 443 if parts.scheme == "https" else 80
    return Target(url, host, port or default)


def parse_allow(entries: Iterable[str]) -> tuple[tuple[IPNetwork, ...], frozenset[str]]:
    """Networks and host names of the allow-list; ``ValueError`` names a bad entry."""
    nets: list[IPNetwork] = []
    names: set[str] = set()
    for raw in entries:
        entry = raw.strip().lower()
        if not entry:
            raise ValueError("an empty --webhook-allow entry")
        try:
            nets.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            continue
        except ValueError:
            pass
        if (
            "/" in entry
            or ":" in entry
            or not all(
                label and len(label) < 64 and label.replace("-", "").isalnum()
                for label in entry.split(".")
            )
        ):
            raise ValueError(f"--webhook-allow {raw!r} is not an address, a CIDR or a host name")
        names.add(entry)
    return tuple(nets), frozenset(names)


class AllowList:
    """The policy; ``own``: the daemon's listen ``(host, port)`` (always refused, even
    when allowed: a webhook must not call the daemon's own API; a wildcard host means
    every local address on that port)."""

    def __init__(
        self,
        entries: Iterable[str],
        own_host: str | None = None,
        own_port: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.nets, self.names = parse_allow(entries)
        #: The listen port, read at each check (``--port 0`` is known once listening).
        self._own_port = own_port
        self.own: IPAddress | None = None
        if own_host is not None:
            try:
                self.own = ipaddress.ip_address(own_host.strip("[]"))
            except ValueError:
                self.own = None

    @property
    def own_port(self) -> int | None:
        return self._own_port()

    def address_allowed(self, address: IPAddress, port: int | None = None) -> bool:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if port is not None and port == self.own_port:
            wildcard = self.own is None or self.own.is_unspecified
            local = address.is_loopback or address.is_unspecified
            if address == self.own or (wildcard and local):
                return False
        if any(address in net for net in self.nets):
            return True
        if address.is_unspecified:
            return False
        return not any(address in net for net in _DENIED) and not address.is_reserved

    async def check(self, target: Target) -> None:
        """Resolve ``target.host`` and check every address; ``PermissionError`` says why."""
        if target.host in self.names and target.port != self.own_port:
            return
        try:
            literal: IPAddress | None = ipaddress.ip_address(target.host)
        except ValueError:
            literal = None
        if literal is not None:
            addresses = [literal]
        else:
            with trio.move_on_after(RESOLVE_TIMEOUT_S) as scope:
                try:
                    infos = await trio.socket.getaddrinfo(
                        target.host, target.port, type=trio.socket.SOCK_STREAM
                    )
                except (OSError, UnicodeError, ValueError) as exc:
                    raise PermissionError(f"host {target.host!r} does not resolve: {exc}") from None
            if scope.cancelled_caught:
                raise PermissionError(f"host {target.host!r} did not resolve in time")
            addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
        if not addresses:
            raise PermissionError(f"host {target.host!r} has no address")
        for address in addresses:
            if not self.address_allowed(address, target.port):
                raise PermissionError(
                    f"address {address} of {target.host!r} is not allowed for webhooks "
                    "(loopback, link-local, private and the daemon's own addresses need "
                    "--webhook-allow)"
                )
