"""Bearer auth, ``--require-auth``, the CORS allowlist and token hygiene, on real daemons.

Daemon ``token_daemon``: loopback, ``QWEN_SERVER_TOKEN`` set, two ``--allow-origin``
entries. Daemon ``locked``: ``--require-auth --token`` on argv. Start-up refusals run the
real entry point and read its exit status and stderr.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve.settings import SettingsError, parse_settings
from tests.support.daemon import ROOT, DaemonProcess, spawn_daemon
from tests.support.sse import iter_events

TOKEN = "tok-SECRET-4f9a2c"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
UNAUTHORIZED = {"error": "Unauthorized"}
APP = "http://app.example.com"
DEV = "http://localhost:5173"
CORS_HEADERS = {
    "access-control-allow-methods": "GET, POST, PATCH, DELETE, OPTIONS",
    "access-control-allow-headers": (
        "Authorization, Content-Type, X-Qwen-Client-Id, Last-Event-ID, X-Qwen-Event-Epoch, Prefer"
    ),
    "access-control-max-age": "86400",
    "access-control-expose-headers": "Retry-After, X-Qwen-Event-Epoch, X-Qwen-SSE-Stream-Id",
}


@pytest.fixture(scope="module")
def token_daemon() -> Iterator[DaemonProcess]:
    d = spawn_daemon(
        ["--allow-origin", APP, "--allow-origin", DEV], env={"QWEN_SERVER_TOKEN": f"  {TOKEN}\n"}
    )
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def http(token_daemon: DaemonProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=token_daemon.url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def session(http: httpx.Client) -> dict[str, Any]:
    response = http.post("/session", json={"sessionScope": "thread"}, headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def assert_cors(response: httpx.Response, origin: str) -> None:
    assert response.headers["access-control-allow-origin"] == origin
    assert "Origin" in [v.strip() for v in response.headers["vary"].split(",")]
    for name, value in CORS_HEADERS.items():
        assert response.headers[name] == value, name
    assert "access-control-allow-credentials" not in response.headers


def assert_no_cors(response: httpx.Response) -> None:
    assert not any(h.startswith("access-control-") for h in response.headers)


# ---- bearer -------------------------------------------------------------------------------


BAD_AUTHORIZATION = [
    None,
    "",
    "Bearer",
    "Bearer wrong",
    f"Bearer {TOKEN}x",
    f"Bearer {TOKEN[:-1]}",
    f"Basic {TOKEN}",
    f"Token {TOKEN}",
    f"Bearer\t{TOKEN}",  # the scheme ends at the first space
    f"Bearer{TOKEN}",
    f"Bearer {TOKEN.upper()}",
    f"Bearer Bearer {TOKEN}",
    f"{TOKEN}",
]


@pytest.mark.parametrize("value", BAD_AUTHORIZATION)
def test_every_auth_failure_is_the_same_401(http: httpx.Client, value: str | None) -> None:
    headers = {} if value is None else {"Authorization": value}
    for method, path in (
        ("GET", "/capabilities"),
        ("POST", "/session"),
        ("GET", "/no/such/route"),  # 401, not 404: nothing is revealed before auth
        ("GET", "/daemon/status"),
        ("POST", "/health"),  # only GET/HEAD /health are pre-auth
    ):
        response = http.request(method, path, headers=headers, json={})
        assert response.status_code == 401, (value, method, path)
        assert response.json() == UNAUTHORIZED
        assert TOKEN not in response.text


def test_scheme_is_case_insensitive_and_leading_blanks_are_skipped(http: httpx.Client) -> None:
    for value in (f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER {TOKEN}", f"Bearer   {TOKEN}"):
        response = http.get("/capabilities", headers={"Authorization": value})
        assert response.status_code == 200, value


def test_health_is_pre_auth_on_loopback(http: httpx.Client) -> None:
    assert http.get("/health").json() == {"status": "ok"}
    assert http.head("/health").status_code == 200
    assert http.get("/health", params={"deep": "1"}).status_code == 200
    assert http.get("/health", headers={"Authorization": "Bearer wrong"}).status_code == 200


def test_strict_routes_pass_the_gate_with_the_token(
    http: httpx.Client, session: dict[str, Any]
) -> None:
    sid = session["sessionId"]
    response = http.patch(f"/session/{sid}/metadata", json={"displayName": "named"})
    assert response.status_code == 401 and response.json() == UNAUTHORIZED
    response = http.patch(f"/session/{sid}/metadata", json={"displayName": "named"}, headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.json()["displayName"] == "named"
    response = http.post(f"/session/{sid}/approval-mode", json={"mode": "default"}, headers=AUTH)
    assert response.status_code != 401, response.text
    assert response.json().get("code") != "token_required"


# ---- CORS allowlist -----------------------------------------------------------------------


def test_allowed_origins_get_cors_headers_on_every_kind_of_response(http: httpx.Client) -> None:
    ok = http.get("/capabilities", headers={**AUTH, "Origin": APP})
    assert ok.status_code == 200
    assert_cors(ok, APP)
    # The browser's spelling is echoed (matching is case-insensitive).
    loud = http.get("/capabilities", headers={**AUTH, "Origin": "http://APP.example.COM"})
    assert_cors(loud, "http://APP.example.COM")
    # Errors carry them too, so a browser can read a 401 or a 404.
    unauthorized = http.get("/capabilities", headers={"Origin": DEV})
    assert unauthorized.status_code == 401 and unauthorized.json() == UNAUTHORIZED
    assert_cors(unauthorized, DEV)
    missing = http.get("/no/such/route", headers={**AUTH, "Origin": APP})
    assert missing.status_code == 404
    assert_cors(missing, APP)
    health = http.get("/health", headers={"Origin": APP})
    assert health.status_code == 200
    assert_cors(health, APP)


async def test_sse_streams_carry_cors_headers(
    token_daemon: DaemonProcess, session: dict[str, Any]
) -> None:
    sid = session["sessionId"]
    async with httpx.AsyncClient(base_url=token_daemon.url, timeout=30) as client:
        async with client.stream(
            "GET",
            f"/session/{sid}/events",
            headers={**AUTH, "Origin": APP, "Last-Event-ID": "0"},
        ) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            assert_cors(stream, APP)
            async for event in iter_events(stream):
                if event.get("type") == "replay_complete":
                    break


def test_preflight_is_204_without_auth(http: httpx.Client) -> None:
    for extra in (
        {"Access-Control-Request-Method": "POST"},
        {"Access-Control-Request-Headers": "authorization, content-type"},
    ):
        response = http.options("/session", headers={"Origin": APP, **extra})
        assert response.status_code == 204 and response.content == b""
        assert_cors(response, APP)
    # A plain OPTIONS from an allowed origin is not a preflight: it goes on to auth/routing.
    plain = http.options("/session", headers={"Origin": APP})
    assert plain.status_code == 401
    assert_cors(plain, APP)


def test_unlisted_origins_are_refused_without_cors_headers(http: httpx.Client) -> None:
    for origin in (
        "http://evil.example.com",
        "https://app.example.com",  # another scheme is another origin
        "http://app.example.com:8080",
        "http://app.example.com.evil.example",
        "http://localhost:5174",
        "null",
    ):
        for headers in ({**AUTH}, {"Access-Control-Request-Method": "GET"}):
            method = "GET" if "Authorization" in headers else "OPTIONS"
            response = http.request(method, "/capabilities", headers={**headers, "Origin": origin})
            assert response.status_code == 403, origin
            assert response.json() == {"error": "Request denied by CORS policy"}
            assert response.headers["vary"] == "Origin"
            assert_no_cors(response)


def test_capabilities_advertise_allow_origin_but_never_the_list(http: httpx.Client) -> None:
    response = http.get("/capabilities", headers=AUTH)
    features = response.json()["features"]
    assert "allow_origin" in features
    assert "require_auth" not in features and "rate_limit" not in features
    assert "app.example.com" not in response.text and "5173" not in response.text


# ---- token hygiene ------------------------------------------------------------------------


def test_the_token_never_shows_up_in_bodies_status_or_logs(
    token_daemon: DaemonProcess, http: httpx.Client, session: dict[str, Any]
) -> None:
    sid = session["sessionId"]
    probes = [
        http.get(f"/no/route/{TOKEN}", headers=AUTH),
        http.get("/capabilities", params={"token": TOKEN}, headers=AUTH),
        http.post("/session", json={"sessionScope": TOKEN}, headers=AUTH),
        http.post(f"/session/{sid}/prompt", json={"prompt": TOKEN}, headers=AUTH),
        http.post("/session", headers={**AUTH, "X-Qwen-Client-Id": f"{TOKEN} x"}, json={}),
        http.get("/daemon/status", headers=AUTH),
        http.get("/daemon/status", params={"detail": "full"}, headers=AUTH),
        http.get("/daemon/status", params={"detail": TOKEN}, headers=AUTH),
        http.get("/capabilities", headers=AUTH),
        http.get("/health", params={"deep": "1"}),
    ]
    for response in probes:
        assert response.status_code < 500, response.text
        assert TOKEN not in response.text, response.request.url
    status = http.get("/daemon/status", params={"detail": "full"}, headers=AUTH)
    assert status.status_code == 200
    assert status.json()["security"]["tokenConfigured"] is True
    assert TOKEN not in token_daemon.stderr()


@pytest.fixture(scope="module")
def locked() -> Iterator[DaemonProcess]:
    d = spawn_daemon(["--require-auth", "--token", "argv-TOKEN-77"])
    try:
        yield d
    finally:
        d.stop()


def test_require_auth_covers_health_and_capabilities(locked: DaemonProcess) -> None:
    with httpx.Client(base_url=locked.url, timeout=30) as client:
        for path in ("/health", "/health?deep=1", "/capabilities"):
            response = client.get(path)
            assert response.status_code == 401 and response.json() == UNAUTHORIZED, path
        auth = {"Authorization": "Bearer argv-TOKEN-77"}
        assert client.get("/health", headers=auth).json() == {"status": "ok"}
        features = client.get("/capabilities", headers=auth).json()["features"]
        assert "require_auth" in features and "allow_origin" not in features
        # Strict routes: the global 401 answers first (never token_required here).
        response = client.patch("/session/nope/metadata", json={"displayName": "x"})
        assert response.status_code == 401 and response.json() == UNAUTHORIZED
        # With the token, the gate passes and the route answers (unknown session).
        response = client.patch("/session/nope/metadata", json={"displayName": "x"}, headers=auth)
        assert response.status_code == 404


def test_token_on_argv_warns_without_printing_it(locked: DaemonProcess) -> None:
    stderr = locked.stderr()
    assert "--token on the command line is visible" in stderr
    assert "argv-TOKEN-77" not in stderr


# ---- start-up ---------------------------------------------------------------------------


def _run_main(args: list[str], tmp: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "serve", "--port", "0", "--workspace", str(tmp), *args],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, proc.stderr


def test_startup_refusals_exit_1_naming_the_value(tmp_path: Path) -> None:
    code, stderr = _run_main(["--allow-origin", "http://app.example.com/"], tmp_path, {})
    assert code == 1
    assert stderr.startswith("acp-serve: ")
    assert '"http://app.example.com/"' in stderr and "http://app.example.com" in stderr
    code, stderr = _run_main(["--require-auth"], tmp_path)
    assert code == 1 and "--require-auth" in stderr
    code, stderr = _run_main([], tmp_path, {"QWEN_SERVER_TOKEN": "bad\x01token"})
    assert code == 1 and "QWEN_SERVER_TOKEN" in stderr and "bad\x01token" not in stderr


REFUSALS: list[tuple[list[str], dict[str, str], str]] = [
    (["--allow-origin", "http://app.example.com/"], {}, "trailing slash"),
    (["--allow-origin", "HTTP://app.example.com"], {}, "http://app.example.com"),
    (["--allow-origin", "http://app.example.com/path"], {}, "path"),
    (["--allow-origin", "http://user@app.example.com"], {}, "userinfo"),
    (["--allow-origin", "http://app.example.com:80"], {}, "default port"),
    (["--allow-origin", "app.example.com"], {}, "app.example.com"),
    (["--allow-origin", "*"], {}, "'*'"),
    (["--allow-origin", "http://app.example.com"], {}, "non-loopback origin"),
    (["--require-auth"], {}, "--require-auth"),
    (["--require-auth", "--token", "   "], {}, "--require-auth"),
    (["--hostname", "127.0.0.1:4170"], {}, "host:port"),
    (["--hostname", "  "], {}, "--hostname"),
    (["--hostname", "0.0.0.0", "--token", ""], {}, "without a bearer token"),
    (["--hostname", "0.0.0.0"], {"QWEN_SERVER_TOKEN": " "}, "without a bearer token"),
    ([], {"QWEN_SERVER_TOKEN": "caf\u00e9"}, "QWEN_SERVER_TOKEN"),
    (["--token", "a\nb"], {}, "--token"),
    (["--rate-limit-window-ms", "999"], {}, "999"),
    (["--rate-limit-read", "0"], {}, "--rate-limit-read"),
    ([], {"QWEN_SERVE_RATE_LIMIT_PROMPT": "ten"}, "QWEN_SERVE_RATE_LIMIT_PROMPT"),
]


@pytest.mark.parametrize(("args", "env", "named"), REFUSALS)
def test_startup_refusal_table(
    tmp_path: Path, args: list[str], env: dict[str, str], named: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        parse_settings(["--workspace", str(tmp_path), *args], env)
    assert named in str(caught.value)


ACCEPTED: list[tuple[list[str], dict[str, str]]] = [
    (["--allow-origin", "http://localhost:5173"], {}),  # loopback origin without a token
    (["--allow-origin", "http://[::1]:8080", "--allow-origin", "http://127.0.0.1:3000"], {}),
    (["--allow-origin", "*"], {"QWEN_SERVER_TOKEN": "t"}),
    (["--allow-origin", "https://app.example.com"], {"QWEN_SERVER_TOKEN": "t"}),
    (["--require-auth"], {"QWEN_SERVER_TOKEN": "t"}),
]


@pytest.mark.parametrize(("args", "env"), ACCEPTED)
def test_startup_accepts(tmp_path: Path, args: list[str], env: dict[str, str]) -> None:
    parse_settings(["--workspace", str(tmp_path), *args], env)


def test_token_resolution(tmp_path: Path) -> None:
    ws = ["--workspace", str(tmp_path)]
    s = parse_settings([*ws, "--token", " flag "], {"QWEN_SERVER_TOKEN": "env"})
    assert (s.token, s.token_from_argv) == ("flag", True)
    s = parse_settings(ws, {"QWEN_SERVER_TOKEN": "\ufeff env \t"})
    assert (s.token, s.token_from_argv) == ("env", False)
    s = parse_settings([*ws, "--token", ""], {"QWEN_SERVER_TOKEN": "env"})
    assert s.token is None and not s.token_from_argv  # the flag wins, even empty
    generated = parse_settings([*ws, "--hostname", "0.0.0.0"], {})
    assert generated.token_generated and generated.token and len(generated.token) == 22
    assert generated.token not in repr(generated)
    assert not parse_settings([*ws, "--hostname", "::1"], {}).token_generated


_FAKE_DAEMON = textwrap.dedent(
    """
    import sys, trio
    import serve.runtime.daemon

    class FakeDaemon:
        def __init__(self, settings, config=None, *, reaper=False):
            self.settings = settings

        async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
            task_status.started(["http://0.0.0.0:1"])

    serve.runtime.daemon.Daemon = FakeDaemon
    from serve.__main__ import main
    sys.exit(main(sys.argv[1:]))
    """
)


def test_non_loopback_bind_without_token_prints_a_generated_one_once(tmp_path: Path) -> None:
    """The real entry point, with the daemon replaced so nothing binds a public address."""
    proc = subprocess.run(
        [sys.executable, "-c", _FAKE_DAEMON, "--hostname", "0.0.0.0", "--workspace", str(tmp_path)],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "generated bearer token" in line]
    assert len(lines) == 1
    token = lines[0].rsplit(" ", 1)[1]
    assert len(token) == 22
    assert proc.stderr.count(token) == 1 and token not in proc.stdout
