"""Per-client, per-tier rate limiting: a sans-IO continuous token bucket (spec §3.6).

Theory of operation
-------------------
Every request is first *classified* (:func:`classify`) into a tier from its method and
path: ``prompt`` (``POST /session/*/prompt``), ``read`` (``GET``/``HEAD`` and
``POST /sessions/catalog``) or ``mutation`` (everything else), or ``None`` for the exempt
traffic that must never be throttled — ``OPTIONS``, ``GET|HEAD /health``,
``POST /session/*/heartbeat``, ``GET /session/*/events`` (SSE) and ``/acp[/…]``. First
match wins and trailing slashes are ignored.

The *client key* (:func:`client_key`) is the client's address
(:func:`serve.http.security.peers.client_address`: the peer's, or from a ``--trusted-proxy``
the forwarded one; IPv4-mapped ``::ffff:`` prefix removed), never ``X-Qwen-Client-Id``:
the reference keys a loopback bind by that header, which a client picks freely, so a fresh
id per request was never limited. Every local caller of a loopback bind shares one budget.

Each ``(key, tier)`` owns a bucket of capacity ``max`` that refills continuously at
``max / window_ms`` tokens per ms and starts full; a request takes one token if at least
one is there, else it is refused with ``retryAfterMs = ceil((1 - tokens) / rate)``.
Arithmetic is exact: a bucket stores ``tokens × window_ms`` as an integer, and refill adds
``elapsed_ms × max``, so there is no floating-point drift at the boundaries. Elapsed time is
clamped at zero (a clock that steps back refills nothing and never moves a bucket's
timestamp backwards).

Bounds and housekeeping: at most :data:`MAX_KEYS` buckets; a request that would need a new
bucket beyond that is let through (fail-open, ``reason == "table_full"``) and counted. Every
:data:`SWEEP_EVERY_REQUESTS` counted requests, and whenever the owner calls :meth:`sweep`
(the daemon does so every 5 minutes), buckets untouched for ``2 × window_ms`` are dropped.
In *draining* mode (shutdown) everything passes. Refusals are counted per tier
(:meth:`RateLimiter.hits`, fed to ``/health?deep=1`` and ``/daemon/status``) and the
decision says whether to log it (1st and every 100th refusal per key and tier) so a flood
does not flood the log.

Ownership: one :class:`RateLimiter` per daemon, owned by the HTTP front and called from
its request middleware (after bearer auth, so 401 precedes 429). It is not thread-safe;
trio runs the middleware on one thread. The clocks are injected: ``clock`` is a monotonic
millisecond clock for the buckets, ``wall_clock`` gives epoch milliseconds for the
``X-RateLimit-Reset`` header. No I/O, no logging, no timers here.
"""

from __future__ import annotations

import enum
import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Literal

import msgspec

if TYPE_CHECKING:
    from serve.settings import RateLimitSettings

__all__ = [
    "LOG_EVERY_REJECTIONS",
    "MAX_KEYS",
    "MIN_WINDOW_MS",
    "SWEEP_EVERY_REQUESTS",
    "Decision",
    "InvalidRateLimitConfig",
    "RateLimitBody",
    "RateLimitConfig",
    "RateLimiter",
    "RateLimiterStats",
    "Tier",
    "classify",
    "client_key",
    "limiter_for",
    "rate_limit_config_from",
]

MAX_KEYS = 10_000
"""Most ``(client key, tier)`` buckets held at once; beyond it requests fail open."""
SWEEP_EVERY_REQUESTS = 1000
"""Counted requests between two automatic stale-bucket sweeps."""
LOG_EVERY_REJECTIONS = 100
"""A refusal is flagged for logging when it is the 1st, 101st, 201st … for its bucket."""
MIN_WINDOW_MS = 1000
"""Smallest accepted ``window_ms``."""


class Tier(enum.StrEnum):
    """Rate-limit tiers, each with its own budget per client key."""

    PROMPT = "prompt"
    MUTATION = "mutation"
    READ = "read"


