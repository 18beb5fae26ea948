"""``GET /metrics``: Prometheus text exposition of the daemon's state.

Two kinds of series:

* **request series**, updated by app hooks on every request: ``acp_serve_http_requests_total
  {method, route, status}`` and the ``acp_serve_http_request_duration_seconds`` histogram
  (time to the response head; an SSE stream's lifetime is not a latency). ``route`` is the
  matched rule (``/session/<session_id>/prompt``), never the raw path, so cardinality stays
  bounded.
* **state series**, read from the running actors at scrape time by a custom collector:
  sessions, SSE subscribers, events published and evicted, slow-client warnings, pending
  permissions, supervisor restarts and crashes, journal bytes, rate-limit hits.

Each daemon owns its own ``CollectorRegistry`` (no process-global state, so tests can run
several daemons in one process). Nothing here holds a token, a client id or a secret.
"""

from __future__ import annotations

import bisect
import logging
import re
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from quart import Blueprint, Response, current_app, g, request

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector
    from quart_trio import QuartTrio

    from serve.host import Host

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_access = logging.getLogger("serve.access")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _Counts:
    """A labelled counter: ``labels(...).inc()`` like prometheus_client's, as a dict."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, ...], float] = {}

    def labels(self, *key: str) -> _Counts._Child:
        return _Counts._Child(self.values, key)

    def add(self, key: tuple[str, ...]) -> None:
        """``labels(*key).inc()`` without the child (the front's fast path)."""
        self.values[key] = self.values.get(key, 0.0) + 1.0

    class _Child:
        __slots__ = ("key", "values")

        def __init__(self, values: dict[tuple[str, ...], float], key: tuple[str, ...]) -> None:
            self.values = values
            self.key = key

        def inc(self, amount: float = 1.0) -> None:
            self.values[self.key] = self.values.get(self.key, 0.0) + amount


class _Latency:
    """Per-route histogram (cumulative buckets are built at scrape time)."""

    def __init__(self) -> None:
        self.buckets: dict[str, list[int]] = {}
        self.sums: dict[str, float] = {}

    def observe(self, route: str, seconds: float) -> None:
        counts = self.buckets.get(route)
        if counts is None:
            counts = self.buckets[route] = [0] * (len(_BUCKETS) + 1)
        counts[bisect.bisect_left(_BUCKETS, seconds)] += 1
        self.sums[route] = self.sums.get(route, 0.0) + seconds


class DaemonMetrics:
    """The request instruments and the state collector of one daemon.

    Request counts are kept in plain dicts on the hot path; prometheus_client (its
    registry and text exposition) is imported on the first scrape only, which keeps it
    out of a daemon that is never scraped.
    """

    def __init__(self, host: Host) -> None:
        self.host = host
        self.requests = _Counts()
        self.latency = _Latency()
        self._registry: CollectorRegistry | None = None

    def exposition(self) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest

        if self._registry is None:
            self._registry = CollectorRegistry(auto_describe=False)
            self._registry.register(_make_collector(self))
        return bytes(generate_latest(self._registry))


def _make_collector(instruments: DaemonMetrics) -> Collector:
    from prometheus_client.registry import Collector

    class StateCollector(Collector):
        def collect(self) -> Iterator[Metric]:
            yield from _request_series(instruments)
            yield from _state_series(instruments.host)

    return StateCollector()


def _request_series(metrics: DaemonMetrics) -> Iterator[Metric]:
    from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

    requests = CounterMetricFamily(
        "acp_serve_http_requests",
        "HTTP requests by method, matched route and status",
        labels=("method", "route", "status"),
    )
    for key, value in sorted(metrics.requests.values.items()):
        requests.add_metric(key, value)
    yield requests
    latency = HistogramMetricFamily(
        "acp_serve_http_request_duration_seconds",
        "Time to the response head, by matched route",
        labels=("route",),
    )
    for route, counts in sorted(metrics.latency.buckets.items()):
        cumulative, running = [], 0
        for bound, count in zip((*_BUCKETS, float("inf")), counts, strict=True):
            running += count
            cumulative.append((str(bound) if bound != float("inf") else "+Inf", running))
        latency.add_metric((route,), cumulative, metrics.latency.sums[route])
    yield latency


def _acp_evictions(d: Host) -> int:
    """Streams the /acp front evicted (an unread session stream past its outbox, or a
    WebSocket connection), 0 without the front."""
    return d.acp_front.evictions if d.acp_front is not None else 0


def _state_series(d: Host) -> Iterator[Metric]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    live = d.registry.live()
    retired = d.front.retired
    # Counters include closing sessions until they are retired (never go backwards).
    stats = [s.log.statistics() for s in d.registry.all_sessions()]

    def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, value=value)

    def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
        return CounterMetricFamily(name, doc, value=value)

    yield gauge("acp_serve_sessions", "Live sessions", len(live))
    yield gauge(
        "acp_serve_active_prompts", "Prompts running", sum(s.has_active_prompt for s in live)
    )
    yield gauge("acp_serve_queued_prompts", "Prompts waiting", sum(len(s.queue) for s in live))
    yield gauge("acp_serve_sse_subscribers", "Open SSE streams", d.front.sse_streams)
    yield counter(
        "acp_serve_events_published",
        "Events published on session logs",
        sum(st["published"] for st in stats) + retired.get("published", 0),
    )
    yield counter(
        "acp_serve_sse_evictions",
        "SSE subscribers evicted (client_evicted), /acp session streams included",
        sum(st["evictions"] for st in stats) + retired.get("evictions", 0) + _acp_evictions(d),
    )
    yield counter(
        "acp_serve_slow_client_warnings",
        "slow_client_warning frames sent",
        sum(st["slowClientWarnings"] for st in stats) + retired.get("warnings", 0),
    )
    yield gauge(
        "acp_serve_pending_permissions",
        "Permission requests waiting for a vote",
        d.mediator.pending_count(),
    )
    kinds: dict[str, int] = {}
    for event in [*d.root.events, *d.registry.supervisor_events]:
        kinds[str(event.kind)] = kinds.get(str(event.kind), 0) + 1
    family = CounterMetricFamily(
        "acp_serve_supervisor_events",
        "Supervision events by kind (restart, crash, give_up, ...) in the bounded history",
        labels=("kind",),
    )
    for kind, count in sorted(kinds.items()):
        family.add_metric((kind,), count)
    yield family
    yield gauge(
        "acp_serve_session_tokens",
        "Tokens live sessions used, as their agents reported (serve/sessions/budget.py)",
        sum(s.budget.tokens for s in live),
    )
    yield gauge(
        "acp_serve_sessions_budget_exhausted",
        "Live sessions whose token or cost budget is spent (prompts answer 402)",
        sum(s.budget.exhausted is not None for s in live),
    )
    yield gauge(
        "acp_serve_sessions_unbudgeted",
        "Live sessions whose agent reported no usage",
        sum(not s.budget.reported for s in live),
    )
    yield counter(
        "acp_serve_agent_restarts",
        "Agent children restarted in place by live sessions",
        sum(s.restart_count for s in live),
    )
    runtimes = list(d.registry) if hasattr(d.registry, "runtimes") else []
    pss = GaugeMetricFamily(
        "acp_serve_agent_pss_bytes",
        "PSS of each agent child's process tree (sampled by the workspace's agent pool)",
        labels=("workspace", "child"),
    )
    children = GaugeMetricFamily(
        "acp_serve_agent_children",
        "Agent children per workspace by state (warm, shared, full, stopping)",
        labels=("workspace", "state"),
    )
    for rt in runtimes:
        by_state: dict[str, int] = {}
        for child in rt.agents.status()["children"]:
            by_state[child["state"]] = by_state.get(child["state"], 0) + 1
            if child["pssKiB"] is not None:
                pss.add_metric((rt.id, child["id"]), child["pssKiB"] * 1024)
        for state, count in sorted(by_state.items()):
            children.add_metric((rt.id, state), count)
    yield pss
    yield children
    iso = getattr(d, "isolation", None)
    if iso is not None:
        memory = GaugeMetricFamily(
            "acp_serve_agent_memory_bytes",
            "Memory of each agent child's process tree under its limit (its cgroup's "
            "current usage, or the watchdog's last measured RSS)",
            labels=("child", "pid"),
        )
        peak = GaugeMetricFamily(
            "acp_serve_agent_memory_peak_bytes",
            "Peak memory of each agent child's process tree (cgroup v1/v2 or the watchdog)",
            labels=("child", "pid"),
        )
        for usage in iso.children_usage():
            key = (usage["name"], str(usage["pid"]))
            if usage.get("memoryCurrentBytes") is not None:
                memory.add_metric(key, usage["memoryCurrentBytes"])
            if usage.get("memoryPeakBytes") is not None:
                peak.add_metric(key, usage["memoryPeakBytes"])
        yield memory
        yield peak
        yield counter(
            "acp_serve_agent_oom",
            "Agent children killed for memory (agent_oom), since the daemon started",
            iso.oom_total,
        )
    if d.journal is not None:
        js = d.journal.statistics()
        yield counter(
            "acp_serve_journal_bytes", "Bytes written to the event journal", js["bytesWritten"]
        )
        yield counter(
            "acp_serve_journal_dropped_events", "Events the journal shed", js["droppedEvents"]
        )
    if d.webhooks is not None:
        yield from _webhook_metrics(d.webhooks.statistics())
    if d.audit is not None:
        refused = CounterMetricFamily(
            "acp_serve_auth_refused",
            "Requests refused 401 with multi-user auth (the audit log samples them)",
            labels=("reason",),
        )
        for reason, count in sorted(d.audit.refused_total.items()):
            refused.add_metric((reason,), count)
        yield refused
    limiter = d.front.rate_limiter
    if limiter is not None:
        hits = CounterMetricFamily(
            "acp_serve_rate_limit_hits",
            "Requests refused by the rate limiter",
            labels=("tier",),
        )
        for tier, count in sorted(limiter.hits().items()):
            hits.add_metric((str(tier),), count)
        yield hits


