"""--allow-origin parsing, the self-origin strip and the CORS policy decisions."""

from __future__ import annotations

import pytest

from serve.http.security.cors import (
    ALLOW_HEADERS,
    ALLOW_METHODS,
    CORS_DENIED_BODY,
    CorsAction,
    CorsPolicy,
    InvalidAllowOriginPattern,
    canonical_origin,
    is_remote_same_origin,
    is_self_origin,
    parse_allow_origin,
)

# --------------------------------------------------------------------------- patterns

VALID_PATTERNS = [
    "*",
    "http://example.com",
    "https://example.com",
    "http://example.com:8080",
    "https://example.com:80",
    "http://example.com:443",
    "http://localhost:5173",
    "http://127.0.0.1:3000",
    "http://[::1]:3000",
    "http://[2001:db8::1]",
    "https://xn--bcher-kva.de",
    "http://a_b.example",
    "http://example.com.",
    "https://sub.domain.example.org:65535",
    "http://1.2.3.4",
]


@pytest.mark.parametrize("pattern", VALID_PATTERNS)
def test_valid_patterns_round_trip(pattern: str) -> None:
    assert parse_allow_origin(pattern) == pattern


# (pattern, reason fragment, canonical form or None)
INVALID_PATTERNS: list[tuple[str, str, str | None]] = [
    ("http://example.com/", "trailing slash", "http://example.com"),
    ("http://example.com/app", "path, query or fragment", "http://example.com"),
    ("http://example.com?x=1", "path, query or fragment", "http://example.com"),
    ("http://example.com#frag", "path, query or fragment", "http://example.com"),
    ("http://example.com\\", "path, query or fragment", "http://example.com"),
    ("HTTP://example.com", "scheme is not lower-case", "http://example.com"),
    ("http://Example.COM", "host is not lower-case", "http://example.com"),
    ("http://example.com:80", "default port", "http://example.com"),
    ("https://example.com:443", "default port", "https://example.com"),
    ("http://example.com:", "port is empty", "http://example.com"),
    ("http://example.com:0080", "default port", "http://example.com"),
    (" ftp://example.com", "not http or https", None),
    ("http://example.com:08080", "leading zeros", "http://example.com:8080"),
    ("http://user:pw@example.com", "userinfo", "http://example.com"),
    ("http://@example.com", "userinfo", "http://example.com"),
    ("http:example.com", 'exactly "//"', "http://example.com"),
    ("http:///example.com", 'exactly "//"', "http://example.com"),
    ("http:\\\\example.com", 'exactly "//"', "http://example.com"),
    ("http://bücher.de", "punycode", "http://xn--bcher-kva.de"),
    ("http://BÜCHER.de", "punycode", "http://xn--bcher-kva.de"),
    ("http://ex%61mple.com", "percent-encoded", "http://example.com"),
    ("http://127.1", "dotted-decimal", "http://127.0.0.1"),
    ("http://0x7f.0.0.1", "dotted-decimal", "http://127.0.0.1"),
    ("http://2130706433", "dotted-decimal", "http://127.0.0.1"),
    ("http://0177.0.0.1", "dotted-decimal", "http://127.0.0.1"),
    ("http://[::0001]", "compressed", "http://[::1]"),
    ("http://[2001:DB8::1]", "compressed", "http://[2001:db8::1]"),
    (" http://example.com", "whitespace or control", "http://example.com"),
    ("http://example.com ", "whitespace or control", "http://example.com"),
    ("http://exa\tmple.com", "whitespace or control", "http://example.com"),
    ("http://example.com\r\n", "whitespace or control", "http://example.com"),
    # unparsable: no canonical form to offer
    ("", "not an absolute URL", None),
    ("example.com", "not an absolute URL", None),
    ("//example.com", "not an absolute URL", None),
    ("null", "not an absolute URL", None),
    ("**", "not an absolute URL", None),
    ("ftp://example.com", "not http or https", None),
    ("ws://example.com", "not http or https", None),
    ("chrome-extension://abcdef", "not http or https", None),
    ("file:///etc/passwd", "not http or https", None),
    ("http://", "host is empty", None),
    ("http://:8080", "host is empty", None),
    ("http://example.com:99999", "out of range", None),
    ("http://example.com:8o", "not a number", None),
    ("http://a:b:c", "not a number", None),
    ("http://[::1", "IPv6 address is malformed", None),
    ("http://[nope]", "IPv6 address is malformed", None),
    ("http://[fe80::1%25eth0]", "IPv6 address is malformed", None),
    ("http://[::1]x", "not a number", None),
    ("http://a b.com", "not allowed in a host name", None),
    ("http://a<b.com", "not allowed in a host name", None),
    ("http://ex%zzample.com", "not allowed in a host name", None),
    ("http://ex%00ample.com", "not allowed in a host name", None),
    ("http://1.2.3.4.5", "not a valid IPv4", None),
    ("http://256.1.1.1", "not a valid IPv4", None),
    ("http://\u2488.com", "not a valid domain", None),  # DIGIT ONE FULL STOP is disallowed
]


