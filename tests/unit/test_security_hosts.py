"""Loopback classification and the Host allowlist (DNS-rebinding defence)."""

from __future__ import annotations

import pytest

from serve.http.security.hosts import (
    INVALID_HOST_BODY,
    HostAllowlist,
    ascii_lower,
    is_loopback_address,
    is_loopback_host,
)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("127.255.255.255", True),
        ("127.1.2.3", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("LocalHost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("[::]", False),
        ("", False),
        (" ", False),
        (" 127.0.0.1", False),
        ("127.0.0.1 ", False),
        ("127.0.0.256", False),
        ("127.0.0", False),
        ("127.1", False),
        ("127.0.0.1.", False),
        ("128.0.0.1", False),
        ("10.0.0.1", False),
        ("192.168.1.10", False),
        ("localhost.", False),
        ("localhost.evil.com", False),
        ("0177.0.0.1", False),
        ("127.0.0.1\n", False),
        ("１２７.0.0.1", False),  # full-width digits
        ("::ffff:127.0.0.1", False),
        ("example.com", False),
    ],
)
def test_is_loopback_host(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("::FFFF:127.0.0.5", True),
        ("0:0:0:0:0:0:0:1", True),
        ("10.0.0.1", False),
        ("::ffff:10.0.0.1", False),
        ("::", False),
        ("0.0.0.0", False),
        ("fe80::1%lo", False),
        ("::1%lo", False),
        ("localhost", False),
        ("", False),
        ("127.0.0.1:4170", False),
        ("garbage", False),
        ("2001:db8::1", False),
    ],
)
def test_is_loopback_address(address: str, loopback: bool) -> None:
    assert is_loopback_address(address) is loopback


ALLOW_4170 = [
    "localhost:4170",
    "LOCALHOST:4170",
    "127.0.0.1:4170",
    "[::1]:4170",
    "host.docker.internal:4170",
    "Host.Docker.Internal:4170",
]
DENY_4170 = [
    None,
    "",
    "localhost",
    "127.0.0.1",
    "localhost:4171",
    "localhost:04170",
    "localhost:4170 ",
    " localhost:4170",
    "localhost:4170\r\nX-Evil: 1",
    "localhost:4170\n",
    "evil.example:4170",
    "evil.example",
    "localhost:4170.evil.example",
    "localhost.evil.example:4170",
    "user@localhost:4170",
    "evil.example#@localhost:4170",
    "127.0.0.2:4170",
    "::1:4170",
    "[::1]",
    "[0:0:0:0:0:0:0:1]:4170",
    "127.1:4170",
    "2130706433:4170",
    "host.doc\u212aer.internal:4170",  # KELVIN SIGN folds to "k" under str.lower()
    "ｌocalhost:4170",  # full-width l
    "localhost:4170:4170",
    "x" * 100_000,
]


@pytest.mark.parametrize("host", ALLOW_4170)
def test_allowlist_accepts_own_names(host: str) -> None:
    assert HostAllowlist("127.0.0.1", 4170).allows(host)


@pytest.mark.parametrize("host", DENY_4170)
def test_allowlist_rejects_everything_else(host: str | None) -> None:
    assert not HostAllowlist("127.0.0.1", 4170).allows(host)


@pytest.mark.parametrize(
    ("bound", "port", "host", "allowed"),
    [
        ("127.0.0.2", 4170, "127.0.0.2:4170", True),
        ("127.0.0.2", 4170, "127.0.0.1:4170", True),
        ("127.0.0.2", 4170, "127.0.0.3:4170", False),
        ("::1", 4170, "[::1]:4170", True),
        ("[::1]", 4170, "[::1]:4170", True),
        ("localhost", 4170, "localhost:4170", True),
        ("LocalHost", 4170, "localhost:4170", True),
        ("127.0.0.1", 80, "localhost", True),
        ("127.0.0.1", 80, "localhost:80", True),
        ("127.0.0.1", 80, "[::1]", True),
        ("127.0.0.1", 443, "host.docker.internal", True),
        ("127.0.0.1", 443, "127.0.0.1", True),
        ("127.0.0.2", 443, "127.0.0.2", True),
        ("127.0.0.1", 8080, "localhost", False),
        ("127.0.0.1", 80, "evil.example", False),
        ("127.0.0.1", 80, "localhost:443", False),
        # non-loopback binds: not enforced
        ("0.0.0.0", 4170, "evil.example", True),
        ("0.0.0.0", 4170, None, True),
        ("10.0.0.5", 4170, "anything:1", True),
    ],
)
def test_allowlist_by_bind(bound: str, port: int, host: str | None, allowed: bool) -> None:
    assert HostAllowlist(bound, port).allows(host) is allowed


def test_allowlist_enforced_only_on_loopback() -> None:
    assert HostAllowlist("127.0.0.1", 1).enforced
    assert HostAllowlist("localhost", 1).enforced
    assert not HostAllowlist("0.0.0.0", 1).enforced


def test_allowed_values_listing() -> None:
    assert HostAllowlist("127.0.0.1", 4170).allowed_values() == {
        "localhost:4170",
        "127.0.0.1:4170",
        "[::1]:4170",
        "host.docker.internal:4170",
    }


def test_invalid_host_body() -> None:
    assert INVALID_HOST_BODY.encode() == b'{"error":"Invalid Host header"}'


def test_ascii_lower_leaves_non_ascii_alone() -> None:
    assert ascii_lower("AbC\u212a\u0130") == "abc\u212a\u0130"
