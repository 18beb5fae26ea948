"""The security front: every request check that runs before a route handler.

Theory of operation
-------------------
:func:`install_middleware` makes a :class:`SecurityFront` the outermost ASGI callable
(around :class:`serve.http.keepalive.ShieldLastBody`, around the framework) and, on a
daemon without a bearer token, adds the strict-route gate as the first ``before_request``
hook. Everything that depends only on the settings is computed once at install time (token
digest, CORS header bytes, canned error bodies and response heads, the rate limiter, the
``/capabilities`` tag lists: :class:`serve.http.capabilities.Advertiser`); what depends on
the listening port (the ``Host`` allowlist, the self-origins) is rebuilt the first time a
request sees a new ``daemon.port`` (the app is created before the socket is bound, and
``--port 0`` is resolved only then). A request that passes costs one scan of its header
list, a few set lookups and, with a token, one SHA-256.

Shape: ``__call__`` counts the request in ``host.front.open_requests`` while
:meth:`SecurityFront._http` runs the checks below in order, inline, each on what the header
scan collected. ``_http`` answers (a refusal, or the fast path: ``GET /health`` and ``GET
/capabilities`` are answered here, below the framework, after every check) and returns
``None``, or returns the request (scope, receive, send: a check may replace each, e.g. the
CORS ``send`` or the replayed body) for the app. Adding a step: build its object at install
time, ``None`` when its flag is off, and test it inline at its place in ``_http`` (a step
that is off then costs one attribute test); a step that needs a header adds one branch to
the header scan; what it finds for the handlers can travel in the scope it returns. No
per-request closures or objects beyond what
a step needs: the fast path's cost is measured (``scripts/bench_round.py``).

The checks run in the reference's order; the first refusal answers and nothing after it
runs (so no handler, no body read, no session or disk change):

1. **self-origin strip** (loopback binds): ``Origin`` equal to one of the daemon's own
   origins (``http(s)://{127.0.0.1,localhost,[::1],host.docker.internal,<bound>}:P``) is
   removed from the scope, so the daemon's own pages behave like a CLI client.
2. **Host allowlist** (loopback binds): exactly one ``Host`` in the allowlist, else
   ``403 {"error":"Invalid Host header"}``.
   *Remote same-origin* (non-loopback bind, always with a token): ``Origin ==
   scheme://Host`` needs a valid bearer (else 401) and is then stripped.
3. **CORS**: no ``Origin`` passes; an allowed origin gets the CORS headers added to
   whatever response follows (errors and SSE included, via a wrapped ``send``) and a
   preflight is answered ``204`` at once; anything else (including ``null``, several
   ``Origin`` headers, non-ASCII) is ``403 {"error":"Request denied by CORS policy"}`` with
   ``Vary: Origin`` and no ``Access-Control-*`` header.
4. **/health pre-auth**: ``GET|HEAD /health`` skips the bearer check on loopback binds
   unless ``--require-auth``.
5. **bearer**: with a token, exactly one ``Authorization: Bearer <token>`` (scheme in any
   case, digests compared in constant time) or, with ``--token-header NAME``, exactly one
   ``NAME: <token>``, else the uniform ``401 {"error":"Unauthorized"}``. The accepted
   digest is read per request from ``host.binding`` (late binding swaps it). A daemon that
   awaits its bind (``--bootstrap-token``) then answers anything but the probes and
   ``POST /daemon/bind`` with ``403 {"code":"daemon_not_bound"}``.
6. **rate limit** (``--rate-limit``): :class:`serve.http.security.RateLimiter`, per client key and
   tier; ``429`` with ``Retry-After``/``X-RateLimit-*``. Exempt tiers never touch a bucket;
   draining daemons are not limited. The limiter is ``host.front.rate_limiter``
   (:func:`rate_limit_hits` reads its refusal counters).
7. **body limit**: a declared ``Content-Length`` above ``--max-body-bytes`` (default 10 MB)
   is ``413 {"error":"Request body too large (max 10 MB)"}`` at once. Any other
   body (declared or chunked) is read here in full, bounded by the same limit, and replayed
   to the app as one message. Handlers read whole bodies anyway; reading first means no
   response can leave before the request has fully arrived, which hypercorn 0.18 +
   quart-trio do not survive on a keep-alive connection (a response sent while the body
   is still in flight wedges the connection: the next request is never answered).
8. **URL encoding**: a raw path with a ``%`` not followed by two hex digits, or whose
   percent-decoding is not UTF-8, is ``400 {"error":"Malformed URL encoding","code":
   "invalid_request"}``.
9. **strict gate** (``before_request``, only on daemons without a token): a request whose
   matched (method, Quart rule) is in :data:`serve.http.security.STRICT_ROUTES` is
   ``401 {"error":...,"code":"token_required"}`` before any handler or other hook runs.

Keep-alive: before answering early, the front reads and discards the request body (up to
:data:`DRAIN_LIMIT_BYTES`, within :data:`DRAIN_TIMEOUT_S`) so the connection can serve the
next request; a body too large or too slow to drain gets ``Connection: close`` instead.
WebSocket scopes get checks 1–5; a refused upgrade is answered with the HTTP status and
body a request would get (401/403; close code 1008 where the server cannot answer HTTP).
Lifespan passes.

Logging: rate-limit refusals are logged sampled; the configured token is redacted from
every log record (:func:`serve.logs.install_redaction`). No error body ever contains a
token or the CORS allowlist.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

import msgspec
from quart import Response, request
from quart_trio import QuartTrio

from serve.http import capabilities
from serve.http.capabilities import Feature
from serve.http.front_io import (
    DRAIN_TIMEOUT_S,
    JSON_TYPE,
    TIMED_OUT,
    TOO_LARGE,
    drain_body,
    read_body,
    replay,
    respond,
)
from serve.http.security import (
    CORS_DENIED_BODY,
    INVALID_HOST_BODY,
    TOKEN_REQUIRED_BODY,
    UNAUTHORIZED_BODY,
    BearerAuth,
    CorsAction,
    CorsPolicy,
    HostAllowlist,
    RateLimiter,
    Tier,
    check_authorization,
    check_token_header,
    client_key,
    is_loopback_host,
    is_remote_same_origin,
    is_strict,
)
from serve.http.security.cors import self_origins
from serve.http.security.peers import parse_trusted_proxies, scope_client_address
from serve.http.security.principals import (
    PRINCIPAL_KEY,
    REVALIDATE_KEY,
    PrincipalResolver,
    bearer_credential,
)
from serve.logs import install_redaction
from serve.ratelimit import classify, limiter_for
from serve.settings import Settings

if TYPE_CHECKING:
    from collections.abc import Sequence

    from serve.host import FrontStats, Host
    from serve.http.metrics import DaemonMetrics
    from serve.tenant_claim import Binding

__all__ = [
    "DRAIN_LIMIT_BYTES",
    "DRAIN_TIMEOUT_S",
    "PUBLIC_PAGES",
    "SecurityFront",
    "install_middleware",
    "rate_limit_hits",
    "rate_limiter",
]

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
#: A request that passed the checks, as the app gets it.
Passed = tuple[Scope, Receive, Send]

DRAIN_LIMIT_BYTES = 16 * 1024 * 1024
"""Most request-body bytes read and discarded to keep a refused connection alive."""
SWEEP_INTERVAL_S = 300.0
"""Stale rate-limit buckets are swept at least this often (on the next request)."""

_JSON = JSON_TYPE
_HOST_403 = INVALID_HOST_BODY.encode()
_CORS_403 = CORS_DENIED_BODY.encode()
_UNAUTHORIZED_401 = UNAUTHORIZED_BODY.encode()
_TOKEN_REQUIRED_401 = TOKEN_REQUIRED_BODY.encode()
_MALFORMED_400 = msgspec.json.encode({"error": "Malformed URL encoding", "code": "invalid_request"})
_BODY_TIMEOUT_408 = b'{"error":"Request body timeout"}'
_VARY_ORIGIN = (b"vary", b"Origin")
_PREFLIGHT_HEADERS = frozenset(
    {b"access-control-request-method", b"access-control-request-headers"}
)
_BAD_PERCENT = re.compile(rb"%(?![0-9A-Fa-f]{2})")
_HEALTH_PATHS = frozenset({"/health", "/health/", "/readyz", "/readyz/"})
#: Static pages and the API description: no data, no secrets; a browser opening them
#: cannot send a bearer token (the pages then call the API with the token the user pastes).
_FAST_PATHS = frozenset({"/health", "/capabilities"})
_HEALTH_OK = b'{"status":"ok"}'
_HEALTH_HEAD = ((b"content-type", _JSON), (b"content-length", b"%d" % len(_HEALTH_OK)))
#: The request counter's keys of the fast-path answers (method, route, status).
_FAST_KEYS = {path: ("GET", path, "200") for path in _FAST_PATHS}
#: Never behind the bearer (GET/HEAD): the pages and this API's description.
PUBLIC_PAGES = frozenset({"/demo", "/doc", "/openapi.json", "/favicon.ico"})
_NO_TIERS = {tier.value: 0 for tier in Tier}
_BIND_PATHS = frozenset({"/daemon/bind", "/daemon/bind/"})
_NOT_BOUND_403 = msgspec.json.encode(
    {
        "error": "This daemon is not bound yet: POST /daemon/bind with the bootstrap token first",
        "code": "daemon_not_bound",
    }
)


def _require_auth(host: Host) -> bool:
    settings: Settings = host.settings
    return settings.require_auth


def _allow_origin(host: Host) -> bool:
    settings: Settings = host.settings
    return bool(settings.allow_origins)


def _rate_limited(host: Host) -> bool:
    settings: Settings = host.settings
    return settings.rate_limit.enabled


FEATURES: tuple[Feature, ...] = (
    Feature("require_auth", (("GET", "/health"),), when=_require_auth),
    Feature("allow_origin", (("GET", "/capabilities"),), when=_allow_origin),
    Feature("rate_limit", (("GET", "/health"),), when=_rate_limited),
)


def rate_limiter(host: Host) -> RateLimiter | None:
    """The front's rate limiter (``host.front.rate_limiter``)."""
    limiter = getattr(getattr(host, "front", None), "rate_limiter", None)
    return limiter if isinstance(limiter, RateLimiter) else None