@pytest.mark.parametrize(("pattern", "reason", "canonical"), INVALID_PATTERNS)
def test_invalid_patterns_name_reason_and_canonical(
    pattern: str, reason: str, canonical: str | None
) -> None:
    with pytest.raises(InvalidAllowOriginPattern) as info:
        parse_allow_origin(pattern)
    error = info.value
    assert error.pattern == pattern
    assert reason in error.reason
    assert error.canonical == canonical
    message = str(error)
    assert message.startswith("Invalid --allow-origin pattern ")
    assert "Expected `*` or a URL origin of the form scheme://host[:port]" in message
    assert ("canonical form" in message) is (canonical is not None)
    if canonical is not None:
        assert message.endswith(f"(canonical form: {canonical})")
    assert "\n" not in message and "\r" not in message


def test_invalid_pattern_message_exact() -> None:
    with pytest.raises(InvalidAllowOriginPattern) as info:
        parse_allow_origin("https://app.example.com/")
    assert str(info.value) == (
        'Invalid --allow-origin pattern "https://app.example.com/": it has a trailing slash. '
        "Expected `*` or a URL origin of the form scheme://host[:port] "
        "(canonical form: https://app.example.com)"
    )


def test_invalid_pattern_message_escapes_and_bounds_hostile_text() -> None:
    hostile = 'http://x.com/"\x1b[31m\r\nFAKE LOG LINE' + "a" * 5000
    with pytest.raises(InvalidAllowOriginPattern) as info:
        parse_allow_origin(hostile)
    message = str(info.value)
    assert "\x1b" not in message and "\n" not in message and "\r" not in message
    assert '\\"' in message
    assert len(message) < 600


def test_canonical_origin() -> None:
    assert canonical_origin("HTTPS://Example.com:443/path?q#f") == "https://example.com"
    assert canonical_origin("gopher://x") is None
    assert canonical_origin("not a url") is None


# --------------------------------------------------------------------------- policy

ALLOW = {
    "Access-Control-Allow-Origin": "https://app.example.com",
    "Vary": "Origin",
    "Access-Control-Allow-Methods": "GET, POST, PATCH, DELETE, OPTIONS",
    "Access-Control-Allow-Headers": (
        "Authorization, Content-Type, X-Qwen-Client-Id, Last-Event-ID, X-Qwen-Event-Epoch, Prefer"
    ),
    "Access-Control-Max-Age": "86400",
    "Access-Control-Expose-Headers": "Retry-After, X-Qwen-Event-Epoch, X-Qwen-SSE-Stream-Id",
}

LISTED = CorsPolicy.from_patterns(["https://app.example.com", "http://localhost:5173"])
ANY = CorsPolicy.from_patterns(["*"])
WALL = CorsPolicy()


def test_constants_match_the_seed() -> None:
    assert ALLOW_METHODS == ALLOW["Access-Control-Allow-Methods"]
    assert ALLOW_HEADERS == ALLOW["Access-Control-Allow-Headers"]


def test_no_origin_passes_without_headers() -> None:
    for policy in (WALL, LISTED, ANY):
        decision = policy.evaluate(None, "POST")
        assert decision.action is CorsAction.PASS
        assert decision.headers == () and decision.status is None and decision.body is None
        assert not decision.short_circuit
        assert policy.evaluate([], "GET").action is CorsAction.PASS


def test_matched_origin_gets_headers_and_continues() -> None:
    decision = LISTED.evaluate("https://app.example.com", "GET")
    assert decision.action is CorsAction.ALLOW
    assert dict(decision.headers) == ALLOW
    assert decision.status is None and not decision.short_circuit


