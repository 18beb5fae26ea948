# ruff: noqa: E501  (the case table reads best one case per line)
"""Hostile inputs against the real daemon: no bypass, no 500, the daemon keeps serving.

One daemon (loopback, token, one allowed origin). Each case is a raw HTTP/1.1 request on a
fresh connection (so malformed framing cannot be "fixed up" by a client library) and the
set of statuses that are acceptable for it: the security answer (401/403/400/413) or the
protocol layer's refusal (400/431/501 from h11). ``200`` appears only where the request
really carries the token or targets the pre-auth ``/health``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.serve.test_security_front import raw
from tests.support.daemon import DaemonProcess, spawn_daemon

TOKEN = "hostile-TOKEN-51b"
APP = "http://app.example.com"


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    d = spawn_daemon(["--allow-origin", APP], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        yield d
    finally:
        d.stop()


Build = Callable[[int], bytes]


def req(target: str, *headers: str, method: str = "GET", host: str | None = None) -> Build:
    """A raw request; ``{P}`` in the target/headers/host is replaced by the port."""

    def build(port: int) -> bytes:
        lines = [f"{method} {target} HTTP/1.1"]
        if host != "":
            lines.append(f"Host: {host or '127.0.0.1:{P}'}")
        lines += headers
        text = "\r\n".join(lines) + "\r\n\r\n"
        return text.replace("{P}", str(port)).encode("utf-8")

    return build


def literal(data: bytes) -> Build:
    return lambda port: data.replace(b"{P}", str(port).encode())


AUTH = f"Authorization: Bearer {TOKEN}"
BAD = {401}  # the uniform refusal
H11 = {400, 431, 501}  # refused by the HTTP/1.1 parser before the app

CASES: list[tuple[str, Build, set[int]]] = [
    # -- repeated / malformed Authorization
    ("two valid Authorization headers", req("/capabilities", AUTH, AUTH), BAD),
    ("valid then invalid", req("/capabilities", AUTH, "Authorization: Bearer x"), BAD),
    ("invalid then valid", req("/capabilities", "Authorization: Bearer x", AUTH), BAD),
    ("Basic and Bearer", req("/capabilities", f"Authorization: Basic {TOKEN}", AUTH), BAD),
    ("Proxy-Authorization only", req("/capabilities", f"Proxy-Authorization: Bearer {TOKEN}"), BAD),
    ("token split by a space", req("/capabilities", f"Authorization: Bearer {TOKEN[:4]} {TOKEN[4:]}"), BAD),
    ("token plus a tab and junk", req("/capabilities", f"Authorization: Bearer {TOKEN}\tx"), BAD),
    ("tab instead of space", req("/capabilities", f"Authorization: Bearer\t{TOKEN}"), BAD),
    ("non-ASCII token", req("/capabilities", "Authorization: Bearer t\u00f6ken"), BAD),
    ("NUL after the token", literal(b"GET /capabilities HTTP/1.1\r\nHost: 127.0.0.1:{P}\r\nAuthorization: Bearer " + TOKEN.encode() + b"\x00\r\n\r\n"), H11),
    ("8 KiB credential", req("/capabilities", "Authorization: Bearer " + "A" * 9000), BAD),
    ("100 KB credential", req("/capabilities", "Authorization: Bearer " + "A" * 100_000), H11),
    ("space before the colon", req("/capabilities", f"Authorization : Bearer {TOKEN}"), H11),
    # whitespace around the value is not part of it (RFC 9110 OWS); blanks after the scheme
    # are skipped as the reference does: these carry the real token, so 200 is right.
    ("trailing blanks (OWS)", req("/capabilities", f"Authorization: Bearer {TOKEN} \t "), {200}),
    ("blanks after the scheme", req("/capabilities", f"Authorization:   Bearer \t {TOKEN}"), {200}),
    # -- Host spoofing (DNS rebinding)
    ("foreign Host", req("/health", host="evil.example"), {403}),
    ("foreign Host with the token", req("/capabilities", AUTH, host="evil.example:{P}"), {403}),
    ("Host without port", req("/health", host="127.0.0.1"), {403}),
    ("Host suffix trick", req("/health", host="127.0.0.1:{P}.evil.example"), {403}),
    ("Host userinfo trick", req("/health", host="evil.example@127.0.0.1:{P}"), {403}),
    ("full-width digits in Host", req("/health", host="127.0.0.1:\uff11\uff12"), {403}),
    ("Kelvin sign in Host", req("/health", host="host.doc\u212aer.internal:{P}"), {403}),
    ("two Host headers", req("/health", "Host: evil.example"), H11 | {403}),
    ("no Host (HTTP/1.1)", req("/health", host=""), H11),
    ("no Host (HTTP/1.0)", literal(b"GET /health HTTP/1.0\r\n\r\n"), {403}),
    ("X-Forwarded-Host is ignored", req("/capabilities", AUTH, "X-Forwarded-Host: evil.example"), {200}),
    ("absolute-form target to another host", literal(b"GET http://evil.example/health HTTP/1.1\r\nHost: evil.example\r\n\r\n"), {403}),
    ("absolute-form target is not /health", literal(b"GET http://127.0.0.1:{P}/health HTTP/1.1\r\nHost: 127.0.0.1:{P}\r\n\r\n"), BAD | {404}),
    # -- Origin
    ("Origin null", req("/health", "Origin: null"), {403}),
    ("Origin null with the token", req("/capabilities", AUTH, "Origin: null"), {403}),
    ("Cyrillic a in Origin", req("/capabilities", AUTH, "Origin: http://\u0430pp.example.com"), {403}),
    ("punycode look-alike Origin", req("/capabilities", AUTH, "Origin: http://xn--pp-7ka.example.com"), {403}),
    ("Origin with a trailing slash", req("/capabilities", AUTH, f"Origin: {APP}/"), {403}),
    ("Origin list in one header", req("/capabilities", AUTH, f"Origin: {APP}, http://evil"), {403}),
    ("two Origin headers", req("/capabilities", AUTH, f"Origin: {APP}", f"Origin: {APP}"), {403}),
    ("3000-char Origin", req("/capabilities", AUTH, "Origin: http://" + "a" * 3000 + ".com"), {403}),
    ("vertical tab in Origin", literal(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{P}\r\nOrigin: http://app.example.com\x0bx\r\n\r\n"), H11),
    ("injected CRLF in Origin", literal(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{P}\r\nOrigin: http://evil\r\nAccess-Control-Allow-Origin: *\r\n\r\n"), {403}),
    ("unlisted preflight", req("/session", "Origin: http://evil", "Access-Control-Request-Method: POST", method="OPTIONS"), {403}),
    ("self-origin without the token", req("/capabilities", "Origin: http://127.0.0.1:{P}"), BAD),
    # -- paths and methods that must not reach the pre-auth /health exemption
    ("dot segments after /health", literal(b"GET /health/../capabilities HTTP/1.1\r\nHost: 127.0.0.1:{P}\r\n\r\n"), BAD),
    ("encoded dot segments", req("/health%2F..%2Fcapabilities"), BAD),
    ("upper-case /HEALTH", req("/HEALTH"), BAD),
    ("POST /health", req("/health", method="POST"), BAD),
    ("lower-case method", literal(b"get /capabilities HTTP/1.1\r\nHost: 127.0.0.1:{P}\r\n\r\n"), BAD),
    ("unknown method", req("/capabilities", method="FOO"), BAD),
    ("CONNECT", literal(b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: 127.0.0.1:{P}\r\n\r\n"), BAD),
    ("OPTIONS *", literal(b"OPTIONS * HTTP/1.1\r\nHost: 127.0.0.1:{P}\r\n" + AUTH.encode() + b"\r\n\r\n"), {404, 405}),
    ("NUL in the path", literal(b"GET /health\x00 HTTP/1.1\r\nHost: 127.0.0.1:{P}\r\n\r\n"), H11),
    ("raw non-ASCII path", literal(b"GET /h\xc3\xa9alth HTTP/1.1\r\nHost: 127.0.0.1:{P}\r\n\r\n"), H11),
    ("malformed escape (with the token)", req("/session/%G1/prompt", AUTH, method="POST"), {400}),
    ("12 KB path", req("/" + "a" * 12_000), BAD),
    ("1000 headers", req("/health", *[f"X-H{i}: {'v' * 100}" for i in range(1000)]), H11),
    # -- bodies
    ("Content-Length not a number", req("/session", AUTH, "Content-Length: abc", method="POST"), H11),
    ("negative Content-Length", req("/session", AUTH, "Content-Length: -1", method="POST"), H11),
    ("20-digit Content-Length", req("/session", AUTH, "Content-Length: 99999999999999999999", method="POST"), {413}),
    ("unsupported Transfer-Encoding", req("/session", AUTH, "Transfer-Encoding: gzip, chunked", method="POST"), H11),
    ("garbage bytes", literal(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64), H11),
]  # fmt: skip


@pytest.mark.parametrize(("name", "build", "allowed"), CASES, ids=[c[0] for c in CASES])
def test_hostile_request(daemon: DaemonProcess, name: str, build: Build, allowed: set[int]) -> None:
    status, headers, body = raw(daemon.port, build(daemon.port))
    assert status in allowed, (name, status, body[:200])
    assert status != 500
    assert TOKEN.encode() not in body
    if "access-control-allow-origin" in headers:  # only ever the exact allowed origin
        assert headers["access-control-allow-origin"] == APP


INVALID_CLIENT_IDS = [
    "a" * 129,
    "two words",
    "caf\u00e9",
    "a\tb",
    "../etc/passwd",
    "a,b",
    "<script>",
    "id;drop",
    "\u0430bc",  # Cyrillic a
]


def test_malformed_client_ids_are_400_before_anything_happens(daemon: DaemonProcess) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for value in INVALID_CLIENT_IDS:
            response = client.post(
                "/session",
                json={"sessionScope": "thread"},
                headers=[
                    (b"Authorization", f"Bearer {TOKEN}".encode()),
                    (b"X-Qwen-Client-Id", value.encode()),
                ],
            )
            assert response.status_code == 400, value
            assert response.json()["code"] == "invalid_client_id"
        ok = client.post(
            "/session", json={"sessionScope": "thread"}, headers={**auth, "X-Qwen-Client-Id": ""}
        )
        assert ok.status_code == 200  # empty = anonymous


def test_http2_prior_knowledge_gets_the_same_checks(daemon: DaemonProcess) -> None:
    with httpx.Client(http1=False, http2=True, base_url=daemon.url, timeout=30) as client:
        assert client.get("/capabilities").status_code == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        response = client.get("/capabilities", headers=auth)
        assert response.http_version == "HTTP/2" and response.status_code == 200
        response = client.get("/capabilities", headers={**auth, "Host": "evil.example"})
        assert response.status_code == 403
        response = client.get("/capabilities", headers={**auth, "Origin": "null"})
        assert response.status_code == 403


def test_the_daemon_is_unharmed(daemon: DaemonProcess) -> None:
    """Runs last in this module: still serving, nothing crashed, no token in the log."""
    assert httpx.get(f"{daemon.url}/health", timeout=30).json() == {"status": "ok"}
    stderr = daemon.stderr()
    assert "Traceback" not in stderr
    assert "Error in ASGI Framework" not in stderr
    assert TOKEN not in stderr