def _webhook_metrics(ws: dict[str, Any]) -> Iterator[Metric]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    yield GaugeMetricFamily(
        "acp_serve_webhook_subscriptions", "Webhook subscriptions", value=ws["subscriptions"]
    )
    yield GaugeMetricFamily(
        "acp_serve_webhook_outbox_entries",
        "Webhook messages owed (in the outbox)",
        value=ws["outbox"]["entries"],
    )
    yield GaugeMetricFamily(
        "acp_serve_webhook_outbox_bytes",
        "Bytes of the webhook messages owed",
        value=ws["outbox"]["bytes"],
    )
    yield CounterMetricFamily(
        "acp_serve_webhook_delivered", "Webhook messages delivered (2xx)", value=ws["delivered"]
    )
    yield CounterMetricFamily(
        "acp_serve_webhook_retried", "Webhook delivery attempts retried", value=ws["retried"]
    )
    dropped = CounterMetricFamily(
        "acp_serve_webhook_dropped", "Webhook messages dropped", labels=("reason",)
    )
    for reason, count in sorted(ws["dropped"].items()):
        dropped.add_metric((reason,), count)
    yield dropped


blueprint = Blueprint("metrics", __name__)


METRICS_KEY = "acp_serve.metrics"


@blueprint.get("/metrics")
async def metrics() -> Response:
    instruments: DaemonMetrics = current_app.extensions[METRICS_KEY]
    return Response(instruments.exposition(), content_type=CONTENT_TYPE)