@pytest.mark.parametrize(
    "header_names",
    [
        ["Access-Control-Request-Method"],
        ["access-control-request-method"],
        ["ACCESS-CONTROL-REQUEST-HEADERS"],
        ["Host", "Access-Control-Request-Headers", "Origin"],
    ],
)
def test_preflight_short_circuits_204(header_names: list[str]) -> None:
    decision = LISTED.evaluate("https://app.example.com", "OPTIONS", header_names)
    assert decision.action is CorsAction.PREFLIGHT
    assert decision.status == 204 and decision.body is None and decision.short_circuit
    assert dict(decision.headers) == ALLOW


def test_plain_options_from_matched_origin_continues() -> None:
    decision = LISTED.evaluate("https://app.example.com", "OPTIONS", ["Host"])
    assert decision.action is CorsAction.ALLOW


def test_preflight_headers_on_non_options_do_not_short_circuit() -> None:
    decision = LISTED.evaluate("https://app.example.com", "POST", ["Access-Control-Request-Method"])
    assert decision.action is CorsAction.ALLOW


def test_matching_is_case_insensitive_and_echo_preserves_case() -> None:
    decision = LISTED.evaluate("HTTPS://App.Example.COM", "GET")
    assert decision.action is CorsAction.ALLOW
    assert dict(decision.headers)["Access-Control-Allow-Origin"] == "HTTPS://App.Example.COM"


def test_wildcard_echoes_the_origin_never_star() -> None:
    decision = ANY.evaluate("https://whatever.example:8443", "GET")
    assert decision.action is CorsAction.ALLOW
    assert dict(decision.headers)["Access-Control-Allow-Origin"] == "https://whatever.example:8443"
    assert "Access-Control-Allow-Credentials" not in dict(decision.headers)


DENIED_ORIGINS = [
    "null",
    "NULL",
    "Null",
    "",
    "https://evil.example",
    "https://app.example.com.evil.example",
    "https://app.example.com:443",
    "https://app.example.com/",
    "http://app.example.com",
    "https://app.example.co",
    "https://app.example.com\r\nSet-Cookie: a=b",
    "https://app.example.com\n",
    " https://app.example.com",
    "https://app.example.com ",
    "https://app.éxample.com",
    "https://app.example.\u212aom",  # KELVIN SIGN is not "k"
    "https://ａpp.example.com",  # full-width a
    "http://localhost:5174",
    "http://127.0.0.1:5173",
    "https://app.example.com" + "/x" * 5000,
]


@pytest.mark.parametrize("origin", DENIED_ORIGINS)
def test_unmatched_origins_denied_without_cors_headers(origin: str) -> None:
    decision = LISTED.evaluate(origin, "GET")
    assert decision.action is CorsAction.DENY
    assert decision.status == 403 and decision.short_circuit
    assert decision.headers == (("Vary", "Origin"),)
    assert decision.body == CORS_DENIED_BODY
    assert not any(name.startswith("Access-Control") for name, _ in decision.headers)


@pytest.mark.parametrize(
    "origin",
    [
        "null",
        "NULL",
        "",
        "https://a.example\r\nX-Injected: 1",
        "https://a.example\x00",
        "https://a.example\t",
        "https://bücher.de",
        "https://a.example " + "x",
        "https://" + "a" * 3000 + ".example",
    ],
)
def test_wildcard_still_refuses_null_and_unsafe_origins(origin: str) -> None:
    assert ANY.evaluate(origin, "GET").action is CorsAction.DENY


@pytest.mark.parametrize("origin", ["https://evil.example", "http://localhost:4170", "null"])
def test_default_wall_denies_every_origin(origin: str) -> None:
    decision = WALL.evaluate(origin, "POST")
    assert decision.action is CorsAction.DENY
    assert WALL.evaluate(origin, "OPTIONS", ["Access-Control-Request-Method"]).status == 403


def test_repeated_origin_headers_are_denied() -> None:
    twice = ["https://app.example.com", "https://app.example.com"]
    assert LISTED.evaluate(twice, "GET").action is CorsAction.DENY
    assert LISTED.evaluate(["https://app.example.com"], "GET").action is CorsAction.ALLOW


def test_denied_body_bytes() -> None:
    assert CORS_DENIED_BODY.encode() == b'{"error":"Request denied by CORS policy"}'


def test_from_patterns_stops_at_first_bad_pattern() -> None:
    with pytest.raises(InvalidAllowOriginPattern) as info:
        CorsPolicy.from_patterns(["https://ok.example", "https://bad.example/", "also bad"])
    assert info.value.pattern == "https://bad.example/"


def test_configured_flag() -> None:
    assert not WALL.configured
    assert LISTED.configured and ANY.configured
    assert CorsPolicy.from_patterns(["*", "https://a.example"]).allow_any


