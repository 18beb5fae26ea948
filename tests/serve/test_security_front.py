"""The security front of a default daemon (loopback, no token) against the real process.

Host allowlist, self-origin strip, the CORS wall, ``Origin: null``, the strict gate (seed
semantics: refused without a token even on loopback, nothing changed), malformed percent
encoding, the 10 MB body limit with keep-alive, chunked bodies, and the capability tags
that must be absent. One daemon for the whole module.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from serve.http.security import STRICT_ROUTES
from serve.runtime.daemon import workspace_id
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until

TOKEN_REQUIRED = {
    "error": (
        "This route requires the daemon to be configured with a bearer token. "
        "Set QWEN_SERVER_TOKEN or pass --token to enable bearer auth."
    ),
    "code": "token_required",
}
TOO_LARGE = {"error": "Request body too large (max 10 MB)"}
MALFORMED = {"error": "Malformed URL encoding", "code": "invalid_request"}
CORS_DENIED = {"error": "Request denied by CORS policy"}
INVALID_HOST = {"error": "Invalid Host header"}
MB = 1024 * 1024


# ---- a tiny HTTP/1.1 client over one raw socket (keep-alive is the point) -----------------


class RawConnection:
    """One TCP connection; ``exchange`` writes bytes and reads exactly one response."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.reader = self.sock.makefile("rb")

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    def exchange(self, data: bytes, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
        self.sock.sendall(data)
        if body:
            self.sock.sendall(body)
        return self.read_response()

    def read_response(self) -> tuple[int, dict[str, str], bytes]:
        status_line = self.reader.readline()
        if not status_line:
            raise ConnectionError("connection closed before a response")
        status = int(status_line.split()[1])
        headers: dict[str, str] = {}
        while True:
            line = self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        return status, headers, self.reader.read(length) if length else b""


def raw(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send one raw request on a fresh connection; return the response."""
    conn = RawConnection(port)
    try:
        return conn.exchange(data)
    finally:
        conn.close()


def request_bytes(
    method: str, target: str, host: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body and "Transfer-Encoding" not in (headers or {}):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


# ---- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    d = spawn_daemon()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def http(daemon: DaemonProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def session(http: httpx.Client) -> dict[str, Any]:
    response = http.post("/session", json={"sessionScope": "thread"})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


# ---- Host allowlist -----------------------------------------------------------------------


def test_host_allowlist_accepts_only_the_daemons_own_names(daemon: DaemonProcess) -> None:
    port = daemon.port
    for host in (
        f"127.0.0.1:{port}",
        f"localhost:{port}",
        f"LOCALHOST:{port}",
        f"[::1]:{port}",
        f"host.docker.internal:{port}",
    ):
        status, _, body = raw(port, request_bytes("GET", "/health", host))
        assert (status, body) == (200, b'{"status":"ok"}'), host
    for host in (
        "evil.example",
        f"evil.example:{port}",
        "127.0.0.1",  # no port
        f"127.0.0.1:{port + 1}",
        f"127.0.0.2:{port}",
        f"127.0.0.1:{port}.evil.example",
        f"localhost:{port}@evil.example",
        f"host.doc\u212aer.internal:{port}",  # Kelvin sign: str.lower() would fold it
        f"0x7f.1:{port}",
    ):
        status, headers, body = raw(
            port, request_bytes("GET", "/health", host.encode().decode("latin-1"))
        )
        assert status == 403, host
        assert httpx.Response(403, content=body).json() == INVALID_HOST
        assert not any(h.startswith("access-control-") for h in headers)


def test_host_check_runs_before_auth_and_cors(daemon: DaemonProcess) -> None:
    status, headers, body = raw(
        daemon.port,
        request_bytes("GET", "/capabilities", "evil.example", {"Origin": "http://evil.example"}),
    )
    assert status == 403 and body == b'{"error":"Invalid Host header"}'
    assert "vary" not in headers


# ---- Origin handling ----------------------------------------------------------------------


def test_self_origins_are_stripped_so_the_daemons_own_pages_work(
    daemon: DaemonProcess, http: httpx.Client
) -> None:
    port = daemon.port
    for origin in (
        f"http://127.0.0.1:{port}",
        f"http://localhost:{port}",
        f"http://[::1]:{port}",
        f"https://127.0.0.1:{port}",
        f"http://host.docker.internal:{port}",
    ):
        response = http.get("/capabilities", headers={"Origin": origin})
        assert response.status_code == 200, origin
        assert "access-control-allow-origin" not in response.headers
    # Not the daemon's own origin: another port, another scheme-less form, upper case.
    for origin in (
        f"http://127.0.0.1:{port + 1}",
        "http://127.0.0.1",
        f"http://LOCALHOST:{port}",
        f"http://127.0.0.1:{port}/",
    ):
        response = http.get("/capabilities", headers={"Origin": origin})
        assert response.status_code == 403, origin


def test_cors_wall_refuses_every_foreign_origin_without_cors_headers(http: httpx.Client) -> None:
    for origin in ("http://app.example.com", "null", "*", "", "file://", "http://localhost"):
        for method, path in (("GET", "/health"), ("GET", "/capabilities"), ("POST", "/session")):
            response = http.request(method, path, headers={"Origin": origin}, json={})
            assert response.status_code == 403, (origin, method, path)
            assert response.json() == CORS_DENIED
            assert response.headers["vary"] == "Origin"
            assert not any(h.startswith("access-control-") for h in response.headers)
    # A preflight is refused the same way (there is no allowlist at all).
    response = http.options(
        "/session",
        headers={"Origin": "http://app.example.com", "Access-Control-Request-Method": "POST"},
    )
    assert response.status_code == 403 and response.json() == CORS_DENIED


def test_cors_denial_creates_nothing(daemon: DaemonProcess, http: httpx.Client) -> None:
    before = http.get(f"/workspace/{workspace_id(str(daemon.workspace))}/sessions").json()
    response = http.post(
        "/session", json={"sessionScope": "thread"}, headers={"Origin": "http://evil.example"}
    )
    assert response.status_code == 403
    after = http.get(f"/workspace/{workspace_id(str(daemon.workspace))}/sessions").json()
    assert len(after["sessions"]) == len(before["sessions"])


# ---- the strict gate ----------------------------------------------------------------------


async def test_strict_routes_refuse_without_a_token_and_change_nothing(
    daemon: DaemonProcess, session: dict[str, Any]
) -> None:
    sid = session["sessionId"]
    client_id = session["clientId"]
    async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
        attempts = [
            ("PATCH", f"/session/{sid}/metadata", {"displayName": "renamed"}),
            ("POST", f"/session/{sid}/approval-mode", {"mode": "yolo"}),
            # Even for a session that does not exist and a malformed body: gate first.
            ("PATCH", "/session/nope/metadata", {"displayName": "x"}),
            ("POST", "/session/nope/approval-mode", None),
        ]
        for method, path, body in attempts:
            for headers in ({}, {"X-Qwen-Client-Id": client_id}, {"Authorization": "Bearer x"}):
                response = await client.request(method, path, json=body, headers=headers)
                assert response.status_code == 401, (method, path, response.text)
                assert response.json() == TOKEN_REQUIRED
        listed = await client.get(f"/workspace/{workspace_id(str(daemon.workspace))}/sessions")
        mine = [s for s in listed.json()["sessions"] if s["sessionId"] == sid]
        assert mine and mine[0]["displayName"] == sid  # not renamed
        async with client.stream(
            "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
        ) as stream:
            events = await collect_until(stream, lambda e: e["type"] == "replay_complete")
    kinds = {e["type"] for e in events}
    assert "approval_mode_changed" not in kinds
    assert "session_metadata_updated" not in kinds


def test_every_declared_strict_route_that_exists_is_gated(
    daemon: DaemonProcess, http: httpx.Client
) -> None:
    """Walk STRICT_ROUTES: a route that is registered answers token_required; one that is
    not registered yet answers 404/405 (it lands gated because the gate keys on the rule)."""
    gated = 0
    for route in STRICT_ROUTES:
        path = route.rule.replace("<id>", "nope").replace("<name>", "n").replace("<server>", "s")
        response = http.request(route.method, path, json={})
        if response.status_code in (404, 405) and response.json().get("code") != "token_required":
            continue  # not implemented in this tree yet
        assert response.status_code == 401, (route, response.text)
        assert response.json() == TOKEN_REQUIRED
        gated += 1
    assert gated >= 2  # metadata and approval-mode exist today


# ---- input limits -------------------------------------------------------------------------


def test_malformed_percent_encoding_is_400_invalid_request(daemon: DaemonProcess) -> None:
    port = daemon.port
    host = f"127.0.0.1:{port}"
    for target in (
        "/session/%zz/prompt",
        "/session/abc%/prompt",
        "/session/abc%4/prompt",
        "/session/%ff%fe/metadata",  # not UTF-8
        "/session/%C3%28/prompt",  # invalid continuation byte
        "/%",
    ):
        status, _, body = raw(port, request_bytes("POST", target, host, body=b"{}"))
        assert status == 400, target
        assert httpx.Response(400, content=body).json() == MALFORMED
    # Well-formed escapes are fine (the route decides: an unknown session is 404).
    status, _, body = raw(port, request_bytes("POST", "/session/a%20b/prompt", host, body=b"{}"))
    assert status in (400, 404) and b"Malformed" not in body
    status, _, _ = raw(port, request_bytes("GET", "/%68ealth", host))
    assert status == 200


def test_oversized_body_is_413_and_the_connection_stays_usable(daemon: DaemonProcess) -> None:
    host = f"127.0.0.1:{daemon.port}"
    conn = RawConnection(daemon.port)
    try:
        body = b"[" + b"0," * (11 * MB // 2) + b"0]"
        head = request_bytes("POST", "/session", host, {"Content-Type": "application/json"})
        head = head.replace(b"\r\n\r\n", f"\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        status, headers, payload = conn.exchange(head, body)
        assert status == 413
        assert httpx.Response(413, content=payload).json() == TOO_LARGE
        assert headers.get("connection", "").lower() != "close"
        # The next request on the same connection works.
        status, _, payload = conn.exchange(request_bytes("GET", "/health", host))
        assert (status, payload) == (200, b'{"status":"ok"}')
        # Exactly at the limit is not "too large" (the route answers; not valid JSON → 400).
        exact = b"{" + b" " * (10 * MB - 2) + b"}"
        status, _, payload = conn.exchange(
            request_bytes("POST", "/session/nope/prompt", host, body=exact)
        )
        assert status != 413 and b"too large" not in payload
        status, _, _ = conn.exchange(request_bytes("GET", "/health", host))
        assert status == 200
    finally:
        conn.close()


def test_oversized_body_with_httpx_single_connection(daemon: DaemonProcess) -> None:
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    with httpx.Client(base_url=daemon.url, limits=limits, timeout=30) as client:
        response = client.post(
            "/session", content=b"x" * (10 * MB + 1), headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 413 and response.json() == TOO_LARGE
        assert client.get("/health").json() == {"status": "ok"}


def test_huge_declared_body_is_refused_at_once_and_the_connection_closed(
    daemon: DaemonProcess,
) -> None:
    """A 1 GB Content-Length is answered without reading (or buffering) the body."""
    host = f"127.0.0.1:{daemon.port}"
    conn = RawConnection(daemon.port)
    try:
        head = request_bytes("POST", "/session", host, {"Content-Length": str(1024 * MB)})
        status, headers, payload = conn.exchange(head)
        assert status == 413 and httpx.Response(413, content=payload).json() == TOO_LARGE
        assert headers["connection"].lower() == "close"
        assert conn.reader.read(1) == b""  # and the server really closed it
    finally:
        conn.close()


def test_no_response_leaves_before_the_body_arrived(daemon: DaemonProcess) -> None:
    """Headers first, body later: refusals (strict gate, 404) wait for the body, so the
    keep-alive connection is still usable afterwards."""
    host = f"127.0.0.1:{daemon.port}"
    body = b'{"displayName": "x"}'
    conn = RawConnection(daemon.port)
    try:
        for method, target, expected in (
            ("PATCH", "/session/nope/metadata", 401),
            ("POST", "/nothing/here", 404),
            ("POST", "/session/nope/heartbeat", 404),
        ):
            head = request_bytes(method, target, host, {"Content-Length": str(len(body))})
            conn.sock.sendall(head)
            conn.sock.settimeout(0.2)
            try:
                early = conn.sock.recv(1, socket.MSG_PEEK)
            except TimeoutError:
                early = b""
            conn.sock.settimeout(30)
            assert early == b"", target  # nothing answered before the body was sent
            status, _, _ = conn.exchange(b"", body)
            assert status == expected, target
            status, _, payload = conn.exchange(request_bytes("GET", "/health", host))
            assert (status, payload) == (200, b'{"status":"ok"}')
    finally:
        conn.close()


def _chunked(body: bytes, chunk: int = 256 * 1024) -> bytes:
    out = bytearray()
    for i in range(0, len(body), chunk):
        piece = body[i : i + chunk]
        out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    return bytes(out + b"0\r\n\r\n")


def test_chunked_bodies_are_bounded_and_replayed(daemon: DaemonProcess) -> None:
    host = f"127.0.0.1:{daemon.port}"
    conn = RawConnection(daemon.port)
    try:
        chunked = {"Transfer-Encoding": "chunked", "Content-Type": "application/json"}
        # A small chunked body reaches the route intact (it validates the field).
        status, _, payload = conn.exchange(
            request_bytes("POST", "/session", host, chunked),
            _chunked(b'{"sessionScope": "bogus"}', chunk=5),
        )
        assert status == 400
        assert httpx.Response(400, content=payload).json()["code"] == "invalid_session_scope"
        # More than 10 MB in chunks: 413, and the connection still serves the next request.
        status, _, payload = conn.exchange(
            request_bytes("POST", "/session", host, chunked), _chunked(b"x" * (11 * MB))
        )
        assert status == 413 and httpx.Response(413, content=payload).json() == TOO_LARGE
        status, _, _ = conn.exchange(request_bytes("GET", "/health", host))
        assert status == 200
    finally:
        conn.close()


def test_security_tags_are_absent_by_default(http: httpx.Client) -> None:
    features = http.get("/capabilities").json()["features"]
    assert "require_auth" not in features
    assert "allow_origin" not in features
    assert "rate_limit" not in features


def test_max_body_bytes_is_a_setting_and_the_413_names_it() -> None:
    """``--max-body-bytes 1000``: 1000 bytes pass the front, 1001 are 413 naming the limit."""
    small = spawn_daemon(["--max-body-bytes", "1000"])
    try:
        with httpx.Client(base_url=small.url, timeout=30) as client:
            over = client.post("/session", content=b" " * 1001)
            assert over.status_code == 413
            assert over.json() == {"error": "Request body too large (max 1000 bytes)"}
            at = client.post("/session", content=b" " * 998 + b"{}")
            assert at.status_code == 200, at.text
    finally:
        small.stop()