class InvalidRateLimitConfig(ValueError):
    """The *operator* gave a rate-limit setting that is not allowed (message names it)."""


class RateLimitConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Rate-limit settings. Budgets are requests per ``window_ms`` per client key.

    ``workspace_acp`` exempts ``/workspaces/<x>/acp`` as well (when workspace-qualified
    ACP is served). Validated on construction (:class:`InvalidRateLimitConfig`).
    """

    enabled: bool = False
    prompt: int = 10
    mutation: int = 30
    read: int = 120
    window_ms: int = 60_000
    workspace_acp: bool = False

    def __post_init__(self) -> None:
        for name in ("prompt", "mutation", "read"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise InvalidRateLimitConfig(
                    f"Invalid rate limit for tier {name}: {value!r} (must be a positive integer)"
                )
        if type(self.window_ms) is not int or self.window_ms < MIN_WINDOW_MS:
            raise InvalidRateLimitConfig(
                f"Invalid rate-limit window: {self.window_ms!r} ms "
                f"(must be an integer of at least {MIN_WINDOW_MS})"
            )

    def limit(self, tier: Tier) -> int:
        """The budget of ``tier`` (requests per window)."""
        return {Tier.PROMPT: self.prompt, Tier.MUTATION: self.mutation, Tier.READ: self.read}[tier]


def _parse_positive_int(raw: str, source: str, *, minimum: int = 1) -> int:
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or int(text) < minimum:
        bound = "a positive integer" if minimum == 1 else f"an integer of at least {minimum}"
        raise InvalidRateLimitConfig(f'Invalid {source}="{raw}": must be {bound}.')
    return int(text)


def limiter_for(settings: RateLimitSettings) -> RateLimiter:
    """The daemon's limiter for its ``--rate-limit*`` settings (off: it counts nothing)."""
    return RateLimiter(
        RateLimitConfig(
            enabled=settings.enabled,
            prompt=settings.prompt,
            mutation=settings.mutation,
            read=settings.read,
            window_ms=settings.window_ms,
        )
    )


def rate_limit_config_from(
    env: Mapping[str, str],
    *,
    enabled: bool | None = None,
    prompt: int | None = None,
    mutation: int | None = None,
    read: int | None = None,
    window_ms: int | None = None,
    workspace_acp: bool = False,
) -> RateLimitConfig:
    """Combine CLI flag values (``None`` = flag not given) with the environment; flags win.

    Env: ``QWEN_SERVE_RATE_LIMIT`` (``1``/``true`` enables), ``QWEN_SERVE_RATE_LIMIT_PROMPT``,
    ``_MUTATION``, ``_READ``, ``_WINDOW_MS``. Raises :class:`InvalidRateLimitConfig`.
    """
    if enabled is None:
        enabled = env.get("QWEN_SERVE_RATE_LIMIT", "").strip().lower() in ("1", "true")
    values: dict[str, int] = {}
    for name, flag, minimum in (
        ("prompt", prompt, 1),
        ("mutation", mutation, 1),
        ("read", read, 1),
        ("window_ms", window_ms, MIN_WINDOW_MS),
    ):
        if flag is not None:
            values[name] = flag
            continue
        var = f"QWEN_SERVE_RATE_LIMIT_{name.upper()}"
        raw = env.get(var)
        if raw is not None and raw.strip() != "":
            values[name] = _parse_positive_int(raw, var, minimum=minimum)
    return RateLimitConfig(enabled=enabled, workspace_acp=workspace_acp, **values)


# ---------------------------------------------------------------------------------------
# Classification and keying

_SEG = r"[^/]+"
_HEARTBEAT = re.compile(rf"/session/{_SEG}/heartbeat")
_EVENTS = re.compile(rf"/session/{_SEG}/events")
_PROMPT = re.compile(rf"/session/{_SEG}/prompt")
_WORKSPACE_ACP = re.compile(rf"/workspaces/{_SEG}/acp(?:/.*)?", re.DOTALL)