def rate_limit_hits(host: Host) -> dict[str, int]:
    """Rate-limit refusals per tier since start (``{"prompt","mutation","read"}``; zeros
    when rate limiting is off). For ``/health?deep=1`` and ``/daemon/status``."""
    limiter = rate_limiter(host)
    return limiter.hits() if limiter is not None else dict(_NO_TIERS)


def malformed_path(raw_path: bytes) -> bool:
    """True iff ``raw_path`` has a bad ``%`` escape or percent-decodes to invalid UTF-8."""
    if b"%" not in raw_path:
        return False
    if _BAD_PERCENT.search(raw_path) is not None:
        return True
    try:
        unquote_to_bytes(raw_path).decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _cors_sender(send: Send, headers: list[tuple[bytes, bytes]]) -> Send:
    """``send`` that adds the CORS ``headers`` to the response start (``Vary`` merged)."""

    async def sender(message: Message) -> None:
        if message["type"] == "http.response.start":
            out: list[tuple[bytes, bytes]] = []
            vary_seen = False
            for name, value in message.get("headers", ()):
                if name.lower() == b"vary":
                    vary_seen = True
                    if b"origin" not in value.lower():
                        value = value + b", Origin"
                out.append((name, value))
            if not vary_seen:
                out.append(_VARY_ORIGIN)
            out.extend(headers)
            message = {**message, "headers": out}
        await send(message)

    return sender


