"""The security front in-process: deployments a test may not start for real, and the walk.

A throwaway QuartTrio app with the real middleware, driven through ``httpx.ASGITransport``
(a real ASGI scope, ``raw_path`` included). Used for what the process tests cannot do
safely or cheaply: walking every declared strict route (most are not implemented yet),
non-loopback binds (no public socket is ever opened), ``--allow-origin '*'``, per-IP rate
limit keys, WebSocket scopes; plus the pure helpers added for the middleware.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from quart import Blueprint
from quart_trio import QuartTrio

from serve.host import FrontStats
from serve.http import middleware
from serve.http.middleware import install_middleware, malformed_path, rate_limit_hits, rate_limiter
from serve.http.security import STRICT_ROUTES, RateLimiter
from serve.http.security.cors import is_self_origin, self_origins
from serve.logs import install_redaction
from serve.ratelimit import limiter_for
from serve.settings import RateLimitSettings, Settings

TOKEN = "inproc-TOKEN-3"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
AUTH_VALUE = f"Bearer {TOKEN}".encode()
TOKEN_REQUIRED_CODE = "token_required"

# Non-strict neighbours of strict routes: same paths, other methods, other suffixes.
NEIGHBOURS = [
    ("GET", "/session/<id>/metadata"),
    ("POST", "/session/<id>/heartbeat"),
    ("GET", "/workspace/settings"),
    ("GET", "/workspace/memory"),
    ("GET", "/workspace/mcp/servers"),
    ("POST", "/file/read"),
    ("POST", "/session/<id>/approval-mode/preview"),
]


def _concrete(rule: str) -> str:
    out = []
    for part in rule.split("/"):
        out.append("p1" if part.startswith("<") else part)
    return "/".join(out)


def make_app(settings: Settings, calls: list[str], port: int = 4170) -> tuple[QuartTrio, Any]:
    """An app with a throwaway blueprint holding every strict rule and its neighbours."""
    app = QuartTrio("security-test")
    app.config.update(MAX_CONTENT_LENGTH=10 * 1024 * 1024, PROVIDE_AUTOMATIC_OPTIONS=False)
    blueprint = Blueprint("throwaway", __name__)
    seen: set[tuple[str, str]] = set()
    rules = [(r.method, r.rule) for r in STRICT_ROUTES] + NEIGHBOURS
    # Parameter names differ from the declared list on purpose (<session_id>, <string:x>).
    rules.append(("POST", "/session/<string:session_id>/shell"))
    for index, (method, rule) in enumerate(rules):
        if (method, rule) in seen:
            continue
        seen.add((method, rule))

        async def handler(_tag: str = f"{method} {rule}", **_: Any) -> dict[str, str]:
            calls.append(_tag)
            return {"handled": _tag}

        blueprint.add_url_rule(rule, f"r{index}", handler, methods=[method])
    app.register_blueprint(blueprint)
    front = FrontStats(rate_limiter=limiter_for(settings.rate_limit))
    daemon = SimpleNamespace(settings=settings, port=port, draining=False, front=front)
    install_middleware(app, daemon)  # type: ignore[arg-type]
    return app, daemon


@pytest.fixture(autouse=True)
def _no_leftover_redaction() -> Iterator[None]:
    yield
    install_redaction([])


def client(
    app: QuartTrio, host: str = "127.0.0.1:4170", ip: str = "127.0.0.1"
) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(ip, 40000))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url=f"http://{host}")


# ---- the strict gate, walked ----------------------------------------------------------------


async def test_every_strict_route_is_refused_before_its_handler_without_a_token() -> None:
    calls: list[str] = []
    app, _ = make_app(Settings(workspaces=("/tmp",)), calls)
    async with client(app) as c:
        for route in STRICT_ROUTES:
            for headers in ({}, AUTH):
                response = await c.request(
                    route.method, _concrete(route.rule), json={"x": 1}, headers=headers
                )
                assert response.status_code == 401, route
                assert response.json()["code"] == TOKEN_REQUIRED_CODE
            if route.method == "GET":  # HEAD is gated like GET
                head = await c.head(_concrete(route.rule))
                assert head.status_code == 401, route
        response = await c.post("/session/p1/shell")  # renamed parameter: still gated
        assert response.status_code == 401
        assert calls == []
        for method, rule in NEIGHBOURS:
            response = await c.request(method, _concrete(rule), json={})
            assert response.status_code == 200, (method, rule)
    assert len(calls) == len(NEIGHBOURS)


async def test_with_a_token_strict_routes_need_only_the_bearer() -> None:
    calls: list[str] = []
    app, _ = make_app(Settings(workspaces=("/tmp",), token=TOKEN), calls)
    async with client(app) as c:
        for route in STRICT_ROUTES:
            response = await c.request(route.method, _concrete(route.rule), json={})
            assert response.status_code == 401 and response.json() == {"error": "Unauthorized"}
            response = await c.request(route.method, _concrete(route.rule), json={}, headers=AUTH)
            assert response.status_code == 200, route
    assert len(calls) == len(STRICT_ROUTES)


# ---- non-loopback binds (never bound for real in tests) --------------------------------------


async def test_non_loopback_bind_skips_the_host_allowlist_but_not_auth() -> None:
    settings = Settings(workspaces=("/tmp",), hostname="0.0.0.0", token=TOKEN)
    app, _ = make_app(settings, [])
    async with client(app, host="daemon.internal:4170") as c:
        # /health is not pre-auth off loopback.
        assert (await c.get("/workspace/settings")).status_code == 401
        assert (await c.get("/health")).status_code == 401
        response = await c.get("/workspace/settings", headers=AUTH)
        assert response.status_code == 200  # any Host is fine off loopback
        # Remote same-origin: a page served by this daemon needs the bearer, then passes
        # without CORS headers.
        same = {"Origin": "http://daemon.internal:4170"}
        response = await c.get("/workspace/settings", headers=same)
        assert response.status_code == 401 and response.json() == {"error": "Unauthorized"}
        response = await c.get("/workspace/settings", headers={**same, **AUTH})
        assert response.status_code == 200
        assert "access-control-allow-origin" not in response.headers
        # Any other origin meets the CORS wall.
        response = await c.get(
            "/workspace/settings", headers={"Origin": "http://daemon.internal:4171", **AUTH}
        )
        assert response.status_code == 403
        # Loopback self-origins are not special off loopback.
        response = await c.get(
            "/workspace/settings", headers={"Origin": "http://127.0.0.1:4170", **AUTH}
        )
        assert response.status_code == 403


async def test_non_loopback_rate_limit_keys_by_peer_ip() -> None:
    settings = Settings(
        workspaces=("/tmp",),
        hostname="0.0.0.0",
        token=TOKEN,
        rate_limit=RateLimitSettings(enabled=True, read=1, window_ms=60_000),
    )
    app, daemon = make_app(settings, [])
    async with client(app, ip="10.0.0.1") as a, client(app, ip="10.0.0.2") as b:
        assert (await a.get("/workspace/settings", headers=AUTH)).status_code == 200
        assert (await a.get("/workspace/settings", headers=AUTH)).status_code == 429
        # Another address is another key; a client id is not (issue 22 item 17).
        assert (await b.get("/workspace/settings", headers=AUTH)).status_code == 200
        who = {**AUTH, "X-Qwen-Client-Id": "c1"}
        assert (await a.get("/workspace/settings", headers=who)).status_code == 429
    assert rate_limit_hits(daemon)["read"] == 2


async def test_rate_limit_keys_by_forwarded_address_only_from_a_trusted_proxy() -> None:
    settings = Settings(
        workspaces=("/tmp",),
        hostname="0.0.0.0",
        token=TOKEN,
        rate_limit=RateLimitSettings(enabled=True, read=1, window_ms=60_000),
        trusted_proxies=("10.0.0.9/32",),
    )
    app, _daemon = make_app(settings, [])
    async with client(app, ip="10.0.0.9") as proxy, client(app, ip="10.0.0.1") as direct:
        for n in (1, 2):  # two clients behind the proxy: two keys
            via = {**AUTH, "X-Forwarded-For": f"203.0.113.{n}"}
            assert (await proxy.get("/workspace/settings", headers=via)).status_code == 200
        via = {**AUTH, "X-Forwarded-For": "203.0.113.1"}
        assert (await proxy.get("/workspace/settings", headers=via)).status_code == 429
        # An untrusted peer's header is ignored: it cannot mint keys.
        for n, status in ((3, 200), (4, 429)):
            spoof = {**AUTH, "X-Forwarded-For": f"203.0.113.{n}"}
            assert (await direct.get("/workspace/settings", headers=spoof)).status_code == status


async def test_draining_daemons_are_not_rate_limited() -> None:
    settings = Settings(
        workspaces=("/tmp",), rate_limit=RateLimitSettings(enabled=True, read=1, window_ms=1000)
    )
    app, daemon = make_app(settings, [])
    daemon.draining = True
    async with client(app) as c:
        for _ in range(5):
            assert (await c.get("/workspace/settings")).status_code == 200


# ---- --allow-origin '*' ----------------------------------------------------------------------


async def test_wildcard_echoes_the_origin_and_still_refuses_null(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings(workspaces=("/tmp",), token=TOKEN, allow_origins=("*",))
    with caplog.at_level(logging.WARNING, logger="serve.http.middleware"):
        app, _ = make_app(settings, [])
    assert any("--allow-origin '*'" in r.getMessage() for r in caplog.records)
    async with client(app) as c:
        for origin in ("http://a.example", "https://b.example:8443", "http://LOUD.example"):
            response = await c.get("/workspace/settings", headers={"Origin": origin, **AUTH})
            assert response.status_code == 200
            assert response.headers["access-control-allow-origin"] == origin
        for origin in ("null", "http://\u00e4.example", "http://" + "a" * 3000):
            response = await c.get(
                "/workspace/settings",
                headers=[(b"Origin", origin.encode()), (b"Authorization", AUTH_VALUE)],
            )
            assert response.status_code == 403, origin
            assert "access-control-allow-origin" not in response.headers
        preflight = await c.options(
            "/file/write",
            headers={"Origin": "http://a.example", "Access-Control-Request-Method": "POST"},
        )
        assert preflight.status_code == 204


async def test_vary_is_merged_not_duplicated() -> None:
    app = QuartTrio("vary")
    app.config.update(MAX_CONTENT_LENGTH=1024)

    @app.get("/v")
    async def vary() -> Any:
        return {"ok": True}, 200, {"Vary": "Accept-Encoding"}

    settings = Settings(workspaces=("/tmp",), token=TOKEN, allow_origins=("http://a.example",))
    host = SimpleNamespace(settings=settings, port=4170, draining=False, front=FrontStats())
    install_middleware(app, host)  # type: ignore[arg-type]
    async with client(app) as c:
        response = await c.get("/v", headers={"Origin": "http://a.example", **AUTH})
        assert response.headers.get_list("vary") == ["Accept-Encoding, Origin"]


# ---- WebSocket and lifespan scopes -----------------------------------------------------------


async def _websocket(app: QuartTrio, headers: list[tuple[bytes, bytes]]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    inbox = [{"type": "websocket.connect"}]

    async def receive() -> dict[str, Any]:
        return inbox.pop(0) if inbox else {"type": "websocket.disconnect", "code": 1000}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "websocket",
        "path": "/ws",
        "raw_path": b"/ws",
        "query_string": b"",
        "headers": headers,
        "scheme": "ws",
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 4170),
        "subprotocols": [],
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "root_path": "",
        "extensions": {},
    }
    await app.asgi_app(scope, receive, send)  # type: ignore[arg-type]
    return sent


async def test_websockets_get_host_origin_and_bearer_checks() -> None:
    app, _ = make_app(Settings(workspaces=("/tmp",), token=TOKEN), [])
    good_host = (b"host", b"127.0.0.1:4170")
    auth = (b"authorization", f"Bearer {TOKEN}".encode())
    for headers in (
        [(b"host", b"evil.example"), auth],
        [good_host],
        [good_host, auth, (b"origin", b"http://evil.example")],
    ):
        sent = await _websocket(app, headers)
        assert sent == [{"type": "websocket.close", "code": 1008}], headers
    # Passing all checks, the app itself answers (no such route here: not a 1008 close).
    sent = await _websocket(app, [good_host, auth])
    assert sent != [{"type": "websocket.close", "code": 1008}]


# ---- pure helpers and accessors --------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "bad"),
    [
        (b"/health", False),
        (b"/session/a%20b", False),
        (b"/%E2%82%AC", False),
        (b"/workspace/%2Ftmp%2Fx/sessions", False),
        (b"/%", True),
        (b"/%4", True),
        (b"/%zz", True),
        (b"/%4g", True),
        (b"/%ff", True),
        (b"/%C3%28", True),
        (b"/%E2%82", True),
        (b"/%ED%A0%80", True),  # a UTF-16 surrogate is not UTF-8
    ],
)
def test_malformed_path(raw: bytes, bad: bool) -> None:
    assert malformed_path(raw) is bad


def test_self_origins_match_is_self_origin() -> None:
    for bound, port in (("127.0.0.1", 4170), ("localhost", 80), ("::1", 443), ("127.0.0.5", 1)):
        origins = self_origins(bound, port)
        assert origins
        for origin in origins:
            assert is_self_origin(origin, bound, port)
    assert self_origins("0.0.0.0", 4170) == frozenset()
    assert "http://[::1]:4170" in self_origins("::1", 4170)
    assert "https://localhost" in self_origins("127.0.0.1", 443)
    assert "http://localhost" not in self_origins("127.0.0.1", 443)


def test_rate_limit_accessors() -> None:
    bare = SimpleNamespace()
    assert rate_limiter(bare) is None  # type: ignore[arg-type]
    assert rate_limit_hits(bare) == {"prompt": 0, "mutation": 0, "read": 0}  # type: ignore[arg-type]
    _, daemon = make_app(Settings(workspaces=("/tmp",)), [])
    assert isinstance(rate_limiter(daemon), RateLimiter)
    assert rate_limit_hits(daemon) == {"prompt": 0, "mutation": 0, "read": 0}


def test_capability_predicates() -> None:
    security = {"require_auth", "allow_origin", "rate_limit"}
    ours = [f for f in middleware.FEATURES if f.tag in security]
    assert {f.tag for f in ours} == security
    assert all(f.routes for f in ours)

    def tags(**kw: Any) -> set[str]:
        daemon = SimpleNamespace(settings=Settings(workspaces=("/tmp",), **kw))
        return {f.tag for f in ours if f.enabled(daemon)}  # type: ignore[arg-type]

    assert tags() & security == set()
    assert tags(require_auth=True, token="t") & security == {"require_auth"}
    assert tags(allow_origins=("http://a.example",)) & security == {"allow_origin"}
    assert tags(rate_limit=RateLimitSettings(enabled=True)) & security == {"rate_limit"}


def test_install_redaction_covers_messages_arguments_and_tracebacks() -> None:
    root = logging.getLogger()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root.addHandler(handler)
    try:
        install_redaction(["s3cr3t-value", None])
        log = logging.getLogger("serve.test")
        log.warning("in text s3cr3t-value")
        log.warning("as an argument %s", "s3cr3t-value")
        try:
            raise RuntimeError("boom s3cr3t-value")
        except RuntimeError:
            log.exception("failure")
        install_redaction(["s3cr3t-value"])  # idempotent: one filter per handler
        assert sum(type(f).__name__ == "RedactingFilter" for f in handler.filters) == 1
    finally:
        root.removeHandler(handler)
    text = stream.getvalue()
    assert "s3cr3t-value" not in text
    assert text.count("[redacted]") >= 3


def test_settings_repr_hides_the_token() -> None:
    settings = Settings(workspaces=("/tmp",), token="visible-if-leaked")
    assert "visible-if-leaked" not in repr(settings)
    assert "visible-if-leaked" not in str(settings)
    assert "token=[redacted]" in repr(settings)
    assert "token=None" in repr(Settings(workspaces=("/tmp",)))