@pytest.mark.parametrize(
    ("patterns", "has_token", "problem"),
    [
        ([], False, None),
        (["*"], True, None),
        (["*"], False, "--allow-origin '*'"),
        (["https://app.example.com"], False, '"https://app.example.com"'),
        (["https://app.example.com"], True, None),
        (["http://localhost:5173", "http://127.0.0.1:3000", "http://[::1]:8080"], False, None),
        (["http://localhost:5173", "http://10.0.0.2:3000"], False, '"http://10.0.0.2:3000"'),
    ],
)
def test_startup_problem(patterns: list[str], has_token: bool, problem: str | None) -> None:
    result = CorsPolicy.from_patterns(patterns).startup_problem(has_token=has_token)
    if problem is None:
        assert result is None
    else:
        assert result is not None and problem in result and "no bearer token" in result


def test_wildcard_warns_once() -> None:
    assert len(ANY.startup_warnings()) == 1 and "'*'" in ANY.startup_warnings()[0]
    assert LISTED.startup_warnings() == ()


# --------------------------------------------------------------------------- self origin

SELF_4170 = [
    "http://127.0.0.1:4170",
    "https://127.0.0.1:4170",
    "http://localhost:4170",
    "https://localhost:4170",
    "http://[::1]:4170",
    "http://host.docker.internal:4170",
    "https://host.docker.internal:4170",
]
NOT_SELF_4170 = [
    "http://127.0.0.1:4171",
    "http://127.0.0.1",
    "http://LOCALHOST:4170",
    "HTTP://localhost:4170",
    "http://localhost:4170/",
    "http://localhost:4170 ",
    "http://localhost:4170\r\n",
    "http://127.0.0.2:4170",
    "http://evil.example:4170",
    "http://localhost.evil.example:4170",
    "http://user@localhost:4170",
    "null",
    "",
    "http://host.doc\u212aer.internal:4170",
]


@pytest.mark.parametrize("origin", SELF_4170)
def test_self_origins_are_stripped(origin: str) -> None:
    assert is_self_origin(origin, "127.0.0.1", 4170)


@pytest.mark.parametrize("origin", NOT_SELF_4170)
def test_other_origins_are_not_self(origin: str) -> None:
    assert not is_self_origin(origin, "127.0.0.1", 4170)


@pytest.mark.parametrize(
    ("origin", "bound", "port", "expected"),
    [
        ("http://127.0.0.2:4170", "127.0.0.2", 4170, True),
        ("http://[::1]:4170", "::1", 4170, True),
        ("http://localhost:4170", "LOCALHOST", 4170, True),
        ("http://localhost", "127.0.0.1", 80, True),
        ("http://localhost:80", "127.0.0.1", 80, True),
        ("https://localhost", "127.0.0.1", 80, False),
        ("https://localhost", "127.0.0.1", 443, True),
        ("http://localhost", "127.0.0.1", 443, False),
        ("http://localhost", "127.0.0.1", 8080, False),
        ("https://host.docker.internal", "127.0.0.1", 443, True),
        # not on non-loopback binds
        ("http://127.0.0.1:4170", "0.0.0.0", 4170, False),
        ("http://10.0.0.5:4170", "10.0.0.5", 4170, False),
    ],
)
def test_self_origin_by_bind(origin: str, bound: str, port: int, expected: bool) -> None:
    assert is_self_origin(origin, bound, port) is expected


@pytest.mark.parametrize(
    ("origin", "host", "tls", "expected"),
    [
        ("http://daemon.example:4170", "daemon.example:4170", False, True),
        ("http://DAEMON.example:4170", "daemon.example:4170", False, True),
        ("https://daemon.example", "daemon.example:443", True, True),
        ("https://daemon.example", "daemon.example", True, True),
        ("http://daemon.example", "daemon.example:80", False, True),
        ("http://daemon.example", "daemon.example:443", True, False),
        ("https://daemon.example:4170", "daemon.example:4170", False, False),
        ("http://evil.example:4170", "daemon.example:4170", False, False),
        ("http://daemon.example:4170", None, False, False),
        ("http://daemon.example:4170", "", False, False),
        ("http://daemon.example:4170\r\n", "daemon.example:4170\r\n", False, False),
        ("http://dæmon.example:4170", "dæmon.example:4170", False, False),
    ],
)
def test_remote_same_origin(origin: str, host: str | None, tls: bool, expected: bool) -> None:
    assert is_remote_same_origin(origin, host, tls=tls) is expected