class SecurityFront:
    """The ASGI middleware of checks 1–8 (see the module docstring). One per app."""

    def __init__(
        self,
        app: ASGIApp,
        host: Host,
        features: Sequence[Feature] = (),
        metrics: DaemonMetrics | None = None,
    ) -> None:
        settings = host.settings
        self._app = app
        self._host = host
        self._advertiser = capabilities.Advertiser(features)
        self._metrics = metrics
        # The front counts the requests it answers itself (the app's own are counted by
        # serve/http/keepalive.py): the drain waits for both.
        self._stats: FrontStats = host.front
        self._max_body = settings.max_body_bytes
        self._too_large_413 = msgspec.json.encode({"error": settings.body_too_large_message})
        self._bound_host = settings.hostname
        self._loopback = is_loopback_host(settings.hostname)
        self._bearer = BearerAuth.from_token(settings.token) if settings.token else None
        self._binding: Binding | None = getattr(host, "binding", None)
        self._token_header = settings.token_header.encode() if settings.token_header else None
        self._health_preauth = self._loopback and not settings.require_auth
        # --public-probes: orchestrator probes (shallow /health, /readyz) need no token on
        # any bind; they reveal only "up" and "ready". /health?deep=1 still needs it.
        self._public_probes = settings.public_probes
        self._remote_same_origin = not self._loopback and self._bearer is not None
        self._cors = CorsPolicy.from_patterns(settings.allow_origins)
        self.limiter = rate_limiter(host) or limiter_for(settings.rate_limit)
        self._limiting = settings.rate_limit.enabled
        self._trusted_proxies = parse_trusted_proxies(settings.trusted_proxies)
        self._last_sweep = time.monotonic()
        # Multi-user auth (docs/multi-user.md): asked only when the operator token fails.
        self._principals = (
            PrincipalResolver(settings, lambda: host.config.access.admin_groups, host.tokens_file)
            if settings.auth.configured
            else None
        )
        self._port = -1
        self._hosts: frozenset[bytes] = frozenset()
        self._self_origins: frozenset[bytes] = frozenset()

    def _rebind(self, port: int) -> None:
        self._port = port
        allow = HostAllowlist(self._bound_host, port)
        self._hosts = frozenset(v.encode("ascii") for v in allow.allowed_values())
        self._self_origins = frozenset(
            o.encode("ascii") for o in self_origins(self._bound_host, port)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            stats = self._stats
            stats.open_requests += 1
            try:
                passed = await self._http(scope, receive, send)
            finally:
                stats.open_requests -= 1
            if passed is not None:
                await self._app(*passed)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        else:
            await self._app(scope, receive, send)

    # ---- HTTP ----------------------------------------------------------------------------

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> Passed | None:
        """Checks 1–8 and the fast path: ``None`` when answered here, else the request as
        the app gets it (scope, receive, send: a check may have changed each)."""
        hosts: list[bytes] = []
        origins: list[bytes] = []
        auths: list[bytes] = []
        tokens: list[bytes] = []
        content_length: bytes | None = None
        chunked = False
        preflight = False
        token_header = self._token_header
        for name, value in scope["headers"]:
            if name == b"host":
                hosts.append(value)
            elif name == b"origin":
                origins.append(value)
            elif name == b"authorization":
                auths.append(value)
            elif name == token_header:
                tokens.append(value)
            elif name == b"content-length":
                content_length = value
            elif name == b"transfer-encoding":
                chunked = True
            elif name in _PREFLIGHT_HEADERS:
                preflight = True
        declared = 0
        if content_length is not None:
            declared = int(content_length) if content_length.isdigit() else self._max_body + 1
        has_body = chunked or declared > 0
        # The body of a refused request is drained (so the connection serves the next
        # request) unless it is declared too large to: then the connection closes.
        if not has_body:
            drain = _NO_BODY
        elif not chunked and declared > DRAIN_LIMIT_BYTES:
            drain = _UNDRAINABLE
        else:
            drain = _DRAIN

        port = self._host.port
        if port != self._port:
            self._rebind(port)
        method: str = scope["method"]

        # 1. self-origin strip
        if origins and self._loopback and len(origins) == 1 and origins[0] in self._self_origins:
            origins = []
            scope = {**scope, "headers": [h for h in scope["headers"] if h[0] != b"origin"]}

        # 2. Host allowlist (loopback) / remote same-origin (non-loopback with a token)
        if self._loopback:
            if len(hosts) != 1 or hosts[0].lower() not in self._hosts:
                await _refuse(receive, send, drain, 403, _HOST_403)
                return None
        elif origins and self._remote_same_origin and len(origins) == 1:
            origin = origins[0].decode("latin-1")
            host = hosts[0].decode("latin-1") if len(hosts) == 1 else None
            if is_remote_same_origin(origin, host, tls=scope.get("scheme") == "https"):
                if not self._authorized(auths, tokens):
                    await _refuse(receive, send, drain, 401, _UNAUTHORIZED_401)
                    return None
                origins = []
                scope = {**scope, "headers": [h for h in scope["headers"] if h[0] != b"origin"]}

        # 3. CORS
        if origins:
            decision = self._cors.evaluate(
                [o.decode("latin-1") for o in origins],
                method,
                ("access-control-request-method",) if preflight else (),
            )
            if decision.action is CorsAction.DENY:
                await _refuse(receive, send, drain, 403, _CORS_403, (_VARY_ORIGIN,))
                return None
            cors_headers = [(n.lower().encode(), v.encode("latin-1")) for n, v in decision.headers]
            if decision.action is CorsAction.PREFLIGHT:
                await _refuse(receive, send, drain, 204, b"", tuple(cors_headers))
                return None
            send = _cors_sender(send, [h for h in cors_headers if h[0] != b"vary"])

        # 4–5. /health pre-auth, bearer
        path: str = scope["path"]
        if self._bearer is not None and not (
            method in ("GET", "HEAD")
            and (
                path in PUBLIC_PAGES
                or (
                    path in _HEALTH_PATHS
                    and (
                        self._health_preauth
                        or (self._public_probes and b"deep" not in scope.get("query_string", b""))
                    )
                )
            )
        ):
            if not self._authorized(auths, tokens) and not await self._principal(
                scope, auths, tokens
            ):
                await _refuse(receive, send, drain, 401, _UNAUTHORIZED_401)
                return None
            if self._unbound_refused(method, path):
                await _refuse(receive, send, drain, 403, _NOT_BOUND_403)
                return None
        elif self._principals is not None and path in _HEALTH_PATHS:
            # A probe before auth, with multi-user auth: who asks decides what a deep
            # answer shows (the operator token: itself; no valid credential: anonymous).
            if not self._authorized(auths, tokens):
                await self._principals.identify(scope, auths, tokens)

        # 6. rate limit
        if self._limiting and not self._host.draining:
            tier = classify(method, path)
            if tier is not None:
                refusal = self._rate_limit(scope, tier)
                if refusal is not None:
                    status, body, headers = refusal
                    await _refuse(receive, send, drain, status, body, headers)
                    return None

        # 7. body limit; the whole body is read here (bounded) and replayed to the app
        if has_body:
            if declared > self._max_body:
                await _refuse(receive, send, drain, 413, self._too_large_413)
                return None
            buffered = await read_body(receive, self._max_body)
            if buffered is None:  # the client went away
                return None
            if buffered is TOO_LARGE:
                drained = await drain_body(receive, DRAIN_LIMIT_BYTES)
                await respond(send, 413, self._too_large_413, (), close=not drained)
                return None
            if buffered is TIMED_OUT:
                await respond(send, 408, _BODY_TIMEOUT_408, (), close=True)
                return None
            receive = replay(buffered, receive)

        # 8. malformed percent-encoding in the raw path
        raw_path = scope.get("raw_path")
        if raw_path is not None and b"%" in raw_path and malformed_path(raw_path):
            await respond(send, 400, _MALFORMED_400, (), close=False)
            return None

        # Fast path for the hottest reads (orchestrator probes, client pre-flights): every
        # check above has run; answering here skips the framework's per-request cost.
        if method == "GET" and path in _FAST_PATHS and not scope.get("query_string"):
            await self._fast(path, send, scope)
            return None
        return scope, receive, send

    async def _fast(self, path: str, send: Send, scope: Scope) -> None:
        if path == "/health":
            body = _HEALTH_OK
            head = _HEALTH_HEAD
        else:
            # multi-user auth: the caller is named (scope's principal)
            body = self._advertiser.body(self._host, scope.get(PRINCIPAL_KEY))
            head = ((b"content-type", _JSON), (b"content-length", b"%d" % len(body)))
        metrics = self._metrics
        if metrics is not None:
            metrics.requests.add(_FAST_KEYS[path])
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, auths: list[bytes], tokens: list[bytes]) -> bool:
        """The token in ``Authorization`` or in the ``--token-header`` header."""
        assert self._bearer is not None
        binding = self._binding
        digest = binding.digest() if binding is not None else self._bearer.digest
        if digest is None:
            return False
        if tokens and check_token_header([t.decode("latin-1") for t in tokens], digest):
            return True
        return check_authorization([a.decode("latin-1") for a in auths], digest)

    async def _principal(self, scope: Scope, auths: list[bytes], tokens: list[bytes]) -> bool:
        """Multi-user auth: a JWT or scoped token's principal, into the scope."""
        if self._principals is None:
            return False
        peer = scope_client_address(scope, self._trusted_proxies)
        admitted = await self._principals.admit(scope, auths, tokens, peer, self._host.audit)
        if admitted:  # a long-lived stream asks again later (serve/http/access.py Lease)
            credential = bearer_credential(
                [a.decode("latin-1") for a in auths], [t.decode("latin-1") for t in tokens]
            )
            scope[REVALIDATE_KEY] = functools.partial(self._principals.resolve, credential)
        return admitted

    def _unbound_refused(self, method: str, path: str) -> bool:
        """A daemon awaiting its bind serves only the probes and ``POST /daemon/bind``."""
        binding = self._binding
        if binding is None or not binding.pending:
            return False
        return not (
            (method == "POST" and path in _BIND_PATHS)
            or (method in ("GET", "HEAD") and path in _HEALTH_PATHS)
        )

    def _rate_limit(
        self, scope: Scope, tier: Tier
    ) -> tuple[int, bytes, tuple[tuple[bytes, bytes], ...]] | None:
        now = time.monotonic()
        if now - self._last_sweep >= SWEEP_INTERVAL_S:
            self._last_sweep = now
            self.limiter.sweep()
        key = client_key(peer_ip=scope_client_address(scope, self._trusted_proxies))
        decision = self.limiter.check(key, tier)
        if decision.log:
            if decision.allowed:
                log.warning("rate limiter key table full: letting %s (%s) through", key, tier)
            else:
                log.warning(
                    "rate limit exceeded: key=%s tier=%s retryAfterMs=%d",
                    key,
                    tier,
                    decision.retry_after_ms,
                )
        if decision.allowed:
            return None
        body = decision.body()
        assert body is not None
        headers = tuple((n.lower().encode(), v.encode()) for n, v in decision.headers())
        return 429, body.encode(), headers

    # ---- WebSocket -----------------------------------------------------------------------

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        hosts: list[bytes] = []
        origins: list[bytes] = []
        auths: list[bytes] = []
        tokens: list[bytes] = []
        token_header = self._token_header
        for name, value in scope["headers"]:
            if name == b"host":
                hosts.append(value)
            elif name == b"origin":
                origins.append(value)
            elif name == b"authorization":
                auths.append(value)
            elif name == token_header:
                tokens.append(value)
        port = self._host.port
        if port != self._port:
            self._rebind(port)
        if origins and self._loopback and len(origins) == 1 and origins[0] in self._self_origins:
            origins = []
        refusal: tuple[int, bytes] | None = None
        if self._loopback and (len(hosts) != 1 or hosts[0].lower() not in self._hosts):
            refusal = (403, _HOST_403)
        elif (
            bool(origins)
            and self._cors.evaluate([o.decode("latin-1") for o in origins], "GET").action
            is not CorsAction.ALLOW
        ):
            refusal = (403, _CORS_403)
        elif (
            self._bearer is not None
            and not self._authorized(auths, tokens)
            and not await self._principal(scope, auths, tokens)
        ):
            refusal = (401, _UNAUTHORIZED_401)
        elif self._unbound_refused("GET", scope["path"]):
            refusal = (403, _NOT_BOUND_403)
        if refusal is not None:
            message = await receive()
            if message["type"] != "websocket.connect":
                return
            if "websocket.http.response" in scope.get("extensions", {}):
                # Refuse the upgrade with the same status and body as an HTTP request.
                status, body = refusal
                await send(
                    {
                        "type": "websocket.http.response.start",
                        "status": status,
                        "headers": [
                            (b"content-type", _JSON),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "websocket.http.response.body", "body": body})
            else:
                await send({"type": "websocket.close", "code": 1008})
            return
        await self._app(scope, receive, send)


# ---- refusals ---------------------------------------------------------------------------

_NO_BODY, _DRAIN, _UNDRAINABLE = 0, 1, 2


async def _refuse(
    receive: Receive,
    send: Send,
    drain: int,
    status: int,
    body: bytes,
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    """Answer early: the request body is drained first (``drain``: :data:`_DRAIN`), so the
    connection can serve the next request, or the connection closes after the answer."""
    close = drain == _UNDRAINABLE
    if drain == _DRAIN:
        close = not await drain_body(receive, DRAIN_LIMIT_BYTES)
    await respond(send, status, body, headers, close=close)


# ---- installation -------------------------------------------------------------------------


def _strict_gate() -> Callable[[], Awaitable[Response | None]]:
    cache: dict[tuple[str, str], bool] = {}

    async def strict_gate() -> Response | None:
        rule = request.url_rule
        if rule is None:
            return None
        key = (request.method, rule.rule)
        strict = cache.get(key)
        if strict is None:
            strict = cache[key] = is_strict(*key)
        if strict:
            return Response(_TOKEN_REQUIRED_401, status=401, content_type=_JSON.decode())
        return None

    return strict_gate


def install_middleware(
    app: QuartTrio,
    host: Host,
    features: Sequence[Feature] = (),
    metrics: DaemonMetrics | None = None,
) -> None:
    """Wrap ``app`` in the security front for ``host`` (call after the blueprints).

    Installs log redaction of the token, and on a daemon without a token puts the strict
    gate first among the ``before_request`` hooks.
    """
    settings = host.settings
    # quart types asgi_app as its own method; any ASGI callable serves (ASGI middleware).
    front = SecurityFront(app.asgi_app, host, features, metrics)  # type: ignore[arg-type]
    app.asgi_app = front  # type: ignore[assignment,method-assign]
    install_redaction([settings.token])
    if settings.token is None:
        app.before_request_funcs.setdefault(None, []).insert(0, _strict_gate())
    for warning in CorsPolicy.from_patterns(settings.allow_origins).startup_warnings():
        log.warning("%s", warning)