def install_metrics(app: QuartTrio, host: Host) -> DaemonMetrics:
    """Create the app's metrics and the per-request hooks; returns the instruments."""
    instruments = DaemonMetrics(host)
    app.extensions[METRICS_KEY] = instruments

    access_log = host.settings.access_log

    @app.before_request
    async def _start_timer() -> None:
        g.acp_started = time.perf_counter()

    @app.after_request
    async def _observe(response: Response) -> Response:
        rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
        status = response.status_code
        instruments.requests.labels(request.method, rule, str(status)).inc()
        started = getattr(g, "acp_started", None)
        elapsed = time.perf_counter() - started if started is not None else 0.0
        if started is not None:
            instruments.latency.observe(rule, elapsed)
        request_id = request.headers.get("X-Request-Id") or ""
        if not _REQUEST_ID.fullmatch(request_id):
            # Only a plain token is echoed (it goes back out as a header and into logs).
            request_id = uuid.uuid4().hex[:16]
        response.headers["X-Request-Id"] = request_id
        if access_log:
            args = request.view_args or {}
            _access.info(
                "%s %s %d %.1fms",
                request.method,
                rule,
                status,
                elapsed * 1000,
                extra={
                    "request_id": request_id,
                    "session_id": args.get("session_id"),
                    "client_id": request.headers.get("X-Qwen-Client-Id"),
                },
            )
        return response

    app.register_blueprint(blueprint)
    return instruments