def classify(method: str, path: str, *, workspace_acp: bool = False) -> Tier | None:
    """The tier of a request, or ``None`` if it is exempt from rate limiting.

    ``method`` is compared as given (servers pass it upper-case; a lower-case ``get`` is
    not a read). ``path`` is the routed path without the query string.
    """
    trimmed = path.rstrip("/") or "/"
    if method == "OPTIONS":
        return None
    if trimmed == "/acp" or trimmed.startswith("/acp/"):
        return None
    if workspace_acp and _WORKSPACE_ACP.fullmatch(trimmed):
        return None
    if method in ("GET", "HEAD") and trimmed == "/health":
        return None
    if method == "POST" and _HEARTBEAT.fullmatch(trimmed):
        return None
    if method == "GET" and _EVENTS.fullmatch(trimmed):
        return None
    if method == "POST" and _PROMPT.fullmatch(trimmed):
        return Tier.PROMPT
    if method in ("GET", "HEAD") or (method == "POST" and trimmed == "/sessions/catalog"):
        return Tier.READ
    return Tier.MUTATION


def _strip_mapped(ip: str) -> str:
    if ip[:7].lower() == "::ffff:" and "." in ip:
        return ip[7:]
    return ip


def client_key(*, peer_ip: str | None) -> str:
    """The bucket key of a request: the client's address (``unknown`` when not known),
    whatever client id it sends."""
    return _strip_mapped(peer_ip) if peer_ip else "unknown"


# ---------------------------------------------------------------------------------------
# Decisions

Reason = Literal["ok", "limited", "exempt", "disabled", "draining", "table_full"]


