"""The client address behind rate-limit keys and /acp connection binding (issue 22 item 17)."""

from __future__ import annotations

import pytest

from serve.http.security.peers import client_address, parse_trusted_proxies

PROXY = parse_trusted_proxies(["10.0.0.1", "192.168.0.0/16"])


@pytest.mark.parametrize(
    ("peer", "forwarded", "trusted", "address"),
    [
        ("127.0.0.1", None, (), "127.0.0.1"),
        ("::ffff:10.1.2.3", None, (), "10.1.2.3"),
        (None, None, (), "unknown"),
        # Without --trusted-proxy the header is nobody's word.
        ("10.0.0.1", "203.0.113.7", (), "10.0.0.1"),
        # From a trusted proxy: the right-most untrusted hop.
        ("10.0.0.1", "203.0.113.7", PROXY, "203.0.113.7"),
        ("10.0.0.1", "1.1.1.1, 203.0.113.7, 192.168.4.4", PROXY, "203.0.113.7"),
        ("10.0.0.1", "::ffff:203.0.113.7", PROXY, "203.0.113.7"),
        # An untrusted peer's header is ignored; a malformed hop stops the walk.
        ("203.0.113.9", "198.51.100.1", PROXY, "203.0.113.9"),
        ("10.0.0.1", "1.1.1.1, bogus", PROXY, "10.0.0.1"),
        ("10.0.0.1", "", PROXY, "10.0.0.1"),
        ("10.0.0.1", "192.168.1.1", PROXY, "10.0.0.1"),  # only proxies: the peer
    ],
)
def test_client_address(
    peer: str | None, forwarded: str | None, trusted: tuple, address: str
) -> None:
    assert client_address(peer, forwarded, trusted) == address


def test_bad_trusted_proxy_is_refused() -> None:
    with pytest.raises(ValueError, match="not an IP address"):
        parse_trusted_proxies(["proxy.example.com"])