class RateLimitBody(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """``{"error":"Rate limit exceeded","code":"rate_limit_exceeded","tier","retryAfterMs"}``."""

    error: str = "Rate limit exceeded"
    code: str = "rate_limit_exceeded"
    tier: str
    retry_after_ms: int

    def encode(self) -> bytes:
        return msgspec.json.encode(self)


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """The verdict on one request.

    ``allowed`` false means answer 429 with :meth:`headers` and :meth:`body`. ``reason``
    says why: ``ok``/``limited`` (a bucket was consulted), ``exempt`` (tier ``None``),
    ``disabled``, ``draining`` or ``table_full`` (fail-open). ``log`` is true when this
    decision should be logged (sampled refusals, sampled fail-opens).
    """

    allowed: bool
    reason: Reason
    tier: Tier | None = None
    limit: int = 0
    remaining: int = 0
    retry_after_ms: int = 0
    reset_epoch_s: int = 0
    log: bool = False

    @property
    def retry_after_s(self) -> int:
        """``Retry-After`` in whole seconds, rounded up."""
        return -(-self.retry_after_ms // 1000)

    def headers(self) -> tuple[tuple[str, str], ...]:
        """Headers of the 429 response (empty for an allowed request)."""
        if self.allowed:
            return ()
        return (
            ("Retry-After", str(self.retry_after_s)),
            ("X-RateLimit-Limit", str(self.limit)),
            ("X-RateLimit-Remaining", "0"),
            ("X-RateLimit-Reset", str(self.reset_epoch_s)),
        )

    def body(self) -> RateLimitBody | None:
        """Body of the 429 response; ``None`` for an allowed request."""
        if self.allowed or self.tier is None:
            return None
        return RateLimitBody(tier=self.tier.value, retry_after_ms=self.retry_after_ms)


class RateLimiterStats(msgspec.Struct, frozen=True, rename="camel"):
    """Fill level and counters, for ``/daemon/status``."""

    enabled: bool
    keys: int
    max_keys: int
    requests: int
    fail_open: int
    hits: dict[str, int]


class _Bucket:
    """Mutable bucket state; ``units`` = tokens × window_ms."""

    __slots__ = ("last_ms", "rejections", "units")

    def __init__(self, units: int, last_ms: int) -> None:
        self.units = units
        self.last_ms = last_ms
        self.rejections = 0


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


_DISABLED = Decision(allowed=True, reason="disabled")
_EXEMPT = Decision(allowed=True, reason="exempt")
_DRAINING = Decision(allowed=True, reason="draining")


class RateLimiter:
    """Token buckets keyed by ``(client key, tier)``. See the module docstring."""

    def __init__(
        self,
        config: RateLimitConfig,
        *,
        clock: Callable[[], int] = _monotonic_ms,
        wall_clock: Callable[[], int] = _wall_ms,
        max_keys: int = MAX_KEYS,
    ) -> None:
        self.config = config
        self._clock = clock
        self._wall_clock = wall_clock
        self._max_keys = max_keys
        self._buckets: dict[tuple[str, Tier], _Bucket] = {}
        self._hits = dict.fromkeys(Tier, 0)
        self._requests = 0
        self._fail_open = 0
        self._draining = False

    # -- owner controls -------------------------------------------------------------

    def set_draining(self, draining: bool) -> None:
        """While draining (shutdown) every request passes and nothing is counted."""
        self._draining = draining

    def sweep(self, now_ms: int | None = None) -> int:
        """Drop buckets untouched for ``2 × window_ms``; return how many were dropped."""
        now = self._clock() if now_ms is None else now_ms
        horizon = 2 * self.config.window_ms
        stale = [k for k, b in self._buckets.items() if now - b.last_ms >= horizon]
        for key in stale:
            del self._buckets[key]
        return len(stale)

    # -- observation ----------------------------------------------------------------

    def hits(self) -> dict[str, int]:
        """Refusals per tier since start: ``{"prompt": n, "mutation": n, "read": n}``."""
        return {tier.value: count for tier, count in self._hits.items()}

    def statistics(self) -> RateLimiterStats:
        return RateLimiterStats(
            enabled=self.config.enabled,
            keys=len(self._buckets),
            max_keys=self._max_keys,
            requests=self._requests,
            fail_open=self._fail_open,
            hits=self.hits(),
        )

    # -- the decision ---------------------------------------------------------------

    def check_request(
        self,
        method: str,
        path: str,
        *,
        peer_ip: str | None,
    ) -> Decision:
        """:func:`classify` + :func:`client_key` + :meth:`check` in one call."""
        if not self.config.enabled:
            return _DISABLED
        tier = classify(method, path, workspace_acp=self.config.workspace_acp)
        key = client_key(peer_ip=peer_ip)
        return self.check(key, tier)

    def check(self, key: str, tier: Tier | None) -> Decision:
        """Consume one token of ``(key, tier)`` if available; say whether to proceed."""
        if not self.config.enabled:
            return _DISABLED
        if tier is None:
            return _EXEMPT
        if self._draining:
            return _DRAINING
        now = int(self._clock())
        self._requests += 1
        if self._requests % SWEEP_EVERY_REQUESTS == 0:
            self.sweep(now)
        limit = self.config.limit(tier)
        window = self.config.window_ms
        capacity = limit * window
        bucket = self._buckets.get((key, tier))
        if bucket is None:
            if len(self._buckets) >= self._max_keys:
                self._fail_open += 1
                return Decision(
                    allowed=True,
                    reason="table_full",
                    tier=tier,
                    limit=limit,
                    log=(self._fail_open - 1) % SWEEP_EVERY_REQUESTS == 0,
                )
            bucket = self._buckets[(key, tier)] = _Bucket(capacity, now)
        elif now > bucket.last_ms:
            bucket.units = min(capacity, bucket.units + (now - bucket.last_ms) * limit)
            bucket.last_ms = now
        if bucket.units >= window:
            bucket.units -= window
            return Decision(
                allowed=True,
                reason="ok",
                tier=tier,
                limit=limit,
                remaining=bucket.units // window,
            )
        self._hits[tier] += 1
        bucket.rejections += 1
        retry_after_ms = -(-(window - bucket.units) // limit)
        return Decision(
            allowed=False,
            reason="limited",
            tier=tier,
            limit=limit,
            remaining=0,
            retry_after_ms=retry_after_ms,
            reset_epoch_s=-(-(int(self._wall_clock()) + retry_after_ms) // 1000),
            log=(bucket.rejections - 1) % LOG_EVERY_REJECTIONS == 0,
        )
